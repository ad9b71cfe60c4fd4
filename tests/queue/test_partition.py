"""A network partition, not a stopped process: Redis and two workers each in a network
namespace of their own, joined by veth pairs to a bridge that this test makes; then
one worker's link is taken down for 60 s (its packets go nowhere: no refusal, no
reset) and brought back. The cut-off worker must not hang on a socket, its requests
must be taken over within the lease, nothing it does after healing may be accepted
for requests it lost, and the batch completes exactly.

Needs root and iproute2 (`ip netns`); skipped with the reason where namespaces cannot
be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import redis
from queue_helpers import specq, wait_until, write_prompts

from specq.queue.connection import server_binary
from specq.queue.store import BatchStore

LEASE_S = 3.0
CUT_S = 60.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _can_make_namespaces() -> str | None:
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"specq-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed: {exc.stderr.decode().strip()}"
    return None


def _remove_leftovers() -> None:
    """A run killed mid-test leaves its bridge holding 10.213.0.1/24 (and its route),
    so the next run's hosts could not be reached: its links and namespaces go first."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(": ")[1].split("@")[0]
        if name.startswith("sqbr") or (name.startswith("sq") and name.endswith("o")):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in spaces.splitlines():
        if line.startswith("sq"):
            subprocess.run(["ip", "netns", "del", line.split()[0]], capture_output=True)


class Network:
    """A bridge in this namespace and one namespace per host, each on its own veth pair."""

    def __init__(self) -> None:
        _remove_leftovers()
        tag = uuid.uuid4().hex[:4]
        self.bridge = f"sqbr{tag}"
        self.tag = tag
        self.hosts: dict[str, tuple[str, str]] = {}  # name -> (namespace, address)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", "10.213.0.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str, n: int) -> str:
        ns, outer, inner = f"sq{self.tag}{name}", f"sq{self.tag}{name}o", f"sq{self.tag}{name}i"
        address = f"10.213.0.{10 + n}"
        _ip("netns", "add", ns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = (ns, address)
        return ns

    def cut(self, name: str) -> None:
        """The host's cable pulled: its packets are dropped, nobody answers or refuses."""
        _ip("link", "set", f"sq{self.tag}{name}o", "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", f"sq{self.tag}{name}o", "up")

    def close(self) -> None:
        for name, (ns, _) in self.hosts.items():
            # The pair's outer end outlives a namespace that a stopping process still holds.
            subprocess.run(["ip", "link", "del", f"sq{self.tag}{name}o"], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture
def network():
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(reason)
    net = Network()
    yield net
    net.close()


@pytest.mark.slow
def test_a_worker_cut_off_from_redis_for_a_minute(network, queue_env, tmp_path, slow_model_path):
    redis_ns = network.add_host("redis", 0)
    ns_a, ns_b = network.add_host("wa", 1), network.add_host("wb", 2)
    address = network.hosts["redis"][1]
    data = tmp_path / "redis"
    data.mkdir()
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            redis_ns,
            server_binary(),
            "--port",
            "6391",
            "--bind",
            address,
            "--protected-mode",
            "no",
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--daemonize",
            "yes",
            "--pidfile",
            str(data / "pid"),
            "--logfile",
            str(data / "log"),
        ],
        check=True,
    )
    url = f"redis://{address}:6391/0"
    env = {**queue_env, "SPECQ_REDIS_URL": url, "SPECQ_LEASE_TTL_MS": str(int(LEASE_S * 1000))}
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        wait_until(lambda: _answers(client), 20, "redis in its namespace")
        n = 4
        path = write_prompts(tmp_path / "p.jsonl", n)
        common = ["--model", slow_model_path, "--max-tokens", "700", "--temperature", "0.8", "--seed", "9"]
        local = specq(["generate", "--input", str(path), "--json", *common], env)
        expected = {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in local.stdout.splitlines()}
        specq(
            [
                "submit",
                str(path),
                "--batch-id",
                "part",
                *common,
                "--batch-size",
                "2",
                "--checkpoint-tokens",
                "6",
                "--checkpoint-seconds",
                "0.5",
            ],
            env,
        )
        store = BatchStore(client, "part")
        worker_a = _start_in(ns_a, env, tmp_path / "a.log")
        wait_until(lambda: store.counts()["running"] >= 1, 120, "worker a to claim", interval=0.02)
        worker_b = _start_in(ns_b, env, tmp_path / "b.log")
        a_held = {rid: client.get(store.keys.lease(rid)) for rid in store.running()}
        a_held = {rid: v for rid, v in a_held.items() if v and _owner_pid(v) != worker_b.pid}
        assert a_held, "worker a must hold requests when it is cut off"
        network.cut("wa")
        cut_at = time.monotonic()
        # Taken over within the lease (plus a heartbeat): back in the pending list, or
        # decoded under another lease, or done.
        wait_until(
            lambda: all(_moved_on(store, rid, value) for rid, value in a_held.items()),
            LEASE_S + 10,
            "worker a's requests taken over",
        )
        takeover_s = time.monotonic() - cut_at
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
        assert worker_a.poll() is None, "the cut-off worker must still be running"
        network.heal("wa")
        # It comes back: a fresh heartbeat from it within a minute of healing (it did
        # not hang forever on a socket that the partition cut).
        worker_a_id = _worker_id(client, worker_a.pid)
        healed = time.time()
        wait_until(
            lambda: float(client.zscore("specq:workers", worker_a_id) or 0) > healed,
            70,
            "worker a's heartbeat after healing",
        )
        wait_until(lambda: store.counts()["completed"] == n, 300, "the batch to finish")
        # Read before the finally stops Redis (reading after it raced the shutdown).
        ids = store.request_ids()
        got = {r: json.loads(raw)["token_ids"] for r, raw in zip(ids, store.results(ids))}
        tokens = store.stats()["tokens"]
    finally:
        for proc in (locals().get("worker_a"), locals().get("worker_b")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        subprocess.run(["kill", (data / "pid").read_text().strip()], capture_output=True)
    assert got == expected
    # A late write accepted from the cut-off worker would count its tokens twice.
    assert tokens == sum(len(v) for v in expected.values())
    print(f"taken over in {takeover_s:.1f}s")


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def _owner_pid(lease_value: bytes) -> int:
    owner = lease_value.decode().rsplit("#", 1)[0]
    return int(owner.split(".")[-2])


def _moved_on(store: BatchStore, rid: str, value: bytes) -> bool:
    state = store.state(rid)
    return state in ("queued", "completed") or (
        state == "running" and store.client.get(store.keys.lease(rid)) not in (None, value)
    )


def _worker_id(client: redis.Redis, pid: int) -> str:
    for raw in client.zrange("specq:workers", 0, -1):
        if raw.decode().split(".")[-2] == str(pid):
            return raw.decode()
    raise AssertionError(f"no worker with pid {pid} in specq:workers")


def _start_in(namespace: str, env: dict[str, str], log_path) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "specq", "worker"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

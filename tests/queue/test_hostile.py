"""The queue tried as an attacker would (issue 13): a worker that dies between taking
a job and claiming a request, Redis killed past the lease while a worker decodes, a
burst worker that must not leave re-queued work behind, a forged RQ job, a refused
password. Real Redis servers, real worker processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from queue_helpers import specq, start_worker, stop_process, wait_until, write_prompts
from rq.job import Job

from specq.queue import keys, liveness
from specq.queue.connection import EmbeddedRedis
from specq.queue.control import ensure_job
from specq.queue.liveness import is_stalled
from specq.queue.rq_glue import make_queue
from specq.queue.store import BatchStore
from specq.worker.context import WorkerContext
from specq.worker.process import SpecqWorker

CHUNK = ["--checkpoint-tokens", "6", "--checkpoint-seconds", "0.5", "--batch-size", "8"]
# Two requests at a time, long ones, on the slow toy model: seconds of decoding.
SLOW_CHUNK = ["--checkpoint-tokens", "6", "--checkpoint-seconds", "0.5", "--batch-size", "2"]


def submit_with_expected(env, tmp_path, model, n, batch_id, max_tokens=60, chunk=CHUNK):
    path = write_prompts(tmp_path / "p.jsonl", n)
    common = ["--model", model, "--max-tokens", str(max_tokens), "--temperature", "0.8", "--seed", "5"]
    local = specq(["generate", "--input", str(path), "--json", *common], env)
    expected = {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in local.stdout.splitlines()}
    specq(["submit", str(path), "--batch-id", batch_id, *common, *chunk], env)
    return expected


def wait_for_progress(store: BatchStore) -> None:
    wait_until(lambda: store.client.hlen(store.keys.ckpt) >= 1, 120, "checkpoints", interval=0.02)


def outputs(store: BatchStore) -> dict[str, list[int]]:
    ids = store.request_ids()
    return {r: json.loads(raw)["token_ids"] for r, raw in zip(ids, store.results(ids)) if raw}


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def dequeue_only(client: redis.Redis, queue: str, name: str) -> tuple[SpecqWorker, Job]:
    """RQ's own dequeue by a worker named `name`, stopped before it marks the job
    started: the moment a reaper pass can catch any worker in."""
    worker = SpecqWorker(
        [make_queue(client, queue)],
        connection=client,
        name=name,
        runtime=WorkerContext(),
        serializer=make_queue(client, queue).serializer,
    )
    worker.register_birth()
    job, _ = worker.dequeue_job_and_maintain_ttl(timeout=1)
    assert job.get_status(refresh=True) == "queued" and make_queue(client, queue).count == 0
    return worker, job


def take_job_and_die(client: redis.Redis, queue: str) -> Job:
    """What a worker killed between RQ's dequeue and its first claim leaves behind,
    made by RQ's own code: the job out of the queue, marked started, under the name
    of a process of this machine that no longer exists."""
    import socket

    worker, job = dequeue_only(client, queue, f"{socket.gethostname()}.{dead_pid()}.abcdef.0")
    worker.prepare_execution(job)
    worker.prepare_job_execution(job)
    assert job.get_status(refresh=True) == "started" and make_queue(client, queue).count == 0
    return job


@pytest.mark.slow
def test_a_worker_dead_between_dequeue_and_claim_does_not_stall_the_batch(client, queue_env, tmp_path, long_model_path):
    # 7 requests with a batch size of 8: one RQ job, which the dead worker holds.
    expected = submit_with_expected(queue_env, tmp_path, long_model_path, 7, "st", max_tokens=30)
    take_job_and_die(client, "specq")
    store = BatchStore(client, "st")
    assert store.counts()["queued"] == 7
    assert is_stalled(client, "st"), "the alert condition: claimable requests and no live job"
    status = json.loads(specq(["status", "st", "--json"], queue_env).stdout)
    assert status["stalled"] is True
    # A burst worker alone must find the batch, restore a job and finish it: before
    # the reaper looked for live jobs, it found the queue empty and quit.
    burst = start_worker(queue_env, "--burst")
    assert burst.wait(180) == 0, burst.stdout.read()
    assert outputs(store) == expected
    assert store.stats()["jobs_restored"] >= 1
    assert not is_stalled(client, "st")


@pytest.mark.slow
def test_a_worker_killed_while_loading_the_model_does_not_stall_the_batch(client, queue_env, tmp_path, real_model_path):
    """The same stall with a real kill: the default model takes a second or more to
    load, between taking the job and claiming; SIGKILL lands there."""
    path = write_prompts(tmp_path / "p.jsonl", 3)
    specq(["submit", str(path), "--batch-id", "ld", "--max-tokens", "4", "--proposer", "none", *CHUNK], queue_env)
    store = BatchStore(client, "ld")
    job_id = client.lrange("rq:queue:specq", 0, -1)[0].decode()
    first = start_worker(queue_env)
    try:
        wait_until(
            lambda: Job.fetch(job_id, connection=client).get_status(refresh=True) == "started",
            60,
            "the job taken",
            interval=0.02,
        )
        assert store.counts()["running"] == 0, "the kill must land before the first claim"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    second = start_worker(queue_env)
    try:
        wait_until(lambda: store.counts()["completed"] == 3, 180, "the batch to finish after the kill")
    finally:
        stop_process(second)


def kill_server(server: EmbeddedRedis) -> None:
    pid = int((server.directory / "redis.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not server.alive(), 10, "redis to die")


@pytest.mark.slow
def test_redis_killed_past_the_lease_mid_decode_leaves_no_request_held(own_redis, tmp_path, slow_model_path):
    server, env = own_redis
    n = 6
    expected = submit_with_expected(env, tmp_path, slow_model_path, n, "rk", max_tokens=400, chunk=SLOW_CHUNK)
    client = redis.Redis(unix_socket_path=str(server.socket))
    store = BatchStore(client, "rk")
    worker = start_worker(env)
    try:
        wait_for_progress(store)
        assert store.counts()["completed"] < n, "the outage must land mid-batch"
        kill_server(server)  # SIGKILL: no final write; the append-only file has what fsync kept
        time.sleep(2 * 3.0)  # twice the test lease: every lease has expired when it returns
        server.ensure_running()
        client = redis.Redis(unix_socket_path=str(server.socket))
        store = BatchStore(client, "rk")
        wait_until(lambda: store.counts()["completed"] == n, 240, "the batch to finish after the outage")
        # Idle, the worker holds nothing (it used to renew the leases of requests its
        # failed job had given up, forever).
        wait_until(
            lambda: all(
                client.hget(f"specq:worker:{w.decode()}", "held") == b"0" for w in client.zrange("specq:workers", 0, -1)
            ),
            10,
            "the worker to hold nothing",
        )
    finally:
        stop_process(worker)
    assert outputs(store) == expected
    assert store.counts()["completed"] == n


@pytest.mark.slow
def test_a_short_redis_outage_hands_the_work_back_with_its_progress(own_redis, tmp_path, slow_model_path):
    """Down for less than a lease: the worker waits, then hands every request back
    with the state it had decoded (nothing lost), and the batch completes exactly."""
    server, env = own_redis
    # Leases outlive the outage: a worker whose job gave up used to keep renewing
    # them, idle, so no one could ever take the requests over.
    env = {**env, "SPECQ_LEASE_TTL_MS": "20000"}
    n = 6
    expected = submit_with_expected(env, tmp_path, slow_model_path, n, "rs", max_tokens=400, chunk=SLOW_CHUNK)
    client = redis.Redis(unix_socket_path=str(server.socket))
    store = BatchStore(client, "rs")
    worker = start_worker(env)
    try:
        wait_for_progress(store)
        assert store.counts()["completed"] < n, "the outage must land mid-batch"
        kill_server(server)
        time.sleep(1.0)
        server.ensure_running()
        client = redis.Redis(unix_socket_path=str(server.socket))
        store = BatchStore(client, "rs")
        wait_until(lambda: store.counts()["completed"] == n, 90, "the batch to finish after the restart")
    finally:
        stop_process(worker)
    assert outputs(store) == expected
    assert store.stats().get("failed_abandoned", 0) == 0


@pytest.mark.slow
def test_a_burst_worker_finishes_work_reaped_from_a_killed_worker(client, queue_env, tmp_path, slow_model_path):
    # Two requests, one job: the killed worker held it, so the queue is empty when
    # the burst worker starts; the work is only in the killed worker's requests.
    path = write_prompts(tmp_path / "p.jsonl", 2)
    common = ["--model", slow_model_path, "--max-tokens", "600"]
    specq(["submit", str(path), "--batch-id", "bu", *common, *SLOW_CHUNK], queue_env)
    store = BatchStore(client, "bu")
    first = start_worker(queue_env)
    try:
        wait_for_progress(store)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert store.counts()["completed"] < 2
    # Before the reaper gave a dequeued job its grace (timing.DEQUEUE_GRACE_MS), the
    # killed worker's own first reaper pass restored a spare job one run in four: it
    # found the first job out of the queue's list and not yet started. This test is
    # about a queue with no job left, so any spare goes.
    queue = make_queue(client, "specq")
    queue.empty()
    assert queue.count == 0
    # Another process's reaper pass holds the lock as the burst worker starts: its
    # own first pass is skipped, and its RQ loop finds the queue empty.
    client.set("specq:reaper", "elsewhere", px=3000)
    burst = start_worker(queue_env, "--burst")
    assert burst.wait(180) == 0, burst.stdout.read()
    assert store.counts()["completed"] == 2


def restored(store: BatchStore) -> float:
    return store.stats().get("jobs_restored", 0.0)


def test_a_job_caught_mid_dequeue_gets_no_spare_job(client, queue_env, tmp_path, long_model_path):
    """A reaper pass between a live worker's dequeue and its marking the job started
    (a few milliseconds, but every worker's heartbeat runs a pass) enqueued a spare
    job and counted a restore that nothing needed. Now the reaper notes the job and
    waits out a grace (a heartbeat by default), within which the worker marks it
    started."""
    import socket

    path = write_prompts(tmp_path / "p.jsonl", 3)
    specq(["submit", str(path), "--batch-id", "dq", "--model", long_model_path, *CHUNK], queue_env)
    store = BatchStore(client, "dq")
    owner = f"{socket.gethostname()}.{os.getpid()}.live"  # this process: alive
    client.zadd(keys.WORKERS, {owner: time.time()})
    worker, job = dequeue_only(client, "specq", f"{owner}.0")
    assert ensure_job(store) is False
    assert client.exists(keys.dequeued(job.id)), "the first sighting is noted"
    assert ensure_job(store) is False, "a second pass within the grace"
    worker.prepare_execution(job)
    worker.prepare_job_execution(job)
    assert ensure_job(store) is False, "started by a live worker: live"
    assert restored(store) == 0 and make_queue(client, "specq").count == 0
    assert not client.exists(keys.dequeued(job.id)), "a started job's note is dropped"


def test_a_worker_dead_mid_dequeue_gets_its_job_restored_after_the_grace(
    client, queue_env, tmp_path, long_model_path, monkeypatch
):
    """The same moment with the worker dead there: nothing will mark the job started,
    so once the grace has passed since the first sighting, and not before, the reaper
    enqueues one in its place. Meanwhile `specq status` does not call the batch
    stalled (the reaper is waiting on purpose); before any reaper has seen the job,
    and after the grace, it does. A note written by hand (not a time, or one in the
    future) holds nothing back."""
    monkeypatch.setattr(liveness, "DEQUEUE_GRACE_MS", 400)
    path = write_prompts(tmp_path / "p.jsonl", 3)
    specq(["submit", str(path), "--batch-id", "dd", "--model", long_model_path, *CHUNK], queue_env)
    store = BatchStore(client, "dd")
    queue = make_queue(client, "specq")
    name = f"gone-host.{os.getpid()}.x"  # another machine's worker: never marks the job started
    _, job = dequeue_only(client, "specq", f"{name}.0")
    assert is_stalled(client, "dd"), "no reaper has seen the job: nothing is waiting on purpose"
    first_pass = time.monotonic()
    assert ensure_job(store) is False
    assert not is_stalled(client, "dd"), "within the grace"
    assert queue.count == 0 and restored(store) == 0
    wait_until(lambda: ensure_job(store), 5, "the job restored after the grace", interval=0.05)
    assert time.monotonic() - first_pass >= 0.35, "restored before the grace had passed"
    assert restored(store) == 1 and queue.count == 1
    assert ensure_job(store) is False, "the restored job waits in the queue: live"
    future = (client.time()[0] + 10**6) * 1000
    for attempt, hostile in enumerate((b"x", future), start=1):
        _, job = dequeue_only(client, "specq", f"{name}.{attempt}")  # the restored job, taken the same way
        client.set(keys.dequeued(job.id), hostile)
        assert is_stalled(client, "dd"), f"a hand-written note ({hostile!r}) hid a stall"
        assert ensure_job(store) is True, f"a hand-written note ({hostile!r}) held the batch back"
    assert restored(store) == 3


def forge_job(client: redis.Redis, job_id: str, data: str, queue: str = "specq") -> None:
    client.hset(
        f"rq:job:{job_id}",
        mapping={
            "status": "queued",
            "data": data,
            "origin": queue,
            "description": "hand-written",
            "created_at": "2026-12-01T00:00:00.000000Z",
            "enqueued_at": "2026-12-01T00:00:00.000000Z",
            "timeout": "60",
        },
    )
    client.rpush(f"rq:queue:{queue}", job_id)
    client.sadd("rq:queues", f"rq:queue:{queue}")


@pytest.mark.slow
def test_a_forged_job_is_refused_and_never_runs(client, queue_env, tmp_path):
    marker = tmp_path / "pwned.txt"
    forge_job(client, "evil1", json.dumps(["os.system", None, [f"touch {marker}"], {}]))
    # specq's own function with something other than one batch id: refused too.
    forge_job(client, "evil2", json.dumps(["specq.worker.job.work_on_batch", None, [["x"], 2], {"k": 1}]))
    forge_job(client, "evil3", json.dumps(["posix.system", "instance", [f"touch {marker}"], {}]))
    proc = start_worker(queue_env, "--burst")
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, log
    assert not marker.exists()
    for job_id in ("evil1", "evil2", "evil3"):
        assert client.hget(f"rq:job:{job_id}", "status") == b"failed", job_id
    assert "refusing job evil1" in log and "os.system" in log


@pytest.fixture
def password_redis(tmp_path):
    server = EmbeddedRedis(tmp_path / "pw")
    server.ensure_running()
    client = redis.Redis(unix_socket_path=str(server.socket))
    client.config_set("requirepass", "right")
    yield server
    redis.Redis(unix_socket_path=str(server.socket), password="right").shutdown(nosave=True)


@pytest.mark.slow
def test_a_worker_with_a_wrong_password_says_so_and_exits(password_redis, queue_env):
    env = {**queue_env, "SPECQ_REDIS_URL": f"unix://:Xq7-not-it@{password_redis.socket}"}
    proc = subprocess.run(
        [sys.executable, "-m", "specq", "worker"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "refused the password" in proc.stderr and "Xq7-not-it" not in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_hand_written_records_fail_their_request_or_batch_not_the_worker(client, queue_env, tmp_path, long_model_path):
    """Garbage where a request's record or a batch's configuration should be: that
    request fails (reason invalid_request), that batch is skipped, and the worker,
    its breaker closed, finishes the healthy work and exits its burst."""
    expected = submit_with_expected(queue_env, tmp_path, long_model_path, 4, "ok", max_tokens=20)
    write_prompts(tmp_path / "q.jsonl", 3)
    specq(["submit", str(tmp_path / "q.jsonl"), "--batch-id", "garbled", "--model", long_model_path], queue_env)
    specq(["submit", str(tmp_path / "q.jsonl"), "--batch-id", "noconfig", "--model", long_model_path], queue_env)
    client.hset("specq:batch:garbled:spec", "r000", "[1, 2")  # not JSON
    client.hset("specq:batch:garbled:spec", "r001", json.dumps({"custom_id": "r001", "request": {"max_tokens": 9}}))
    client.hset("specq:batch:noconfig", "config", json.dumps({"model_path": 5}))
    burst = start_worker(queue_env, "--burst")
    log = burst.communicate(timeout=180)[0]
    assert burst.returncode == 0, log
    assert outputs(BatchStore(client, "ok")) == expected
    garbled = BatchStore(client, "garbled")
    assert garbled.counts()["failed"] == 2 and garbled.counts()["completed"] == 1
    errors = {r: json.loads(e) for r, e in garbled.errors().items()}
    assert {e["reason"] for e in errors.values()} == {"invalid_request"}
    assert BatchStore(client, "noconfig").counts()["queued"] == 3  # untouched, for an operator to look at
    assert "unreadable configuration" in log
    status = json.loads(specq(["status", "--json"], queue_env).stdout)
    assert any(b.get("damaged") for b in status["batches"] if b["batch_id"] == "noconfig")


def test_the_heartbeat_outlives_a_reaper_that_raises(client, monkeypatch):
    """The heartbeat thread renews every lease the worker holds: a reaper pass that
    raises (a damaged record it did not expect) is logged, and the beats go on."""
    import specq.worker.process as worker_mod

    calls = []

    def broken_reaper(_client):
        calls.append(1)
        raise KeyError("defaults")

    monkeypatch.setattr(worker_mod, "reap_all", broken_reaper)
    monkeypatch.setattr(worker_mod, "HEARTBEAT_S", 0.05)
    heartbeat = worker_mod.Heartbeat(client, WorkerContext(), ["specq"])
    heartbeat.start()
    try:
        wait_until(lambda: len(calls) >= 3, 10, "three beats")
        assert heartbeat.is_alive()
    finally:
        heartbeat.leave()
        heartbeat.join(5)

"""A chaos run that does not choose its moments kindly: worker processes SIGKILLed at
times drawn uniformly from their start (so kills land in imports and model loading,
between RQ's dequeue and the first claim, in prefills, in checkpoint writes),
workers SIGSTOPped past their lease, and Redis SIGKILLed and restarted from its
append-only file, while batches of mixed greedy and seeded-sampling requests run.

At the end every request must be completed once, with the output of an uninterrupted
`specq generate`. Recovery is measured per fault: from the fault to each request the
faulted party held running again (under a new lease) or completed.

Used by tests/queue/test_chaos.py (short) and scripts/chaos.py (minutes, thousands
of requests; its results are in docs/operations.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from specq.queue.connection import EmbeddedRedis
from specq.queue.store import BatchStore
from specq.testing import toy_gguf


@dataclass
class ChaosConfig:
    requests: int = 200  # per batch; batches are submitted until both bounds below are reached
    min_requests: int = 200
    minutes: float = 1.0
    workers: int = 3
    seed: int = 1
    max_tokens: int = 48
    lease_ms: int = 3000
    heartbeat_s: float = 0.5
    worker_life_s: float = 12.0  # a worker dies at U(0, this) after its start (all but the first)
    stop_every_s: float = 20.0  # mean time between SIGSTOPs
    redis_kill_every_s: float = 45.0  # mean time between Redis kills
    deadline_minutes: float = 20.0


@dataclass
class Fault:
    kind: str
    at: float
    held: dict[tuple[str, str], str]  # (batch, request) -> lease value at the fault
    recovered: dict[tuple[str, str], float] = field(default_factory=dict)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Chaos:
    def __init__(self, workdir: Path, config: ChaosConfig, log=print) -> None:
        self.dir = Path(workdir)
        self.cfg = config
        self.log = log
        self.rng = random.Random(config.seed)
        self.server = EmbeddedRedis(self.dir / "redis")
        self.url = self.server.ensure_running()
        # Every acknowledged write survives a SIGKILL of Redis, so the token counters
        # can be checked exactly (with everysec, the last second of them can be lost).
        self._client().config_set("appendfsync", "always")
        self.env = {
            **os.environ,
            "SPECQ_REDIS_URL": self.url,
            "SPECQ_HOME": str(self.dir / "home"),
            "SPECQ_LOG_LEVEL": "ERROR",
            "SPECQ_LEASE_TTL_MS": str(config.lease_ms),
            "SPECQ_HEARTBEAT_S": str(config.heartbeat_s),
            "NUMBA_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        self.faults: list[Fault] = []
        self.workers: list[tuple[subprocess.Popen, float, float | None]] = []  # process, start, death time
        self.stopped: dict[int, float] = {}  # pid -> when to SIGCONT
        self.batches: list[str] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def _client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.server.socket), socket_timeout=5, retry=None)

    # --- the work -------------------------------------------------------------
    def prepare(self) -> None:
        self.model = toy_gguf.write_toy_model(self.dir / "toy.gguf", quiet_end=True)
        self.prompts = self.dir / "prompts.jsonl"
        with open(self.prompts, "w") as fh:
            for i in range(self.cfg.requests):
                line = {
                    "custom_id": f"c{i:05d}",
                    "prompt": f"chaos {i} " * (1 + i % 5),
                    "max_tokens": 8 + (i * 7919) % self.cfg.max_tokens,
                }
                if i % 2:
                    line.update(temperature=0.8, seed=i)
                fh.write(json.dumps(line) + "\n")
        out = self._specq(["generate", "--input", str(self.prompts), "--json", "--model", self.model])
        self.expected = {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in out.splitlines()}

    def _specq(self, args: list[str]) -> str:
        proc = subprocess.run([sys.executable, "-m", "specq", *args], env=self.env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"specq {' '.join(args)} failed:\n{proc.stderr}")
        return proc.stdout

    def _submit(self) -> None:
        batch_id = f"chaos-{len(self.batches) + 1}"
        self._specq(
            [
                "submit",
                str(self.prompts),
                "--batch-id",
                batch_id,
                "--model",
                self.model,
                "--checkpoint-tokens",
                "6",
                "--checkpoint-seconds",
                "0.5",
                "--batch-size",
                "4",
            ]
        )
        self.batches.append(batch_id)

    # --- faults ---------------------------------------------------------------
    def _spawn(self, spared: bool = False) -> tuple[subprocess.Popen, float, float | None]:
        """A worker with its time of death drawn uniformly from its start; a spared
        one is never killed (its memory is watched for leaks)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "specq", "worker"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        start = time.monotonic()
        return proc, start, None if spared else start + self.rng.uniform(0, self.cfg.worker_life_s)

    def _held_by(self, client: redis.Redis, pid: int | None) -> dict[tuple[str, str], str]:
        """Leases now held (by the process pid, or by anyone when pid is None)."""
        held = {}
        for batch_id in self.batches:
            store = BatchStore(client, batch_id)
            for rid in store.running():
                value = _text(client.get(store.keys.lease(rid)) or b"")
                owner_pid = value.rsplit("#", 1)[0].split(".")[-2] if value.count(".") >= 2 else ""
                if value and (pid is None or owner_pid == str(pid)):
                    held[(batch_id, rid)] = value
        return held

    def _record(self, kind: str, held: dict) -> None:
        with self._lock:
            self.faults.append(Fault(kind, time.monotonic(), held))

    def _kill_worker(self, i: int) -> None:
        proc = self.workers[i][0]
        try:
            held = self._held_by(self._client(), proc.pid)
        except redis.RedisError:
            held = {}
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.stopped.pop(proc.pid, None)
        self._record("sigkill", held)
        self.workers[i] = self._spawn()

    def _stop_worker(self) -> None:
        candidates = [p for p, _, _ in self.workers if p.pid not in self.stopped]
        if not candidates:
            return
        proc = self.rng.choice(candidates)
        try:
            held = self._held_by(self._client(), proc.pid)
        except redis.RedisError:
            held = {}
        proc.send_signal(signal.SIGSTOP)
        lease_s = self.cfg.lease_ms / 1000
        self.stopped[proc.pid] = time.monotonic() + self.rng.uniform(lease_s, 2.5 * lease_s)
        self._record("sigstop", held)

    def _kill_redis(self) -> None:
        try:
            held = self._held_by(self._client(), None)
        except redis.RedisError:
            held = {}
        pid = int((self.server.directory / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        self._record("redis_kill", held)
        while self.server.alive():
            time.sleep(0.01)
        time.sleep(self.rng.uniform(0.2, 2.0 * self.cfg.lease_ms / 1000))
        self.server.ensure_running()

    # --- recovery -------------------------------------------------------------
    def _watch(self) -> None:
        """Polls every open fault's requests: recovered once running under another
        lease, or completed."""
        while not self._done.is_set():
            try:
                client = self._client()
                with self._lock:
                    open_faults = [f for f in self.faults if len(f.recovered) < len(f.held)]
                for fault in open_faults:
                    for (batch_id, rid), value in fault.held.items():
                        if (batch_id, rid) in fault.recovered:
                            continue
                        store = BatchStore(client, batch_id)
                        state = store.state(rid)
                        lease = _text(client.get(store.keys.lease(rid)) or b"")
                        if state == "completed" or (state == "running" and lease and lease != value):
                            fault.recovered[(batch_id, rid)] = time.monotonic() - fault.at
            except (redis.RedisError, OSError):
                pass
            self._done.wait(0.05)

    # --- the run --------------------------------------------------------------
    def run(self) -> dict:
        self.prepare()
        self._submit()
        self.workers = [self._spawn(spared=i == 0) for i in range(self.cfg.workers)]
        watcher = threading.Thread(target=self._watch, daemon=True)
        watcher.start()
        started = time.monotonic()
        next_stop = started + self.rng.expovariate(1 / self.cfg.stop_every_s)
        next_redis = started + self.rng.expovariate(1 / self.cfg.redis_kill_every_s)
        deadline = started + self.cfg.deadline_minutes * 60
        next_rss = started + 10
        self.rss: list[tuple[float, float, float]] = []  # (minutes into the run, worker age in minutes, MB)
        try:
            while True:
                now = time.monotonic()
                if now >= next_rss:
                    self._sample_rss(now - started)
                    next_rss = now + 10
                if now > deadline:
                    raise AssertionError(f"not finished after {self.cfg.deadline_minutes} minutes: {self.progress()}")
                for pid, wake in list(self.stopped.items()):
                    if now >= wake:
                        os.kill(pid, signal.SIGCONT)
                        del self.stopped[pid]
                for i, (_, _, dies) in enumerate(self.workers):
                    if dies is not None and now >= dies:
                        self._kill_worker(i)
                if now >= next_stop:
                    self._stop_worker()
                    next_stop = now + self.rng.expovariate(1 / self.cfg.stop_every_s)
                if now >= next_redis:
                    self._kill_redis()
                    next_redis = time.monotonic() + self.rng.expovariate(1 / self.cfg.redis_kill_every_s)
                if self._all_finished():
                    done_requests = len(self.batches) * self.cfg.requests
                    if now - started >= self.cfg.minutes * 60 and done_requests >= self.cfg.min_requests:
                        break
                    self._submit()
                time.sleep(0.05)
        finally:
            for pid in list(self.stopped):
                os.kill(pid, signal.SIGCONT)
            for proc, _, _ in self.workers:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            self._done.set()
            watcher.join()
        report = self.check()
        report["minutes"] = round((time.monotonic() - started) / 60, 1)
        self.server.stop()
        return report

    def _sample_rss(self, elapsed: float) -> None:
        """The resident memory of the oldest worker that was never killed (it has
        seen SIGSTOPs and Redis kills): a leak would show as growth with its age."""
        spared = [(start, proc) for proc, start, dies in self.workers if dies is None]
        if not spared:
            return
        start, proc = min(spared, key=lambda x: x[0])
        try:
            with open(f"/proc/{proc.pid}/status") as fh:
                kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return
        self.rss.append((round(elapsed / 60, 1), round((time.monotonic() - start) / 60, 1), round(kb / 1024, 1)))

    def _all_finished(self) -> bool:
        try:
            counts = BatchStore(self._client(), self.batches[-1]).counts()
        except redis.RedisError:
            return False
        return counts["completed"] + counts["failed"] + counts["cancelled"] == self.cfg.requests

    def progress(self) -> dict:
        return {b: BatchStore(self._client(), b).counts() for b in self.batches}

    def check(self) -> dict:
        client = self._client()
        lost, mismatched, not_completed, token_diff = 0, 0, 0, 0
        for batch_id in self.batches:
            store = BatchStore(client, batch_id)
            ids = store.request_ids()
            states = store.states()
            not_completed += sum(states.get(r) != "completed" for r in ids)
            results = {r: json.loads(raw) for r, raw in zip(ids, store.results(ids)) if raw}
            lost += len(ids) - len(results)
            mismatched += sum(results[r]["token_ids"] != self.expected[r] for r in results)
            token_diff += int(store.stats().get("tokens", 0)) - sum(len(v["token_ids"]) for v in results.values())
        times = {
            kind: sorted(t for f in self.faults if f.kind == kind for t in f.recovered.values())
            for kind in ("sigkill", "sigstop", "redis_kill")
        }
        unrecovered = sum(len(f.held) - len(f.recovered) for f in self.faults)
        return {
            "requests": len(self.batches) * self.cfg.requests,
            "batches": len(self.batches),
            "workers": self.cfg.workers,
            "lease_s": self.cfg.lease_ms / 1000,
            "faults": {kind: sum(f.kind == kind for f in self.faults) for kind in times},
            "lost": lost,
            "not_completed": not_completed,
            "mismatched_outputs": mismatched,
            "tokens_counted_minus_results": token_diff,
            "held_never_recovered": unrecovered,
            "recovery_seconds": {kind: _summary(ts) for kind, ts in times.items()},
            "spared_worker_rss_mb": getattr(self, "rss", []),
        }


def _summary(times: list[float]) -> dict:
    if not times:
        return {"n": 0}
    return {
        "n": len(times),
        "median": round(statistics.median(times), 2),
        "p90": round(times[int(0.9 * (len(times) - 1))], 2),
        "worst": round(times[-1], 2),
    }

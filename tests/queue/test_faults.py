"""Faults at random moments: SIGKILLs of 2-3 worker processes, at least 20 times,
and a Redis restart mid-batch. Every request completes exactly once and every output
is byte-identical to an uninterrupted local decode."""

from __future__ import annotations

import json
import random
import signal
import time

import pytest
import redis
from queue_helpers import specq, start_worker, stop_process, wait_until, write_prompts

from specq.queue.store import BatchStore

CHUNK = ["--checkpoint-tokens", "5", "--checkpoint-seconds", "0.3", "--batch-size", "3"]


def expected_and_submit(env, tmp_path, model, n, max_tokens, batch_id):
    path = write_prompts(tmp_path / "p.jsonl", n)
    common = ["--model", model, "--max-tokens", str(max_tokens), "--temperature", "0.9", "--seed", "11"]
    local = specq(["generate", "--input", str(path), "--json", *common], env)
    expected = [json.loads(line) for line in local.stdout.splitlines()]
    specq(["submit", str(path), "--batch-id", batch_id, *common, *CHUNK], env)
    return path, expected


def check_results(env, tmp_path, batch_id, expected, store: BatchStore) -> None:
    out = tmp_path / "out.jsonl"
    specq(["results", batch_id, "-o", str(out)], env)
    got = out.read_text().splitlines()
    assert len(got) == len(expected), "one result record per request"
    assert [json.loads(g)["custom_id"] for g in got] == [e["custom_id"] for e in expected]
    for g, e in zip(got, expected):
        # The same record as the local decode's, but for where and how fast it ran.
        assert without_timings(json.loads(g)) == without_timings(e)
    assert store.stats()["tokens"] == sum(len(e["specq"]["token_ids"]) for e in expected)


def without_timings(line: dict) -> dict:
    return {**line, "specq": {k: v for k, v in line["specq"].items() if k not in ("metrics", "worker")}}


@pytest.mark.slow
def test_twenty_random_sigkills_lose_and_duplicate_nothing(client, queue_env, tmp_path, slow_model_path):
    # Twenty random kills can meet the same request four times before it checkpoints
    # (one handed back goes to the front of the list, to the next worker that claims):
    # the poison-request rule would then fail it, as designed (tests/worker covers
    # that rule). Here nothing may be lost, so the rule is out of the way.
    queue_env = {**queue_env, "SPECQ_MAX_ATTEMPTS": "1000"}
    n, kills_wanted = 24, 20
    _, expected = expected_and_submit(queue_env, tmp_path, slow_model_path, n, 90, "chaos")
    total = sum(len(e["specq"]["token_ids"]) for e in expected)
    store = BatchStore(client, "chaos")
    rng = random.Random(20261201)
    workers = [start_worker(queue_env) for _ in range(3)]
    kills = 0
    deadline = time.monotonic() + 600
    try:
        while store.counts()["completed"] < n:
            assert time.monotonic() < deadline, f"stuck at {store.counts()} after {kills} kills"
            assert store.counts()["failed"] == 0, f"a request failed: {store.errors()}"
            # Kills are paced by progress, not by the clock, so that a faster engine
            # still meets all of them mid-batch: kill i waits for (i-1)/20 of the
            # tokens to be done (work between kills), and never for more (none late).
            time.sleep(rng.uniform(0.05, 0.4))
            due = store.stats().get("tokens", 0) >= kills / kills_wanted * 0.8 * total
            if kills < kills_wanted and due and store.counts()["completed"] < n:
                victim = rng.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()
                kills += 1
                workers[victim] = start_worker(queue_env)
    finally:
        for w in workers:
            stop_process(w, signal.SIGKILL)
    assert kills >= kills_wanted, f"only {kills} kills before the batch finished; make it longer"
    assert store.counts() == {"queued": 0, "running": 0, "paused": 0, "completed": n, "failed": 0, "cancelled": 0}
    check_results(queue_env, tmp_path, "chaos", expected, store)


@pytest.mark.slow
def test_a_redis_restart_mid_batch_is_survived(own_redis, tmp_path, slow_model_path):
    server, env = own_redis
    n = 8
    _, expected = expected_and_submit(env, tmp_path, slow_model_path, n, 120, "rr")
    client = redis.Redis(unix_socket_path=str(server.socket))
    store = BatchStore(client, "rr")
    workers = [start_worker(env) for _ in range(2)]
    try:
        wait_until(lambda: client.hlen(store.keys.ckpt) >= 2, 120, "checkpoints", interval=0.02)
        assert store.counts()["completed"] < n, "the restart must land mid-batch"
        server.stop()  # SHUTDOWN writes the append-only file; the workers lose Redis
        assert not server.alive()
        time.sleep(2.0)
        server.ensure_running()
        client = redis.Redis(unix_socket_path=str(server.socket))
        store = BatchStore(client, "rr")
        wait_until(lambda: store.counts()["completed"] == n, 300, "the batch to finish after the restart")
    finally:
        for w in workers:
            stop_process(w)
    check_results(env, tmp_path, "rr", expected, store)

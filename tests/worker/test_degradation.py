"""Degradation: a worker whose model keeps failing opens its circuit breaker (its
health check fails), hands the work on, and recovers after a probe; a proposer that
cannot be loaded degrades to plain decoding, still exact."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from queue_helpers import specq, start_worker, stop_process, wait_until, write_prompts

from specq.queue.store import BatchStore
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.proposers import MedusaHeads
from specq.testing import toy_gguf
from specq.worker.breaker import FAILURES_TO_OPEN, FIRST_BACKOFF_S, Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_repeated_failures_and_backs_off_doubling():
    clock = Clock()
    b = Breaker(clock=clock)
    for _ in range(FAILURES_TO_OPEN - 1):
        b.record_failure("boom")
        assert b.state == "closed"
    b.record_failure("boom")
    assert b.state == "open" and b.last_error == "boom"
    clock.now += FIRST_BACKOFF_S
    assert b.state == "half-open"
    b.record_failure("again")  # the probe failed: open again, for twice as long
    assert b.state == "open"
    clock.now += FIRST_BACKOFF_S * 2 - 0.01
    assert b.state == "open"
    clock.now += 0.02
    assert b.state == "half-open"
    b.record_success()
    assert b.state == "closed" and b.consecutive_failures == 0


@pytest.mark.slow
def test_a_sick_worker_opens_its_breaker_fails_its_health_check_and_recovers(
    client, queue_env, tmp_path, toy_model_file
):
    model = tmp_path / "model.gguf"
    shutil.copy(toy_model_file(quiet_end=True), model)
    good = tmp_path / "good.gguf"
    shutil.copy(model, good)
    path = write_prompts(tmp_path / "p.jsonl", 3, max_tokens=6)
    specq(["submit", str(path), "--model", str(model), "--batch-id", "sick", "--batch-size", "1"], queue_env)
    assert specq(["worker", "--check"], queue_env, check=False).returncode == 1  # no worker yet
    # This machine's model file is not the one the batch was submitted with.
    toy_gguf.write_toy_model(model, seed=5, quiet_end=True)
    worker = start_worker(queue_env)
    try:

        def check():
            return specq(["worker", "--check"], queue_env, check=False)

        wait_until(lambda: "breaker open" in check().stderr, 60, "the breaker to open")
        assert check().returncode == 1
        store = BatchStore(client, "sick")
        assert store.counts()["failed"] == 0 and store.counts()["queued"] == 3  # nothing blamed on the requests
        shutil.copy(good, model)  # the machine is repaired
        wait_until(lambda: store.counts()["completed"] == 3, 120, "the probe to succeed and the batch to finish")
        wait_until(lambda: check().returncode == 0, 30, "the health check to pass")
    finally:
        stop_process(worker)


@pytest.mark.slow
def test_a_proposer_that_cannot_load_degrades_to_plain_decoding(client, queue_env, tmp_path, long_model_path):
    model, _ = load_model_and_tokenizer(long_model_path)
    heads_path = tmp_path / "heads.gguf"
    rng = np.random.default_rng(0)
    d = model.config.d_model
    MedusaHeads(
        weights=(rng.normal(size=(3, d, d)) * 0.05).astype(np.float32),
        biases=np.zeros((3, d), np.float32),
        target_fingerprint=model.fingerprint,
        metadata={"made_by": "test"},
    ).save(str(heads_path))
    path = write_prompts(tmp_path / "p.jsonl", 4, max_tokens=20)
    local = specq(
        ["generate", "--input", str(path), "--json", "--model", long_model_path, "--proposer", "none"], queue_env
    )
    expected = {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in local.stdout.splitlines()}
    specq(
        [
            "submit",
            str(path),
            "--model",
            long_model_path,
            "--proposer",
            "medusa",
            "--medusa-heads",
            str(heads_path),
            "--batch-id",
            "deg",
        ],
        queue_env,
    )
    heads_path.write_bytes(b"GGUF but truncated")  # corrupted on the worker's machine
    specq(["worker", "--burst"], queue_env)
    store = BatchStore(client, "deg")
    results = {r: json.loads(raw) for r, raw in zip(store.request_ids(), store.results(store.request_ids()))}
    assert {r: v["token_ids"] for r, v in results.items()} == expected
    assert all(v["metrics"]["drafted"] == 0 for v in results.values())
    status = json.loads(specq(["status", "deg", "--json"], queue_env).stdout)
    assert status["proposer_fallbacks"] == 4
    assert "went on without drafts" in specq(["status", "deg"], queue_env).stdout


class FailsAfter:
    """A proposer session that drafts (prompt lookup) a few times, then raises."""

    def __init__(self, inner, n_ok: int) -> None:
        self.inner, self.n_ok = inner, n_ok

    def propose(self, ctx, k):
        if self.n_ok == 0:
            raise RuntimeError("draft model crashed")
        self.n_ok -= 1
        return self.inner.propose(ctx, k)


def test_a_proposer_that_fails_while_drafting_leaves_the_output_exact(client, tmp_path, long_model_path):
    import time

    from queue_helpers import N_REQUESTS, outputs, setup_batch

    from specq.worker.batch_runner import BatchRunner
    from specq.worker.context import WorkerContext

    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    ngram = loaded.guard.inner
    sessions = iter(range(100))

    class Flaky:
        name, draft_cost = ngram.name, ngram.draft_cost

        def session(self):
            return FailsAfter(ngram.session(), n_ok=next(sessions) % 3)

    loaded.guard.inner = Flaky()
    # Every request drafts by the lone figures, so it asks its proposer often enough
    # to fail (by this machine's timings a greedy request in a batch may not draft).
    loaded.engine.costs = None
    BatchRunner(store, config, loaded, WorkerContext("w"), deadline=time.monotonic() + 600).run()
    assert outputs(store) == {r: list(s.output_ids) for r, s in alone.items()}
    assert store.stats()["proposer_errors"] == N_REQUESTS

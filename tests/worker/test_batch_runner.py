"""The job's decode loop on a real Redis, in process: results equal lone decodes; a
run interrupted at any round and resumed from its checkpoints (by another runner,
as another worker would) gives the same output, greedy and seeded sampling; a
runner whose leases were taken over writes nothing."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from queue_helpers import N_REQUESTS, outputs, setup_batch, stop_after_rounds

from specq.queue.histograms import field
from specq.requests import checkpoint
from specq.requests.config import BatchConfig
from specq.specdec import int8
from specq.specdec import model as model_module
from specq.specdec.gguf_file import GGUFFile
from specq.worker.batch_runner import BatchRunner
from specq.worker.context import WorkerContext, load_for_batch


def test_a_runner_completes_every_request_as_a_lone_decode_would(client, tmp_path, long_model_path):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    summary = BatchRunner(store, config, loaded, WorkerContext("w1"), deadline=time.monotonic() + 600).run()
    assert summary["completed"] == N_REQUESTS
    assert outputs(store) == {r: list(s.output_ids) for r, s in alone.items()}
    assert store.counts()["completed"] == N_REQUESTS
    stats = store.stats()
    assert stats["tokens"] == sum(len(s.output_ids) for s in alone.values())
    # Greedy requests draft by this machine's measured costs, so their draft counts are
    # the runner's own: the batch's totals are the sums of its results' metrics.
    metrics = [json.loads(raw)["metrics"] for raw in store.results(store.request_ids())]
    # (A batch that drafted nothing, as its timings may decide, has no such counts.)
    assert stats.get("drafted", 0) == sum(m["drafted"] for m in metrics)
    assert stats.get("accepted", 0) == sum(m["accepted"] for m in metrics)
    assert client.llen(store.keys.pending) == 0 and store.running() == []


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("stop_at", [1, 3, 9])
def test_interrupted_and_resumed_elsewhere_equals_uninterrupted(
    client, tmp_path, long_model_path, temperature, stop_at
):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path, temperature=temperature)
    first = BatchRunner(store, config, loaded, WorkerContext("w1"), deadline=time.monotonic() + 600)
    stop_after_rounds(first, stop_at)
    summary = first.run()
    assert summary["handed_back"] > 0, "the stop must have caught requests mid-decode"
    assert store.running() == [] and store.counts()["running"] == 0
    checkpointed = [r for r in store.request_ids() if store.checkpoint_of(r)]
    assert checkpointed, "handing back writes a checkpoint of the progress"
    second = BatchRunner(store, config, loaded, WorkerContext("w2"), deadline=time.monotonic() + 600)
    second.run()
    assert outputs(store) == {r: list(s.output_ids) for r, s in alone.items()}
    results = {r: json.loads(raw) for r, raw in zip(store.request_ids(), store.results(store.request_ids()))}
    assert any(results[r]["metrics"]["resume_prefills"] >= 1 for r in checkpointed)
    assert store.stats()["tokens"] == sum(len(s.output_ids) for s in alone.values())


@pytest.mark.skipif(not int8.AVAILABLE, reason="the integer precisions need AVX2")
@pytest.mark.parametrize("stop_at", [1, 2, 4])
def test_prompts_in_pieces_stopped_mid_prefill_resume_elsewhere_exactly(
    client, tmp_path, toy_model_file, monkeypatch, stop_at
):
    """At int16 a prompt goes in a piece a round, the round's prompts sharing the
    rows (made 8 here, so that the toy prompts take several rounds): a runner asked to
    stop after a few rounds hands requests back mid-prefill, with nothing committed,
    and another finishes them as lone decodes do. Each request's time to first token
    is observed once, when its prefill ends, not once a piece."""
    monkeypatch.setattr(model_module, "PREFILL_PIECE_ROWS", 8)
    path = toy_model_file(quiet_end=True, tensor_type="Q4_1", embedding_type="Q8_0")
    store, config, loaded, alone = setup_batch(client, tmp_path, path, precision="int16")
    assert loaded.engine.prefill_rows == 8
    assert all(len(store.spec(r)["request"]["prompt_ids"]) > 8 for r in store.request_ids())
    first = BatchRunner(store, config, loaded, WorkerContext("w1"), deadline=time.monotonic() + 600)
    stop_after_rounds(first, stop_at)
    summary = first.run()
    assert summary["handed_back"] == config.batch_size
    first_tokens = field("time_to_first_token_seconds", "count")
    assert store.stats().get(first_tokens, 0) < config.batch_size, "some request must be stopped mid-prefill"
    second = BatchRunner(store, config, loaded, WorkerContext("w2"), deadline=time.monotonic() + 600)
    second.run()
    assert outputs(store) == {r: list(s.output_ids) for r, s in alone.items()}
    # One first token a request, whichever runner gave it.
    assert store.stats()[first_tokens] == N_REQUESTS


def test_a_runner_that_lost_its_leases_writes_nothing(client, tmp_path, long_model_path):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    zombie_rt = WorkerContext("zombie")
    zombie = BatchRunner(store, config, loaded, zombie_rt, deadline=time.monotonic() + 600)
    # The zombie claims work and decodes two rounds, then "stalls": its leases vanish
    # and another runner takes its requests over and finishes the batch.
    zombie._fill()
    zombie._round()
    zombie._round()
    held = list(zombie.owned)
    assert held
    for rid in held:
        client.delete(store.keys.lease(rid))
        assert store.reap(rid, max_attempts=3) == 1
    BatchRunner(store, config, loaded, WorkerContext("healthy"), deadline=time.monotonic() + 600).run()
    expected = {r: list(s.output_ids) for r, s in alone.items()}
    assert outputs(store) == expected
    tokens_before = store.stats()["tokens"]
    # The zombie wakes up: its writes are refused, its requests forgotten.
    zombie.run()
    assert zombie.summary["completed"] == 0 and zombie.summary["lost"] == len(held)
    assert outputs(store) == expected
    assert store.stats()["tokens"] == tokens_before
    assert {json.loads(raw)["worker"] for raw in store.results(held)} == {"healthy"}


def test_a_corrupt_checkpoint_fails_only_its_request(client, tmp_path, long_model_path):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    client.hset(store.keys.ckpt, "r001", '{"state": {}, "fingerprint": "x", "checksum": "bad"}')
    BatchRunner(store, config, loaded, WorkerContext("w"), deadline=time.monotonic() + 600).run()
    assert store.state("r001") == "failed"
    error = json.loads(store.errors()["r001"])
    assert error["reason"] == "checkpoint" and "checksum" in error["message"]
    assert set(outputs(store)) == set(alone) - {"r001"}


def test_a_checkpoint_from_another_model_is_refused(client, tmp_path, long_model_path, toy_model_path):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    other = load_for_batch(BatchConfig(model_path=toy_model_path, model_sha256=GGUFFile(toy_model_path).sha256()))
    first = BatchRunner(store, config, loaded, WorkerContext("w1"), deadline=time.monotonic() + 600)
    stop_after_rounds(first, 2)
    first.run()
    # A worker with a different model: its fingerprint differs, so resuming is refused.
    BatchRunner(store, config, other, WorkerContext("w2"), deadline=time.monotonic() + 600).run()
    errors = {r: json.loads(e) for r, e in store.errors().items()}
    assert errors, "requests with checkpoints must be refused"
    assert all("another model" in e["message"] for e in errors.values())


def test_a_checkpoint_made_by_other_numerics_starts_its_request_again(client, tmp_path, long_model_path):
    """A worker of another version (other arithmetic at the batch's precision) made the
    checkpoints: continuing them would give outputs no uninterrupted decode gives, so
    their requests start again from their prompts. Their tokens here are replaced by
    ones no decode gives, which a resume would keep."""
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    first = BatchRunner(store, config, loaded, WorkerContext("w1"), deadline=time.monotonic() + 600)
    stop_after_rounds(first, 3)
    first.run()
    checkpointed = [r for r in store.request_ids() if store.checkpoint_of(r)]
    assert checkpointed, "the stop must leave checkpoints"
    for rid in checkpointed:
        state = checkpoint.decode(store.checkpoint_of(rid), None)
        bogus = replace(state, output_ids=(state.request.prompt_ids[0],) * len(state.output_ids))
        assert bogus.output_ids != alone[rid].output_ids[: len(state.output_ids)]
        client.hset(store.keys.ckpt, rid, checkpoint.encode(bogus, loaded.fingerprint, "f32.0"))
    BatchRunner(store, config, loaded, WorkerContext("w2"), deadline=time.monotonic() + 600).run()
    assert outputs(store) == {r: list(s.output_ids) for r, s in alone.items()}
    results = {r: json.loads(raw) for r, raw in zip(store.request_ids(), store.results(store.request_ids()))}
    assert all(results[r]["metrics"]["resume_prefills"] == 0 for r in checkpointed)  # started again, not resumed
    assert store.errors() == {}


def poison_forward(model, bad_token: int):
    """The model raises on any forward whose rows include `bad_token` (a prompt that
    crashes the model every time): rounds and resume prefills alike go through
    `_forward`, so the fault is planted there."""
    inner = model._forward

    def forward(segments):
        if any(bad_token in seg.token_ids for seg in segments):
            raise FloatingPointError("injected fault")
        return inner(segments)

    model._forward = forward


@pytest.mark.parametrize("when", ["first prefill", "resume prefill"])
def test_a_request_that_crashes_the_model_fails_alone(client, tmp_path, long_model_path, when):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    if when == "resume prefill":
        # Every request has a checkpoint before the fault appears: resuming re-runs a
        # prefill when the request joins the batch, and that is where it fails.
        first = BatchRunner(store, config, loaded, WorkerContext("w0"), deadline=time.monotonic() + 600)
        stop_after_rounds(first, 12)
        first.run()
        assert store.checkpoint_of("r002") is not None
    spec = store.spec("r002")
    unique = set(spec["request"]["prompt_ids"]) - {
        t for r in store.request_ids() if r != "r002" for t in store.spec(r)["request"]["prompt_ids"]
    }
    assert unique, "the poison prompt needs a token no other prompt has"
    poison_forward(loaded.engine.model, min(unique))
    summary = BatchRunner(store, config, loaded, WorkerContext("w"), deadline=time.monotonic() + 600).run()
    assert store.state("r002") == "failed"
    error = json.loads(store.errors()["r002"])
    assert error["reason"] == "engine_error" and "injected fault" in error["message"]
    assert int(client.hget(store.keys.attempts, "r002")) == 3 and summary["retried"] == 2
    expected = {r: list(s.output_ids) for r, s in alone.items() if r != "r002"}
    assert outputs(store) == expected


def test_a_worker_wide_failure_hands_every_request_back(client, tmp_path, long_model_path):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path)
    runner = BatchRunner(store, config, loaded, WorkerContext("w"), deadline=time.monotonic() + 600)
    runner._fill()
    runner._round()
    inner = loaded.engine.model.forward
    calls = {"n": 0}

    def flaky(segments):
        calls["n"] += 1
        if len(segments) > 1:  # fails batched, works alone: the worker's fault, not a request's
            raise MemoryError("injected")
        return inner(segments)

    loaded.engine.model.forward = flaky
    with pytest.raises(MemoryError):
        runner.run()
    assert store.counts()["queued"] == N_REQUESTS and store.running() == []
    assert not client.hgetall(store.keys.attempts)
    loaded.engine.model.forward = inner
    BatchRunner(store, config, loaded, WorkerContext("w2"), deadline=time.monotonic() + 600).run()
    assert outputs(store) == {r: list(s.output_ids) for r, s in alone.items()}

"""Real worker processes against a real Redis, killed with real signals: whatever
happens to a worker (SIGKILL, SIGTERM, SIGSTOP then SIGCONT) or to `specq run`
(Ctrl-C), every request completes once, and its output is identical to an
uninterrupted local decode."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from queue_helpers import specq, start_worker, stop_process, wait_until, write_prompts

from specq.queue.status import batch_status
from specq.queue.store import BatchStore
from specq.specdec import int8
from specq.specdec.kernel_cache import cache_folders

N = 6
MAX_TOKENS = 120
# Small chunks, so a kill always finds checkpoints behind the decode.
CHUNK = ["--checkpoint-tokens", "6", "--checkpoint-seconds", "0.5", "--batch-size", "3"]


@pytest.fixture
def batch(client, queue_env, tmp_path, slow_model_path):
    """A submitted batch and the outputs an uninterrupted `specq generate` gives (on
    the slow toy model: the small one finishes a batch between two polls)."""
    return submitted(client, queue_env, tmp_path, slow_model_path, MAX_TOKENS)


def submitted(client, queue_env, tmp_path, model_path, max_tokens):
    path = write_prompts(tmp_path / "p.jsonl", N)
    common = ["--model", model_path, "--max-tokens", str(max_tokens), "--temperature", "0.7", "--seed", "3"]
    local = specq(["generate", "--input", str(path), "--json", *common], queue_env)
    expected = {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in local.stdout.splitlines()}
    specq(["submit", str(path), "--batch-id", "kb", *common, *CHUNK], queue_env)
    return BatchStore(client, "kb"), expected, path, common


def final_outputs(store: BatchStore) -> dict[str, list[int]]:
    ids = store.request_ids()
    return {r: json.loads(raw)["token_ids"] for r, raw in zip(ids, store.results(ids)) if raw}


def assert_exactly_once(store: BatchStore, expected: dict[str, list[int]]) -> None:
    assert final_outputs(store) == expected
    assert store.counts()["completed"] == N
    # Token counters only grow through fenced writes: a request finished twice, or a
    # zombie's write accepted, would count its tokens twice.
    assert store.stats()["tokens"] == sum(len(v) for v in expected.values())


def wait_for_checkpoints(store: BatchStore, timeout: float = 120) -> None:
    wait_until(lambda: store.client.hlen(store.keys.ckpt) >= 2, timeout, "checkpoints", interval=0.02)


@pytest.mark.slow
def test_sigkill_mid_batch_loses_nothing(batch, queue_env):
    store, expected, _, _ = batch
    first = start_worker(queue_env)
    wait_for_checkpoints(store)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert store.counts()["completed"] < N, "the kill must land mid-batch"
    second = start_worker(queue_env, "--burst")
    # The second worker's reaper sees the dead owner (same host) and takes over.
    assert second.wait(240) == 0, second.stdout.read()
    assert_exactly_once(store, expected)
    assert batch_status(store.client, "kb")["resumes"]["crash"] >= 1
    resumed = [json.loads(r)["metrics"]["resume_prefills"] for r in store.results(store.request_ids())]
    assert sum(resumed) >= 1


@pytest.mark.slow
def test_sigterm_hands_work_back_at_the_next_round(batch, queue_env):
    store, expected, _, _ = batch
    worker = start_worker(queue_env)
    wait_for_checkpoints(store)
    assert stop_process(worker, signal.SIGTERM, timeout=10) == 0
    counts = store.counts()
    assert counts["running"] == 0 and counts["queued"] > 0
    assert not store.client.keys("specq:batch:kb:lease:*")
    assert store.client.llen(store.keys.pending) == counts["queued"]
    specq(["worker", "--burst"], queue_env)
    assert_exactly_once(store, expected)


@pytest.mark.slow
def test_a_stopped_worker_is_taken_over_and_its_late_writes_refused(batch, queue_env):
    store, expected, _, _ = batch
    zombie = start_worker(queue_env)
    wait_for_checkpoints(store)
    zombie.send_signal(signal.SIGSTOP)
    try:
        healthy = start_worker(queue_env)
        wait_until(lambda: store.counts()["completed"] == N, 240, "the healthy worker to finish")
    finally:
        zombie.send_signal(signal.SIGCONT)
    # The zombie wakes up with requests it believes it owns: give it time to try to
    # write (its heartbeat runs every 0.5 s here, its rounds every few ms).
    time.sleep(2.0)
    stop_process(zombie, signal.SIGTERM)
    stop_process(healthy, signal.SIGTERM)
    assert_exactly_once(store, expected)


@pytest.mark.slow
def test_pause_and_resume_while_a_worker_runs(batch, queue_env):
    store, expected, _, _ = batch
    worker = start_worker(queue_env)
    try:
        wait_for_checkpoints(store)
        # Held still while the pause command starts (a second or so of Python start-up,
        # in which a fast engine could finish the whole batch); the flag is then read
        # within a quarter of a second of waking, with most of the batch still to do.
        worker.send_signal(signal.SIGSTOP)
        try:
            specq(["pause", "kb"], queue_env)
        finally:
            worker.send_signal(signal.SIGCONT)
        wait_until(lambda: store.counts()["running"] == 0, 30, "running requests to pause")
        paused = store.counts()
        assert paused["paused"] + paused["completed"] == N and paused["paused"] > 0
        status = json.loads(specq(["status", "kb", "--json"], queue_env).stdout)
        assert status["flags"] == ["paused"] and status["eta_seconds"] is None
        specq(["resume", "kb"], queue_env)
        wait_until(lambda: store.counts()["completed"] == N, 240, "the batch to finish")
    finally:
        stop_process(worker)
    assert_exactly_once(store, expected)


@pytest.mark.slow
def test_run_continues_after_ctrl_c(client, queue_env, tmp_path, slow_model_path):
    path = write_prompts(tmp_path / "p.jsonl", N)
    common = ["--model", slow_model_path, "--max-tokens", str(MAX_TOKENS)]
    local = specq(["generate", "--input", str(path), "--json", *common], queue_env)
    expected = [json.loads(line) for line in local.stdout.splitlines()]
    out = tmp_path / "out.jsonl"
    # A shell runs background jobs with SIGINT ignored, and Python keeps an inherited
    # SIG_IGN: without this, a suite started with `&` sends its Ctrl-C into the void
    # and the run finishes the batch.
    run = subprocess.Popen(
        [sys.executable, "-m", "specq", "run", str(path), "-o", str(out), *common, *CHUNK],
        env=queue_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def batch_id():
        ids = [k.decode() for k in client.zrange("specq:batches", 0, -1)]
        return ids[0] if ids else None

    wait_until(lambda: batch_id() is not None, 60, "the batch")
    store = BatchStore(client, batch_id())
    wait_until(lambda: store.counts()["completed"] >= 1 or client.hlen(store.keys.ckpt) >= 2, 120, "progress")
    run.send_signal(signal.SIGINT)
    assert run.wait(30) == 130, run.stderr.read()
    assert not out.exists()
    done_before = {
        r: json.loads(raw)["completed_at"]
        for r, raw in zip(store.request_ids(), store.results(store.request_ids()))
        if raw
    }
    from specq.queue.control import checkpointed_unfinished

    with_checkpoints = checkpointed_unfinished(store)
    assert with_checkpoints >= 1, "the Ctrl-C must leave requests handed back with their checkpoints"
    again = specq(["run", str(path), "-o", str(out), *common, *CHUNK], queue_env)
    assert "continuing batch" in again.stderr
    # It used to say "0 requests resumed from checkpoints" here.
    assert f"{with_checkpoints} resume from checkpoints" in again.stderr, again.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == [e["custom_id"] for e in expected]
    assert [g["specq"]["token_ids"] for g in got] == [e["specq"]["token_ids"] for e in expected]
    assert [g["text"] for g in got] == [e["text"] for e in expected]
    # Requests finished before the interrupt were not decoded again.
    after = {
        r: json.loads(raw)["completed_at"] for r, raw in zip(store.request_ids(), store.results(store.request_ids()))
    }
    assert all(after[r] == t for r, t in done_before.items())
    assert store.stats()["tokens"] == sum(len(e["specq"]["token_ids"]) for e in expected)


@pytest.mark.slow
@pytest.mark.skipif(not int8.AVAILABLE, reason="without AVX2 the default precision is f32 anyway")
def test_run_again_continues_a_batch_started_at_f32(client, queue_env, tmp_path, toy_model_path):
    """Every run before int16 became the default decoded at f32: the same command
    again (no --precision) continues that batch at f32 instead of starting over."""
    path = write_prompts(tmp_path / "p.jsonl", 3)
    common = ["--model", toy_model_path, "--max-tokens", "8"]
    first = specq(["run", str(path), "-o", str(tmp_path / "a.jsonl"), *common, "--precision", "f32"], queue_env)
    again = specq(["run", str(path), "-o", str(tmp_path / "b.jsonl"), *common], queue_env)
    assert "at the precision it was started with, f32" in again.stderr, again.stderr
    assert client.zcard("specq:batches") == 1  # no second batch
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    assert first.stderr.splitlines()[-1].split(":")[0] == again.stderr.splitlines()[-1].split(":")[0]


@pytest.mark.slow
def test_an_upgrade_under_a_running_worker_hands_its_work_back_and_stops_it(
    client, queue_env, tmp_path, slow_model_path
):
    """specq's engine upgraded in place (pip, a git pull) while a worker decodes: the
    worker must not run on with old modules beside new ones (kernel_cache). It
    notices at its next heartbeat, hands its requests back, and exits non-zero,
    saying why, so that its supervisor starts the new code; another worker finishes
    the batch exactly. Longer requests than the other tests': the heartbeat (0.5 s)
    and a round must come before the batch's end."""
    store, expected, _, _ = submitted(client, queue_env, tmp_path, slow_model_path, 6 * MAX_TOKENS)
    site = tmp_path / "site"
    # The installed copy with numba's compiled kernels, copied with their sources'
    # times so that they load instead of compiling again (minutes): beside the
    # sources, or under NUMBA_CACHE_DIR in the folders numba names for the copy.
    installed = Path(sys.modules["specq"].__file__).parent
    shutil.copytree(installed, site / "specq")
    if os.environ.get("NUMBA_CACHE_DIR"):
        for ours, its in zip(cache_folders(installed), cache_folders(site / "specq")):
            if ours.is_dir():
                shutil.copytree(ours, its, dirs_exist_ok=True)
    # PYTHONSAFEPATH: `-m` and `-c` put the working directory (a checkout holding
    # specq) before PYTHONPATH.
    env = {**queue_env, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    where = subprocess.run([sys.executable, "-c", "import specq; print(specq.__file__)"], env=env, capture_output=True)
    assert Path(where.stdout.decode().strip()).is_relative_to(site)
    worker = start_worker(env)
    wait_for_checkpoints(store, timeout=900)  # a copy whose kernels were not compiled yet compiles them
    assert store.counts()["completed"] < N, "the upgrade must land mid-batch"
    engine = site / "specq" / "specdec" / "engine.py"
    engine.write_text(engine.read_text() + "\n# the next version\n")
    assert worker.wait(60) == 1
    assert "specq's engine changed on disk since this worker started" in worker.stdout.read()
    counts = store.counts()
    assert counts["running"] == 0 and counts["queued"] > 0
    finisher = start_worker(queue_env, "--burst")
    assert finisher.wait(240) == 0, finisher.stdout.read()
    assert_exactly_once(store, expected)

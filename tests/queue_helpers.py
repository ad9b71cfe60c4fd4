"""Helpers for the queue tests: prompt files, the CLI and worker processes as real
processes, and waiting for a condition with a deadline."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from specq.queue import keys
from specq.queue.store import BatchStore
from specq.queue.submit import submit
from specq.requests.config import BatchConfig
from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.gguf_file import GGUFFile
from specq.worker.batch_runner import BatchRunner
from specq.worker.context import load_for_batch


def make_batch(client, n: int, batch_id: str = "b1") -> BatchStore:
    """A batch of n queued requests r0.. written straight into its keys, for tests of
    the store's scripts and of what reads them."""
    store = BatchStore(client, batch_id)
    k = store.keys
    ids = [f"r{i}" for i in range(n)]
    client.hset(k.meta, mapping={"config": "{}", "queue": "q"})
    client.rpush(k.ids, *ids)
    client.hset(k.spec, mapping={r: json.dumps({"custom_id": r}) for r in ids})
    client.hset(k.state, mapping={r: "queued" for r in ids})
    client.hset(k.counts, "queued", n)
    client.rpush(k.pending, *ids)
    client.zadd(keys.BATCHES, {batch_id: time.time()})
    return store


def write_prompts(path: Path, n: int, **fields) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"custom_id": f"r{i:03d}", "prompt": f"story {i} " * (1 + i % 4), **fields}) + "\n")
    return path


def specq(
    args: list[str], env: dict[str, str], *, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a real process."""
    proc = subprocess.run(
        [sys.executable, "-m", "specq", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"specq {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def start_worker(env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "specq", "worker", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout)


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# --- the decode loop in process: a submitted batch and what lone decodes give ---

N_REQUESTS = 5


def setup_batch(client, tmp_path, model_path, *, temperature=0.0, max_tokens=40, batch_id="b1", precision="f32"):
    path = write_prompts(tmp_path / "p.jsonl", N_REQUESTS)
    config = BatchConfig(
        model_path=model_path,
        model_sha256=GGUFFile(model_path).sha256(),
        proposer="ngram",
        defaults=GenerationDefaults(max_tokens=max_tokens, temperature=temperature, seed=7),
        batch_size=3,
        checkpoint_tokens=4,
        checkpoint_seconds=60,
        precision=precision,
    )
    submit(client, str(path), config, model_file=model_path, batch_id=batch_id, queue="unused")
    loaded = load_for_batch(config)
    specs = read_jsonl(str(path))
    alone = {s.custom_id: loaded.engine.run(to_request(s, loaded.engine.tokenizer, config.defaults)) for s in specs}
    return BatchStore(client, batch_id), config, loaded, alone


def stop_after_rounds(runner: BatchRunner, n: int) -> None:
    """Ask the runner to stop (as SIGTERM does) once it has done n rounds."""
    inner = runner.group.round
    done = [0]

    def counted():
        out = inner()
        done[0] += 1
        if done[0] >= n:
            runner.runtime.stop_requested.set()
        return out

    runner.group.round = counted


def outputs(store: BatchStore) -> dict[str, list[int]]:
    ids = store.request_ids()
    return {r: json.loads(raw)["token_ids"] for r, raw in zip(ids, store.results(ids)) if raw}

"""Exporting the results of a large batch: input order, every line once, and memory
bounded by the export's chunk, not by the batch (10,000 results of about 4 KB each
are 40 MB in Redis; the export may hold a quarter of that at most)."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from queue_helpers import make_batch

from specq.queue.results import atomic_writer, export
from specq.queue.store import BatchStore

N = 10_000


def _finish_all(client, store: BatchStore, n_failed: int) -> None:
    """Results written straight into the batch's hashes, as the settle script leaves
    them: the export is under test here, not the workers."""
    k = store.keys
    text = "word " * 800  # about 4 KB a result
    pipe = client.pipeline(transaction=False)
    for i in range(N):
        rid = f"r{i}"
        if i < n_failed:
            pipe.hset(k.state, rid, "failed")
            pipe.hset(k.error, rid, json.dumps({"reason": "engine_error", "message": f"boom {i}"}))
            continue
        result = {
            "custom_id": rid,
            "text": f"{i} {text}",
            "finish_reason": "length",
            "token_ids": [i % 50] * 8,
            "usage": {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11},
            "metrics": {},
        }
        pipe.hset(k.state, rid, "completed")
        pipe.hset(k.result, rid, json.dumps(result))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


@pytest.mark.slow
def test_a_10000_request_batch_exports_in_order_in_bounded_memory(client, tmp_path):
    store = make_batch(client, N)
    _finish_all(client, store, n_failed=7)
    out, err = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    tracemalloc.start()
    try:
        with atomic_writer(str(out)) as outputs, atomic_writer(str(err)) as errors:
            counts = export(store, outputs, errors)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert counts == (N - 7, 7)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(7, N)]
    assert lines[0]["text"].startswith("7 word")
    assert [json.loads(line)["error"]["message"] for line in err.read_text().splitlines()] == [
        f"boom {i}" for i in range(7)
    ]
    total = out.stat().st_size
    assert total > 35e6
    # Holding every line (as the export did before it streamed) peaks above the file's size.
    assert peak < total / 4, f"export peaked at {peak / 1e6:.1f} MB for a {total / 1e6:.0f} MB file"


def test_a_failed_export_leaves_no_file_behind(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("the previous export\n")

    class Full(Exception):
        pass

    try:
        with atomic_writer(str(out)) as fh:
            fh.write("half a line")
            raise Full
    except Full:
        pass
    assert out.read_text() == "the previous export\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]

"""`specq results`: one line per request in input order, for those completed so far,
in the OpenAI Batch output shape when the request came in that shape; failed and
cancelled ones in a separate errors file. Files are written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

from specq.queue.store import BatchStore, _text
from specq.jsonl import dumps_line


def _request_id(batch_id: str, custom_id: str) -> str:
    return hashlib.sha256(f"{batch_id}\0{custom_id}".encode()).hexdigest()[:24]


def output_line(batch_id: str, spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    metrics = {"metrics": result["metrics"], "token_ids": result["token_ids"], "worker": result.get("worker")}
    if not spec.get("openai"):
        return {"custom_id": result["custom_id"], "text": result["text"], "finish_reason": result["finish_reason"],
                "usage": result["usage"], "specq": metrics}
    rid = _request_id(batch_id, result["custom_id"])
    return {
        "id": f"batch_req_{rid}",
        "custom_id": result["custom_id"],
        "response": {
            "status_code": 200,
            "request_id": rid,
            "body": {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion",
                "created": int(result.get("completed_at", 0)),
                "model": spec.get("model") or "specq",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": result["text"]},
                             "finish_reason": result["finish_reason"], "logprobs": None}],
                "usage": result["usage"],
            },
        },
        "error": None,
        "specq": metrics,
    }


def error_line(batch_id: str, spec: dict[str, Any], custom_id: str, error: dict[str, Any]) -> dict[str, Any]:
    if not spec.get("openai"):
        return {"custom_id": custom_id, "error": {"code": error.get("reason"), "message": error.get("message")},
                "line": error.get("line", spec.get("line"))}
    rid = _request_id(batch_id, custom_id)
    return {"id": f"batch_req_{rid}", "custom_id": custom_id, "response": None,
            "error": {"code": error.get("reason"), "message": error.get("message")}}


CHUNK = 500  # requests read from Redis at a time: export memory is bounded by this, not the batch


def iter_results(store: BatchStore) -> Iterator[tuple[str, dict | None, dict | None]]:
    """(custom_id, output line or None, error line or None) in input order, reading
    ids, states, specs, results and errors a chunk at a time, so that a batch of any
    size exports in bounded memory."""
    k = store.keys
    for start in range(0, store.client.llen(k.ids), CHUNK):
        chunk = [_text(x) for x in store.client.lrange(k.ids, start, start + CHUNK - 1)]
        pipe = store.client.pipeline(transaction=False)
        for key in (k.result, k.spec, k.state, k.error):
            pipe.hmget(key, chunk)
        results, specs, states, errors = pipe.execute()
        for rid, raw, raw_spec, state, raw_error in zip(chunk, results, specs, states, errors):
            spec = json.loads(raw_spec) if raw_spec else {}
            if raw is not None:
                yield rid, output_line(store.batch_id, spec, json.loads(raw)), None
            elif _text(state) == "failed":
                yield rid, None, error_line(store.batch_id, spec, rid, json.loads(raw_error or "{}"))
            elif _text(state) == "cancelled":
                error = {"reason": "cancelled", "message": "cancelled before it completed"}
                yield rid, None, error_line(store.batch_id, spec, rid, error)


@contextmanager
def atomic_writer(path: str) -> Iterator[TextIO]:
    """A file that appears at `path` complete or not at all: written to a temporary
    file beside it, synced, then renamed over it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".specq-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def export(store: BatchStore, outputs: TextIO, errors: TextIO | None) -> tuple[int, int]:
    """Writes each line as it is read; returns (results, errors) counted, errors
    counted even when there is nowhere to write them."""
    n_out = n_err = 0
    for _, out, err in iter_results(store):
        if out is not None:
            outputs.write(dumps_line(out) + "\n")
            n_out += 1
        if err is not None:
            if errors is not None:
                errors.write(dumps_line(err) + "\n")
            n_err += 1
    return n_out, n_err

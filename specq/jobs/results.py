"""`specq results`: one line per request in input order, for those completed so far,
in the OpenAI Batch output shape when the request came in that shape; failed and
cancelled ones in a separate errors file. Files are written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Iterator

from specq.jobs.store import BatchStore
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


def iter_results(store: BatchStore) -> Iterator[tuple[str, dict | None, dict | None]]:
    """(custom_id, output line or None, error line or None) in input order."""
    ids = store.request_ids()
    states = store.states()
    errors = store.errors()
    for start in range(0, len(ids), 1000):
        chunk = ids[start:start + 1000]
        results = store.results(chunk)
        specs = store.client.hmget(store.keys.spec, chunk)
        for rid, raw, raw_spec in zip(chunk, results, specs):
            spec = json.loads(raw_spec) if raw_spec else {}
            if raw is not None:
                yield rid, output_line(store.batch_id, spec, json.loads(raw)), None
            elif states.get(rid) == "failed":
                error = json.loads(errors.get(rid, "{}"))
                yield rid, None, error_line(store.batch_id, spec, rid, error)
            elif states.get(rid) == "cancelled":
                error = {"reason": "cancelled", "message": "cancelled before it completed"}
                yield rid, None, error_line(store.batch_id, spec, rid, error)


def write_atomically(path: str, lines: list[str]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".specq-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.writelines(lines)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def collect(store: BatchStore) -> tuple[list[str], list[str]]:
    outputs, errors = [], []
    for _, out, err in iter_results(store):
        if out is not None:
            outputs.append(dumps_line(out) + "\n")
        if err is not None:
            errors.append(dumps_line(err) + "\n")
    return outputs, errors

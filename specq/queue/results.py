"""`specq results`: one line per request in input order, for those completed so far,
in the OpenAI Batch output shape when the request came in that shape; failed and
cancelled ones in a separate errors file. Files are written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from specq.jsonl import dumps_line
from specq.queue.store import BatchStore, _text
from specq.queue.vocabulary import RequestState
from specq.requests.result import Result, endpoint_of, error_line

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
            endpoint = endpoint_of(spec)
            if raw is not None:
                prompt_ids = spec.get("request", {}).get("prompt_ids", [])
                result = Result.from_stored(json.loads(raw), prompt_ids)
                yield rid, result.line(endpoint=endpoint, model=spec.get("model", ""), batch_id=store.batch_id), None
            elif _text(state) in (RequestState.FAILED, RequestState.CANCELLED):
                error = (
                    json.loads(raw_error or "{}")
                    if _text(state) == RequestState.FAILED
                    else {"reason": "cancelled", "message": "cancelled before it completed"}
                )
                yield (
                    rid,
                    None,
                    error_line(
                        rid,
                        error.get("reason"),
                        error.get("message"),
                        openai=bool(endpoint),
                        line=error.get("line", spec.get("line")),
                        batch_id=store.batch_id,
                    ),
                )


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

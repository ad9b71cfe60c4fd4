"""The Batch object of the OpenAI Batch API, made from a specq batch.

A batch created through the API is a specq batch under the same id, submitted with
the queue's submit; beside it, one hash keeps what only the API knows (the input
file, the endpoint, the metadata, when it was cancelled, why it failed validation).
Its status is read from the queue each time, never stored, so that `specq pause`,
`resume` and `cancel` on the command line show through the API at once.

Statuses: a file that fails validation makes a `failed` batch (no specq batch), its
`errors` naming each line as `specq submit` does (a batch whose keys were deleted or
damaged in Redis shows as `failed` too, saying so); otherwise `in_progress` while
requests are queued, running or paused, `cancelling` while a cancelled batch still
has requests running, then `cancelled`, else `completed`. A batch not finished
within its completion window (24 h from its creation) is `expired`: its unfinished
requests are cancelled (their error lines say `batch_expired`) and what completed
stays in the output file, as OpenAI's. Expiry happens when the API reads the batch
past its window (the server looks at every unfinished batch once a minute). Results
are read on demand, so `finalizing` is never seen.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import redis

from specq.errors import InputError
from specq.queue import control, keys
from specq.queue.status import BatchDamaged, batch_status
from specq.queue.store import _text
from specq.queue.vocabulary import Flag, RequestState
from specq.requests.inputs import CHAT_URL, COMPLETIONS_URL

ENDPOINTS = (CHAT_URL, COMPLETIONS_URL)
COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
OUTPUT_SUFFIX, ERRORS_SUFFIX = "-output", "-errors"


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def output_file_id(batch_id: str) -> str:
    return f"file-{batch_id}{OUTPUT_SUFFIX}"


def errors_file_id(batch_id: str) -> str:
    return f"file-{batch_id}{ERRORS_SUFFIX}"


def batch_of_result_file(file_id: str) -> tuple[str, str] | None:
    """(batch id, "output" | "errors") for the id of a batch's result file."""
    for suffix, kind in ((OUTPUT_SUFFIX, "output"), (ERRORS_SUFFIX, "errors")):
        if file_id.startswith("file-batch_") and file_id.endswith(suffix):
            return file_id[len("file-") : -len(suffix)], kind
    return None


def record(client: redis.Redis, batch_id: str) -> dict[str, Any] | None:
    raw = client.hgetall(keys.api_batch(batch_id))
    if not raw:
        return None
    rec = {_text(k): _text(v) for k, v in raw.items()}
    rec["metadata"] = json.loads(rec.get("metadata") or "null")
    rec["errors"] = json.loads(rec.get("errors") or "null")
    return rec


def save(client: redis.Redis, batch_id: str, fields: dict[str, Any]) -> None:
    encoded = {k: json.dumps(v) if k in ("metadata", "errors") else str(v) for k, v in fields.items()}
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(keys.api_batch(batch_id), mapping=encoded)
        if "created_at" in fields:
            pipe.zadd(keys.API_BATCHES, {batch_id: float(fields["created_at"])})
        pipe.execute()


def listed(client: redis.Redis, after: str | None, limit: int) -> tuple[list[str], bool]:
    """Newest first, from just after `after`; (ids, whether more follow)."""
    ids = [_text(b) for b in client.zrevrange(keys.API_BATCHES, 0, -1)]
    if after:
        ids = ids[ids.index(after) + 1 :] if after in ids else []
    return ids[:limit], len(ids) > limit


def to_api(client: redis.Redis, batch_id: str, rec: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    created = int(float(rec["created_at"]))
    obj: dict[str, Any] = {
        "id": batch_id,
        "object": "batch",
        "endpoint": rec["endpoint"],
        "errors": rec["errors"],
        "input_file_id": rec["input_file_id"],
        "completion_window": rec["completion_window"],
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": created,
        "in_progress_at": None,
        "expires_at": created + COMPLETION_WINDOWS.get(rec["completion_window"], 0),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": _int(rec.get("expired_at")),
        "cancelling_at": _int(rec.get("cancelling_at")),
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": rec["metadata"],
    }
    if rec.get("failed_at"):
        return {**obj, "status": "failed", "failed_at": _int(rec["failed_at"])}
    try:
        st = batch_status(client, batch_id, now)
    except (InputError, BatchDamaged) as exc:
        # Deleted or damaged in Redis behind the API's back: said, not a 500 for every listing.
        lost = {"code": "batch_damaged", "message": str(exc), "param": None, "line": None}
        return {**obj, "status": "failed", "errors": {"object": "list", "data": [lost]}}
    counts = st["counts"]
    failed = counts[RequestState.FAILED] + counts[RequestState.CANCELLED]
    obj.update(
        in_progress_at=_int(rec.get("in_progress_at")) or int(st["created"]),
        request_counts={"total": st["total"], "completed": counts[RequestState.COMPLETED], "failed": failed},
        output_file_id=output_file_id(batch_id) if counts[RequestState.COMPLETED] else None,
        error_file_id=errors_file_id(batch_id) if failed else None,
        specq={k: st[k] for k in ("tokens", "tokens_per_second", "tau", "acceptance_rate", "eta_seconds", "stalled")}
        | {"paused": Flag.PAUSED in st["flags"], "counts": counts},
    )
    # A cancel that came after the last request finished cancelled nothing: completed.
    cancelled = Flag.CANCELLED in st["flags"] and not (st["done"] and counts[RequestState.CANCELLED] == 0)
    if not st["done"] and not cancelled and now >= obj["expires_at"]:
        obj["expired_at"] = _expire(client, batch_id, now)
    if obj["expired_at"]:
        obj["status"] = "expired"
    elif cancelled:
        running = counts[RequestState.RUNNING]
        ended = _int(rec.get("ended_at"))
        if running:
            obj["status"] = "cancelling"
        else:
            obj.update(status="cancelled", cancelled_at=ended or _mark_ended(client, batch_id, now))
    elif st["done"]:
        obj.update(status="completed", completed_at=_int(rec.get("ended_at")) or _mark_ended(client, batch_id, now))
    else:
        obj["status"] = "in_progress"
    return obj


def _expire(client: redis.Redis, batch_id: str, now: float) -> int:
    """Past its window: what is unfinished is cancelled (workers let go of it within a
    round); the time is kept so that later reads agree."""
    client.hsetnx(keys.api_batch(batch_id), "expired_at", str(int(now)))
    control.cancel(control.resolve(client, batch_id))
    return int(float(_text(client.hget(keys.api_batch(batch_id), "expired_at"))))


def expire_overdue(client: redis.Redis, now: float | None = None) -> int:
    """Read every API batch, so that those past their window expire even when nobody
    polls them. Returns how many are expired."""
    now = time.time() if now is None else now
    expired = 0
    for batch_id in [_text(b) for b in client.zrange(keys.API_BATCHES, 0, -1)]:
        rec = record(client, batch_id)
        if rec is not None and not any(rec.get(f) for f in ("expired_at", "failed_at", "ended_at")):
            expired += to_api(client, batch_id, rec, now)["status"] == "expired"
    return expired


def _mark_ended(client: redis.Redis, batch_id: str, now: float) -> int:
    """The first time a read sees the batch ended is when it ended, as far as the API
    can tell (within one poll); kept so that later reads agree."""
    client.hsetnx(keys.api_batch(batch_id), "ended_at", str(int(now)))
    return int(float(_text(client.hget(keys.api_batch(batch_id), "ended_at"))))


def _int(value: Any) -> int | None:
    return int(float(value)) if value not in (None, "") else None

"""What `specq status` shows, read without side effects: plain reads of specq's own
keys (never RQ's registry reads, which clean up and retry in the caller)."""

from __future__ import annotations

import time
from typing import Any

import redis

from specq.errors import InputError
from specq.jobs import keys
from specq.jobs.config import WORKER_ALIVE_S
from specq.jobs.store import BatchStore, _text

RATE_WINDOW_S = 60.0


def workers_alive(client: redis.Redis, now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    return [_text(w) for w in client.zrangebyscore(keys.WORKERS, now - WORKER_ALIVE_S, "+inf")]


def batch_ids(client: redis.Redis) -> list[str]:
    return [_text(b) for b in client.zrange(keys.BATCHES, 0, -1)]


def tokens_per_second(samples: list[tuple[float, float]], now: float) -> float:
    """Over the last minute of checkpoints; 0 once nothing has been written for a minute."""
    if not samples or now - samples[0][0] > RATE_WINDOW_S:
        return 0.0
    newest_t, newest_n = samples[0]
    window = [s for s in samples if newest_t - s[0] <= RATE_WINDOW_S]
    oldest_t, oldest_n = window[-1]
    if newest_t - oldest_t < 1.0:
        return 0.0
    return (newest_n - oldest_n) / (newest_t - oldest_t)


def batch_status(client: redis.Redis, batch_id: str, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    store = BatchStore(client, batch_id)
    meta = store.meta()
    if not meta:
        raise InputError(f"no batch {batch_id!r}")
    counts = store.counts()
    stats = store.stats()
    config = store.config()
    total = sum(counts.values())
    tokens = stats.get("tokens", 0.0)
    rate = tokens_per_second(store.rate_samples(), now)
    forwards, drafted = stats.get("target_forwards", 0.0), stats.get("drafted", 0.0)
    remaining = counts["queued"] + counts["running"] + counts["paused"]
    flags = sorted(store.batch_flags())
    status = {
        "batch_id": batch_id,
        "created": float(meta.get("created", 0)),
        "queue": meta.get("queue"),
        "source": meta.get("source"),
        "proposer": config.get("proposer"),
        "flags": flags,
        "total": total,
        "counts": counts,
        "done": counts["completed"] + counts["failed"] + counts["cancelled"] == total,
        "tokens": int(tokens),
        "tokens_per_second": round(rate, 2),
        "tau": round(stats.get("emitted", 0.0) / forwards, 3) if forwards else None,
        "acceptance_rate": round(stats.get("accepted", 0.0) / drafted, 3) if drafted else None,
        "resumes": {"crash": int(stats.get("resumes_crash", 0)), "preempt": int(stats.get("resumes_preempt", 0)),
                    "manual": int(stats.get("resumes_manual", 0)), "prefills": int(stats.get("resume_prefills", 0))},
        "proposer_fallbacks": int(stats.get("proposer_fallbacks", 0) + stats.get("proposer_errors", 0)),
        "eta_seconds": _eta(counts, stats, rate, remaining, paused="paused" in flags),
    }
    return status


def _eta(counts: dict[str, int], stats: dict[str, float], rate: float, remaining: int, *, paused: bool) -> float | None:
    """Remaining requests times the mean length of completed ones, less the tokens
    already made by the running ones, at the recent rate."""
    if remaining == 0:
        return 0.0
    if paused or counts["queued"] + counts["running"] == 0 or rate <= 0 or counts["completed"] == 0:
        return None
    mean_tokens = stats.get("completed_tokens", 0.0) / counts["completed"]
    in_progress = stats.get("tokens", 0.0) - stats.get("completed_tokens", 0.0)
    return round(max(remaining * mean_tokens - in_progress, 0.0) / rate, 1)


def overview(client: redis.Redis) -> dict[str, Any]:
    now = time.time()
    return {
        "workers_alive": workers_alive(client, now),
        "batches": [batch_status(client, b, now) for b in batch_ids(client)],
    }

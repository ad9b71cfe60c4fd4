"""What `specq status` shows, read without side effects: plain reads of specq's own
keys (never RQ's registry reads, which clean up and retry in the caller).

A batch whose keys were partly lost (evicted by a Redis allowed to evict, deleted by
hand) or hold values that do not parse is damaged: `batch_status` raises
BatchDamaged naming what is wrong, and the overview reports it and goes on with the
other batches."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from specq.errors import InputError, SpecqError
from specq.queue import keys
from specq.queue.liveness import config_is_readable, fresh_workers, is_stalled
from specq.queue.store import _text
from specq.queue.timing import WORKER_ALIVE_S
from specq.queue.vocabulary import FINISHED, RESUME_COUNTERS, UNFINISHED, Counter, Flag, RequestState

RATE_WINDOW_S = 60.0
META_FIELDS = ("config", "queue")  # what status and metrics cannot do without


class BatchDamaged(SpecqError):
    """A batch still known to Redis whose keys are partly gone or unreadable."""

    def __init__(self, batch_id: str, what: str) -> None:
        super().__init__(f"batch {batch_id!r} is damaged: {what}")
        self.batch_id = batch_id
        self.what = what

    def report(self) -> dict[str, str]:
        return {"batch_id": self.batch_id, "damaged": self.what}


@dataclass(frozen=True)
class BatchRecord:
    """The keys status and metrics read, parsed, from one consistent snapshot."""

    batch_id: str
    meta: dict[str, str]
    config: dict[str, Any]
    counts: dict[str, int]
    stats: dict[str, float]
    rate_samples: list[tuple[float, float]]  # (time, tokens generated so far), newest first
    flags: list[str]


def workers_alive(client: redis.Redis, now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    return [_text(w) for w in client.zrangebyscore(keys.WORKERS, now - WORKER_ALIVE_S, "+inf")]


def worker_details(client: redis.Redis, worker_ids: list[str]) -> list[dict[str, Any]]:
    """What each worker's heartbeat last said: host, pid, queues, requests held, breaker."""
    pipe = client.pipeline(transaction=False)
    for worker_id in worker_ids:
        pipe.hgetall(keys.worker(worker_id))
    out = []
    for worker_id, raw in zip(worker_ids, pipe.execute()):
        info = {_text(k): _text(v) for k, v in raw.items()}
        out.append(
            {
                "id": worker_id,
                "host": info.get("host", "?"),
                "pid": int(info.get("pid") or 0),
                "queues": [q for q in info.get("queues", "").split(",") if q],
                "held": int(info.get("held") or 0),
                "jobs_done": int(info.get("jobs_done") or 0),
                "breaker": info.get("breaker", ""),
            }
        )
    return out


def batch_ids(client: redis.Redis) -> list[str]:
    return [_text(b) for b in client.zrange(keys.BATCHES, 0, -1)]


def read_batch(client: redis.Redis, batch_id: str) -> BatchRecord:
    """The batch's records, read in one MULTI/EXEC (a submit or a state change is seen
    whole or not at all). Raises InputError for a batch Redis knows nothing of, and
    BatchDamaged for one whose keys break an invariant that submit and the scripts
    keep: meta with its fields, ids, spec, state and counts present, counts summing
    to the number of ids, a result for every completed request."""
    k = keys.BatchKeys(batch_id)
    pipe = client.pipeline(transaction=True)
    pipe.zscore(keys.BATCHES, batch_id)
    pipe.hgetall(k.meta)
    pipe.llen(k.ids)
    pipe.hlen(k.spec)
    pipe.hlen(k.state)
    pipe.hgetall(k.counts)
    pipe.hlen(k.result)
    pipe.hgetall(k.stats)
    pipe.lrange(k.rate, 0, -1)
    pipe.hkeys(k.flags)
    replies = pipe.execute(raise_on_error=False)
    wrong = [
        key
        for key, r in zip(
            [keys.BATCHES, k.meta, k.ids, k.spec, k.state, k.counts, k.result, k.stats, k.rate, k.flags], replies
        )
        if isinstance(r, redis.ResponseError)
    ]
    if wrong:
        raise BatchDamaged(batch_id, "wrong type of key: " + ", ".join(wrong))
    listed, raw_meta, n_ids, n_specs, n_states, raw_counts, n_results, raw_stats, raw_rate, raw_flags = replies
    meta = {_text(f): _text(v) for f, v in raw_meta.items()}
    if listed is None and not meta:
        raise InputError(f"no batch {batch_id!r}")
    problems: list[str] = []
    if listed is None:
        problems.append(f"not listed in {keys.BATCHES}")
    config = _config_from_meta(meta, problems)
    for present, name in ((n_ids, "ids list"), (n_specs, "spec hash"), (n_states, "state hash")):
        # A synchronous batch (queue/sync.py) forgets each request once answered: empty is its rest.
        if not present and not meta.get("sync"):
            problems.append(f"{name} missing")
    counts = _parse(raw_counts, int, "counts hash", problems)
    if counts is not None:
        unknown = sorted(set(counts) - set(RequestState))
        counts = {s: counts.get(s, 0) for s in RequestState}
        if unknown:
            problems.append(f"counts hash has unknown states {', '.join(unknown)}")
        if any(n < 0 for n in counts.values()):
            problems.append("counts hash has negative counts")
        elif n_ids and sum(counts.values()) != n_ids:
            problems.append(f"counts sum to {sum(counts.values())} but the ids list has {n_ids} requests")
        if counts[RequestState.COMPLETED] > n_results:
            problems.append(
                f"no result for {counts['completed'] - n_results} of {counts['completed']} completed requests"
            )
    stats = _parse(raw_stats, float, "stats hash", problems, optional=True)
    rate = _rate_samples(raw_rate, problems)
    if problems:
        raise BatchDamaged(batch_id, "; ".join(problems))
    return BatchRecord(batch_id, meta, config, counts, stats, rate, sorted(_text(f) for f in raw_flags))


def _config_from_meta(meta: dict[str, str], problems: list[str]) -> dict[str, Any]:
    """The batch's configuration from its meta hash; what is wrong goes to problems."""
    if not meta:
        problems.append("meta hash missing")
        return {}
    absent = [f for f in META_FIELDS if f not in meta]
    if absent:
        problems.append(f"meta hash has no {', '.join(absent)}")
    try:
        float(meta.get("created", 0))
    except ValueError:
        problems.append(f"created time {meta['created']!r} in meta hash is not a number")
    try:
        config = json.loads(meta["config"]) if "config" in meta else {}
    except ValueError:
        config = None
    if not isinstance(config, dict):
        problems.append("config in meta hash is not a JSON object")
        return {}
    if "config" in meta and not config_is_readable(meta["config"]):
        problems.append("config in meta hash is not a batch configuration")
    return config


def _parse(raw: dict, kind: type, name: str, problems: list[str], *, optional: bool = False) -> dict | None:
    """A hash of numbers (a missing one is empty when optional); None, with the problem
    recorded, when it is missing or a value does not parse."""
    if not raw and not optional:
        problems.append(f"{name} missing")
        return None
    try:
        return {_text(f): kind(v) for f, v in raw.items()}
    except ValueError:
        problems.append(f"{name} unparsable")
        return None


def _rate_samples(raw: list, problems: list[str]) -> list[tuple[float, float]]:
    try:
        return [(float(t), float(n)) for t, n in (_text(x).split() for x in raw)]
    except ValueError:
        problems.append("rate list unparsable")
        return []


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


def batch_status(
    client: redis.Redis, batch_id: str, now: float | None = None, fresh: set[str] | None = None
) -> dict[str, Any]:
    """Raises InputError for an unknown batch and BatchDamaged for a damaged one."""
    now = time.time() if now is None else now
    record = read_batch(client, batch_id)
    meta, counts, stats, config, flags = record.meta, record.counts, record.stats, record.config, record.flags
    total = sum(counts.values())
    tokens = stats.get(Counter.TOKENS, 0.0)
    rate = tokens_per_second(record.rate_samples, now)
    forwards, drafted = stats.get(Counter.TARGET_FORWARDS, 0.0), stats.get(Counter.DRAFTED, 0.0)
    remaining = sum(counts[s] for s in UNFINISHED)
    status = {
        "batch_id": batch_id,
        "created": float(meta.get("created", 0)),
        "queue": meta.get("queue"),
        "source": meta.get("source"),
        "synchronous": bool(meta.get("sync")),
        "proposer": config.get("proposer"),
        "precision": config.get("precision", "f32"),  # batches from before the field were f32
        "flags": flags,
        "total": total,
        "counts": counts,
        "done": sum(counts[s] for s in FINISHED) == total,
        "tokens": int(tokens),
        "tokens_per_second": round(rate, 2),
        "tau": round(stats.get(Counter.EMITTED, 0.0) / forwards, 3) if forwards else None,
        "acceptance_rate": round(stats.get(Counter.ACCEPTED, 0.0) / drafted, 3) if drafted else None,
        "resumes": {
            **{why: int(stats.get(counter, 0)) for why, counter in RESUME_COUNTERS.items()},
            "prefills": int(stats.get(Counter.RESUME_PREFILLS, 0)),
        },
        "proposer_fallbacks": int(stats.get(Counter.PROPOSER_FALLBACKS, 0) + stats.get(Counter.PROPOSER_ERRORS, 0)),
        "eta_seconds": _eta(counts, stats, rate, remaining, paused=Flag.PAUSED in flags),
        # Requests wait and no live job will run them: the reaper in every worker
        # restores one within a heartbeat, so this lasting means no worker is there.
        "stalled": is_stalled(client, batch_id, fresh),
    }
    return status


def batch_report(
    client: redis.Redis, batch_id: str, now: float | None = None, fresh: set[str] | None = None
) -> dict[str, Any]:
    """batch_status, or {"batch_id", "damaged": what is wrong} for a damaged batch.
    Raises InputError for an unknown batch."""
    try:
        return batch_status(client, batch_id, now, fresh)
    except BatchDamaged as exc:
        return exc.report()


def _eta(counts: dict[str, int], stats: dict[str, float], rate: float, remaining: int, *, paused: bool) -> float | None:
    """Remaining requests times the mean length of completed ones, less the tokens
    already made by the running ones, at the recent rate."""
    if remaining == 0:
        return 0.0
    if (
        paused
        or counts[RequestState.QUEUED] + counts[RequestState.RUNNING] == 0
        or rate <= 0
        or counts[RequestState.COMPLETED] == 0
    ):
        return None
    mean_tokens = stats.get(Counter.COMPLETED_TOKENS, 0.0) / counts[RequestState.COMPLETED]
    in_progress = stats.get(Counter.TOKENS, 0.0) - stats.get(Counter.COMPLETED_TOKENS, 0.0)
    return round(max(remaining * mean_tokens - in_progress, 0.0) / rate, 1)


def overview(client: redis.Redis) -> dict[str, Any]:
    """Every listed batch, damaged ones as {"batch_id", "damaged"}."""
    now = time.time()
    fresh = fresh_workers(client, now)  # read once, not once per batch
    batches = []
    for batch_id in batch_ids(client):
        try:
            batches.append(batch_report(client, batch_id, now, fresh))
        except InputError:
            continue  # gone, listing and all, since batch_ids read the list
    return {"workers_alive": workers_alive(client, now), "batches": batches}

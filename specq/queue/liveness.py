"""Which workers and which of a batch's RQ jobs are alive, read from Redis without side
effects (plain reads of the job hashes, never RQ's registry reads, which clean up and
retry in the caller). The one write is the reaper's: dequeued_lately(note=True) notes
when it first saw a job mid-dequeue; `specq status` only reads that note.

The invariant the reaper keeps: a batch with pending requests always has a job that a
live worker will run. A job is live while it waits in its queue's list, or while a
worker whose heartbeat is fresh runs it. A job taken by a worker that then died (a
SIGKILL between RQ's dequeue and the first claim, say) stays "started" in RQ's
records until RQ's own maintenance, ten minutes later by default; here it is dead as
soon as its worker's heartbeat is stale, or at once when that worker was a process
of this machine that no longer exists. A job out of its queue's list and not yet
started is dead too, once DEQUEUE_GRACE_MS has passed since a reaper first noticed it
so (dequeued_lately); within that grace its worker may still be marking it started.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

import redis
from rq.job import Job
from rq.queue import Queue

from specq.errors import SpecqError
from specq.queue import keys
from specq.queue.timing import DEQUEUE_GRACE_MS, WORKER_ALIVE_S
from specq.queue.vocabulary import Flag, RequestState
from specq.requests.config import BatchConfig

LIVE_STATUSES_IF_QUEUED = ("queued", "deferred", "scheduled")
ENDED_STATUSES = ("finished", "failed", "stopped", "canceled")


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def process_is_dead_here(owner: str) -> bool:
    """True when `owner` (a worker id, host.pid.nonce) names a process of this machine
    that no longer exists; False when it lives, is elsewhere, or cannot be told."""
    host, _, _nonce = owner.rpartition(".")
    host, _, pid = host.rpartition(".")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def fresh_workers(client: redis.Redis, now: float | None = None) -> set[str]:
    now = time.time() if now is None else now
    return {_text(w) for w in client.zrangebyscore(keys.WORKERS, now - WORKER_ALIVE_S, "+inf")}


def worker_is_alive(worker_id: str, fresh: set[str]) -> bool:
    return worker_id in fresh and not process_is_dead_here(worker_id)


@dataclass(frozen=True)
class JobView:
    job_id: str
    status: str | None  # None: the job's hash is gone (expired, deleted)
    live: bool
    ended: bool  # finished, failed or gone: it will never run the batch again
    dequeued: bool = False  # queued, but out of its queue's list: mid-dequeue, or its worker died there


def batch_jobs(client: redis.Redis, batch_id: str, fresh: set[str] | None = None) -> list[JobView]:
    """Every job in the batch's jobs set, classified."""
    job_ids = sorted(_text(j) for j in client.smembers(keys.BatchKeys(batch_id).jobs))
    if not job_ids:
        return []
    fresh = fresh_workers(client) if fresh is None else fresh
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(Job.key_for(job_id), "status", "worker_name", "origin")
    rows = pipe.execute()
    positions = {}
    queued = [(job_id, _text(row[2])) for job_id, row in zip(job_ids, rows) if _text(row[0]) == "queued" and row[2]]
    if queued:
        pipe = client.pipeline(transaction=False)
        for job_id, origin in queued:
            pipe.lpos(Queue.redis_queue_namespace_prefix + origin, job_id)
        positions = {job_id: pos for (job_id, _), pos in zip(queued, pipe.execute())}
    views = []
    for job_id, (status, worker_name, _origin) in zip(job_ids, rows):
        status, worker_name = _text(status), _text(worker_name)
        if status is None or status in ENDED_STATUSES:
            views.append(JobView(job_id, status, live=False, ended=True))
        elif status == "queued":
            # Out of the queue's list but not yet started: being dequeued right now, or
            # dequeued by a worker that died at that moment. Not live either way; the
            # reaper gives it a grace before it enqueues another (dequeued_lately).
            waiting = positions.get(job_id) is not None
            views.append(JobView(job_id, status, live=waiting, ended=False, dequeued=not waiting))
        elif status in LIVE_STATUSES_IF_QUEUED:
            views.append(JobView(job_id, status, live=True, ended=False))
        else:  # started: live while the worker that took it is
            owner = (worker_name or "").rsplit(".", 1)[0]  # RQ's worker name is "<worker id>.<attempt>"
            views.append(JobView(job_id, status, live=bool(owner) and worker_is_alive(owner, fresh), ended=False))
    return views


def has_claimable_work(client: redis.Redis, batch_id: str) -> bool:
    """Queued requests in a batch that is neither paused nor cancelled (a paused
    batch's requests wait on purpose) and whose configuration a worker can read.
    The pending list is not the test: it may hold stale ids (the claim skips them)."""
    k = keys.BatchKeys(batch_id)
    queued = client.hget(k.counts, RequestState.QUEUED)
    if not queued or int(queued) <= 0:
        return False
    if any(client.hexists(k.flags, flag) for flag in Flag):
        return False
    return config_is_readable(client.hget(k.meta, "config"))


def config_is_readable(raw: bytes | str | None) -> bool:
    """Whether a worker could decode the batch at all: a damaged or hand-written
    configuration is for an operator (status shows it), not for job after job."""
    try:
        BatchConfig.from_dict(json.loads(raw))
    except (SpecqError, KeyError, TypeError, ValueError, AttributeError):
        return False
    return True


# How long a reaper's note of a dequeued job is kept: far beyond any grace, so that
# passes a heartbeat apart find it; a job that never starts (its worker died there)
# is noted again after it lapses.
SIGHTING_TTL_MS = 600_000


def dequeued_lately(client: redis.Redis, job_ids: list[str], *, note: bool = False) -> bool:
    """Whether any of these jobs (out of their queue's list, not yet started) was
    first noticed so by a reaper less than DEQUEUE_GRACE_MS ago, on Redis's clock:
    its worker may still be between RQ's dequeue and marking it started. With
    `note` (the reaper), a job not noticed before is noticed now; without, this only
    reads (`specq status`). A note that is not a time, or is in the future (written
    by hand), counts as old: it must not hold a batch's job back."""
    if not job_ids:
        return False
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        if note:
            pipe.set(keys.dequeued(job_id), now_ms, nx=True, px=SIGHTING_TTL_MS)
        pipe.get(keys.dequeued(job_id))
    noted = pipe.execute()[1::2] if note else pipe.execute()
    for raw in noted:
        try:
            age = now_ms - int(raw)
        except (TypeError, ValueError):
            continue
        if 0 <= age < DEQUEUE_GRACE_MS:
            return True
    return False


def is_stalled(client: redis.Redis, batch_id: str, fresh: set[str] | None = None) -> bool:
    """Claimable requests and no live job to take them: the alert condition. A job
    within its dequeue grace is not yet counted dead, as the reaper does not yet
    replace it; one no reaper has noticed is (no worker may be running)."""
    if not has_claimable_work(client, batch_id):
        return False
    views = batch_jobs(client, batch_id, fresh)
    if any(v.live for v in views):
        return False
    return not dequeued_lately(client, [v.job_id for v in views if v.dequeued])

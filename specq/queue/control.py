"""Pause, resume and cancel (cooperative: a request a worker is decoding stops at its
next round, after a checkpoint), and the reaper that hands abandoned requests back.

A target is a batch id, or "BATCH:CUSTOM_ID" for one request (batch ids never
contain ':', custom ids may)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

import redis

from specq.errors import InputError, SpecqError
from specq.queue import keys, lua
from specq.queue.liveness import (
    batch_jobs,
    dequeued_lately,
    fresh_workers,
    has_claimable_work,
    process_is_dead_here,
)
from specq.queue.rq_glue import enqueue_batch_jobs
from specq.queue.store import BatchStore, _text
from specq.queue.submit import jobs_for
from specq.queue.timing import LEASE_TTL_MS, MAX_ATTEMPTS
from specq.queue.vocabulary import UNFINISHED, Counter, FailureKind, Flag, RequestState
from specq.requests.config import BatchConfig

# "worker_error" is no longer written; batches from the first specq may still hold it.
TRANSIENT_FAILURES = (FailureKind.ABANDONED, "worker_error")


@dataclass(frozen=True)
class Target:
    store: BatchStore
    request_id: str | None  # None: the whole batch

    def request_ids(self) -> list[str]:
        return [self.request_id] if self.request_id else self.store.request_ids()


def resolve(client: redis.Redis, target: str) -> Target:
    batch_id, colon, request_id = target.partition(":")
    if colon and not request_id:
        # "nightly:" is a request target with the id left out, not the whole batch.
        raise InputError(f"{target!r} names no request: give BATCH or BATCH:CUSTOM_ID")
    store = BatchStore(client, batch_id)
    if not store.exists():
        raise InputError(f"no batch {batch_id!r}")
    if request_id and store.state(request_id) is None:
        raise InputError(f"batch {batch_id} has no request {request_id!r}")
    return Target(store, request_id or None)


def _raise_flag(target: Target, flag: Flag) -> None:
    """On the request, or on the whole batch; the claim script and the decode loop read it."""
    store = target.store
    if target.request_id:
        store.client.hset(store.keys.req_flags, target.request_id, flag)
    else:
        store.client.hset(store.keys.flags, flag, "1")


def pause(target: Target) -> dict[str, int]:
    store = target.store
    _raise_flag(target, Flag.PAUSED)
    moved = store.transition(target.request_ids(), (RequestState.QUEUED,), RequestState.PAUSED)
    return {"paused_now": len(moved), "running_until_next_round": _running(target)}


def cancel(target: Target) -> dict[str, int]:
    store = target.store
    _raise_flag(target, Flag.CANCELLED)
    moved = store.transition(target.request_ids(), (RequestState.QUEUED, RequestState.PAUSED), RequestState.CANCELLED)
    return {"cancelled_now": len(moved), "running_until_next_round": _running(target)}


def _running(target: Target) -> int:
    """Requests a worker decodes now: they take the flag after their current round."""
    if target.request_id:
        return int(target.store.state(target.request_id) == RequestState.RUNNING)
    return target.store.counts()[RequestState.RUNNING]


def resume(target: Target) -> dict[str, int]:
    """Paused requests, transiently failed ones and abandoned ones go back to the
    pending list (from their checkpoints); jobs are enqueued for them. A cancelled
    request stays cancelled."""
    store = target.store
    client = store.client
    if target.request_id:
        if _text(client.hget(store.keys.req_flags, target.request_id)) == Flag.PAUSED:
            client.hdel(store.keys.req_flags, target.request_id)
    else:
        client.hdel(store.keys.flags, Flag.PAUSED)
        paused_flags = [_text(k) for k, v in client.hgetall(store.keys.req_flags).items() if _text(v) == Flag.PAUSED]
        if paused_flags:
            client.hdel(store.keys.req_flags, *paused_flags)
    if Flag.CANCELLED in store.batch_flags():
        return {"resumed": 0, "abandoned": 0, "jobs": 0}
    abandoned = reap_batch(store, force=True)
    errors = store.errors()
    permanent = {r for r, e in errors.items() if _reason(e) not in TRANSIENT_FAILURES}
    candidates = [r for r in target.request_ids() if r not in permanent]
    transient = [r for r in candidates if r in errors]
    if transient:
        client.hdel(store.keys.attempts, *transient)
    moved = store.transition(candidates, (RequestState.PAUSED, RequestState.FAILED), RequestState.QUEUED, push=True)
    if moved:
        store.count(Counter.RESUMES_MANUAL, len(moved))
    ids = target.request_ids()
    # Queued requests whose job was lost (an interrupted submit) get pushed again: a
    # duplicate in the pending list is skipped by the claim.
    requeued = store.transition(ids, (RequestState.QUEUED,), RequestState.QUEUED, push=True)
    jobs = _enqueue_for(store, len(moved) + len(requeued) + abandoned)
    return {"resumed": len(moved), "abandoned": abandoned, "jobs": jobs}


def checkpointed_unfinished(store: BatchStore) -> int:
    """Requests not yet finished that will resume from a checkpoint, not from scratch."""
    with_checkpoint = [_text(r) for r in store.client.hkeys(store.keys.ckpt)]
    states = store.client.hmget(store.keys.state, with_checkpoint) if with_checkpoint else []
    return sum(_text(s) in UNFINISHED for s in states)


def _reason(error_json: str) -> str:
    try:
        return json.loads(error_json).get("reason", "")
    except ValueError:
        return ""


def _enqueue_for(store: BatchStore, n_requests: int) -> int:
    if n_requests <= 0:
        return 0
    try:
        n_jobs = jobs_for(n_requests, BatchConfig.from_dict(store.config()).batch_size)
    except (SpecqError, KeyError, TypeError, ValueError, AttributeError):
        n_jobs = 1  # unreadable (damaged): one job, which skips the batch
    enqueue_batch_jobs(store.client, store.meta().get("queue", "specq"), store.batch_id, n_jobs)
    return n_jobs


def reap_batch(store: BatchStore, *, force: bool = False) -> int:
    """Hand back the batch's running requests whose lease is gone, or whose owner is a
    dead process on this machine (found at once, without waiting for the lease to
    expire). Returns how many went back to pending; enqueues jobs for them."""
    delete_if = store.client.register_script(lua.DELETE_IF)
    requeued = 0
    for rid in store.running():
        lease_key = store.keys.lease(rid)
        value = _text(store.client.get(lease_key))
        if value is not None and process_is_dead_here(value.rsplit("#", 1)[0]):
            delete_if(keys=[lease_key], args=[value])
        if store.reap(rid, MAX_ATTEMPTS) == 1:
            requeued += 1
    if requeued and not force:
        _enqueue_for(store, requeued)
    return requeued


def ensure_job(store: BatchStore, fresh: set[str] | None = None) -> bool:
    """Keep the invariant: a batch with claimable requests has a job that a live
    worker will run. Forgets the batch's ended jobs; enqueues one job when none is
    live (their worker died between taking the job and claiming, say, or the job
    was lost with a Redis that lost its last writes), but not while a job out of
    its queue's list and not yet started is within its grace (liveness.dequeued_lately:
    its worker may be marking it started). Returns whether it enqueued."""
    client = store.client
    views = batch_jobs(client, store.batch_id, fresh)
    ended = [v.job_id for v in views if v.ended]
    if ended:
        client.srem(store.keys.jobs, *ended)
    # A job seen started, waiting or ended no longer needs its sighting (and RQ may
    # enqueue the same id again: `rq requeue`).
    settled = [keys.dequeued(v.job_id) for v in views if not v.dequeued]
    if settled:
        client.delete(*settled)
    if any(v.live for v in views) or not has_claimable_work(client, store.batch_id):
        return False
    if dequeued_lately(client, [v.job_id for v in views if v.dequeued], note=True):
        return False
    if not client.llen(store.keys.pending):
        # Queued requests that are in no pending list (damaged or hand-edited data):
        # push them again; a duplicate would be skipped by the claim.
        store.transition(store.request_ids(), (RequestState.QUEUED,), RequestState.QUEUED, push=True)
    enqueue_batch_jobs(client, store.meta().get("queue", "specq"), store.batch_id, 1)
    store.count(Counter.JOBS_RESTORED)
    return True


def reap_all(client: redis.Redis, *, lock_ms: int = LEASE_TTL_MS // 6) -> int:
    """One reaper pass over every batch, by whichever process takes the short lock:
    abandoned requests back to pending, and a live job for every batch with work.
    Returns how many requests went back to pending."""
    if not client.set(keys.REAPER_LOCK, socket.gethostname(), nx=True, px=lock_ms):
        return 0
    return sweep(client, [_text(raw) for raw in client.zrange(keys.BATCHES, 0, -1)])


def sweep(client: redis.Redis, batch_ids: list[str]) -> int:
    if not batch_ids:
        return 0
    pipe = client.pipeline(transaction=False)
    for batch_id in batch_ids:
        k = keys.BatchKeys(batch_id)
        pipe.scard(k.running)
        pipe.hget(k.counts, "queued")
    replies = pipe.execute()
    fresh = fresh_workers(client)
    total = 0
    for batch_id, n_running, n_queued in zip(batch_ids, replies[0::2], replies[1::2]):
        store = BatchStore(client, batch_id)
        if n_running:
            total += reap_batch(store)
        if n_running or int(n_queued or 0) > 0:
            ensure_job(store, fresh)
    return total

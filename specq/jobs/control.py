"""Pause, resume and cancel (cooperative: a request a worker is decoding stops at its
next round, after a checkpoint), and the reaper that hands abandoned requests back.

A target is a batch id, or "BATCH:CUSTOM_ID" for one request (batch ids never
contain ':', custom ids may)."""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import dataclass

import redis

from specq.errors import InputError
from specq.jobs import keys, scripts
from specq.jobs.config import LEASE_TTL_MS, MAX_ATTEMPTS, BatchConfig
from specq.jobs.rq_glue import enqueue_batch_jobs
from specq.jobs.store import BatchStore, _text
from specq.jobs.submit import MAX_PARALLEL_JOBS

TRANSIENT_FAILURES = ("abandoned", "worker_error")


@dataclass(frozen=True)
class Target:
    store: BatchStore
    request_id: str | None  # None: the whole batch

    def request_ids(self) -> list[str]:
        return [self.request_id] if self.request_id else self.store.request_ids()


def resolve(client: redis.Redis, target: str) -> Target:
    batch_id, _, request_id = target.partition(":")
    store = BatchStore(client, batch_id)
    if not store.exists():
        raise InputError(f"no batch {batch_id!r}")
    if request_id and store.state(request_id) is None:
        raise InputError(f"batch {batch_id} has no request {request_id!r}")
    return Target(store, request_id or None)


def _raise_flag(target: Target, flag: str) -> None:
    """On the request, or on the whole batch; the claim script and the decode loop read it."""
    store = target.store
    if target.request_id:
        store.client.hset(store.keys.req_flags, target.request_id, flag)
    else:
        store.client.hset(store.keys.flags, flag, "1")


def pause(target: Target) -> dict[str, int]:
    store = target.store
    _raise_flag(target, "paused")
    moved = store.transition(target.request_ids(), ("queued",), "paused")
    return {"paused_now": len(moved), "running_until_next_round": _running(target)}


def cancel(target: Target) -> dict[str, int]:
    store = target.store
    _raise_flag(target, "cancelled")
    moved = store.transition(target.request_ids(), ("queued", "paused"), "cancelled")
    return {"cancelled_now": len(moved), "running_until_next_round": _running(target)}


def _running(target: Target) -> int:
    """Requests a worker decodes now: they take the flag after their current round."""
    if target.request_id:
        return int(target.store.state(target.request_id) == "running")
    return target.store.counts()["running"]


def resume(target: Target) -> dict[str, int]:
    """Paused requests, transiently failed ones and abandoned ones go back to the
    pending list (from their checkpoints); jobs are enqueued for them. A cancelled
    request stays cancelled."""
    store = target.store
    client = store.client
    if target.request_id:
        if _text(client.hget(store.keys.req_flags, target.request_id)) == "paused":
            client.hdel(store.keys.req_flags, target.request_id)
    else:
        client.hdel(store.keys.flags, "paused")
        paused_flags = [_text(k) for k, v in client.hgetall(store.keys.req_flags).items() if _text(v) == "paused"]
        if paused_flags:
            client.hdel(store.keys.req_flags, *paused_flags)
    if "cancelled" in store.batch_flags():
        return {"resumed": 0, "abandoned": 0, "jobs": 0}
    abandoned = reap_batch(store, force=True)
    errors = store.errors()
    permanent = {r for r, e in errors.items() if _reason(e) not in TRANSIENT_FAILURES}
    candidates = [r for r in target.request_ids() if r not in permanent]
    transient = [r for r in candidates if r in errors]
    if transient:
        client.hdel(store.keys.attempts, *transient)
    moved = store.transition(candidates, ("paused", "failed"), "queued", push=True)
    if moved:
        store.count("resumes_manual", len(moved))
    ids = target.request_ids()
    # Queued requests whose job was lost (an interrupted submit) get pushed again: a
    # duplicate in the pending list is skipped by the claim.
    requeued = store.transition(ids, ("queued",), "queued", push=True)
    jobs = _enqueue_for(store, len(moved) + len(requeued) + abandoned)
    return {"resumed": len(moved), "abandoned": abandoned, "jobs": jobs}


def _reason(error_json: str) -> str:
    try:
        return json.loads(error_json).get("reason", "")
    except ValueError:
        return ""


def _enqueue_for(store: BatchStore, n_requests: int) -> int:
    if n_requests <= 0:
        return 0
    config = BatchConfig.from_dict(store.config())
    n_jobs = min(math.ceil(n_requests / config.batch_size), MAX_PARALLEL_JOBS)
    enqueue_batch_jobs(store.client, store.meta().get("queue", "specq"), store.batch_id, n_jobs)
    return n_jobs


def reap_batch(store: BatchStore, *, force: bool = False) -> int:
    """Hand back the batch's running requests whose lease is gone, or whose owner is a
    dead process on this machine (found at once, without waiting for the lease to
    expire). Returns how many went back to pending; enqueues jobs for them."""
    delete_if = store.client.register_script(scripts.DELETE_IF)
    requeued = 0
    for rid in store.running():
        lease_key = store.keys.lease(rid)
        value = _text(store.client.get(lease_key))
        if value is not None and _owner_is_dead_here(value):
            delete_if(keys=[lease_key], args=[value])
        if store.reap(rid, MAX_ATTEMPTS) == 1:
            requeued += 1
    if requeued and not force:
        _enqueue_for(store, requeued)
    return requeued


def _owner_is_dead_here(lease_value: str) -> bool:
    owner = lease_value.rsplit("#", 1)[0]
    host, _, rest = owner.rpartition(".")  # host.pid.nonce
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


def reap_all(client: redis.Redis, *, lock_ms: int = LEASE_TTL_MS // 6) -> int:
    """One reaper pass over every batch, by whichever process takes the short lock."""
    if not client.set(keys.REAPER_LOCK, socket.gethostname(), nx=True, px=lock_ms):
        return 0
    total = 0
    for raw in client.zrange(keys.BATCHES, 0, -1):
        store = BatchStore(client, _text(raw))
        if client.scard(store.keys.running):
            total += reap_batch(store)
    return total

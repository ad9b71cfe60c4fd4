"""Synchronous requests (`specq serve`'s /v1/chat/completions and /v1/completions):
one request at a time, answered while the client waits, decoded by the same workers
as the batches, and never starved by them.

Each server's synchronous requests go into one long-lived specq batch of their own
(its id derived from the configuration and the queue), whose jobs go to the
high-priority queue `<queue>-sync`. A request is appended to it, decoded and
checkpointed every round (so that the server can stream it), and forgotten once its
answer is delivered. Decoding them as one batch means a worker that serves them
admits each new one into its running decode group at the next round, as continuous
batching does.

Priority: workers listen on `<queue>-sync` first, so an idle worker takes a
synchronous request at once. A worker decoding an ordinary batch checks, every
quarter second, whether a synchronous request waits that no worker has room for
(workers serving the synchronous batch say so in a short-lived room set); if so, one
worker at a time (a short lock) hands its batch back, checkpointed, exactly as at its
job's deadline, and takes the synchronous job next.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from typing import Any

import redis

from specq.queue import keys, lua
from specq.queue.liveness import fresh_workers
from specq.queue.rq_glue import enqueue_batch_jobs, sync_queue
from specq.queue.submit import canonical
from specq.queue.vocabulary import RequestState
from specq.requests.config import BatchConfig

ROOM_TTL_S = 1.0  # a serving worker refreshes its place in the room set four times as often
YIELD_LOCK_MS = 2000  # after one worker yields, the others wait this long before they may
SYNC_SOURCE = "specq serve (synchronous completions)"


def sync_config(config: BatchConfig) -> BatchConfig:
    # Every round is checkpointed: the checkpoints are what the server streams.
    return replace(config, checkpoint_tokens=1)


def sync_batch_id(config: BatchConfig, queue: str) -> str:
    digest = hashlib.sha256(canonical([config.to_dict(), queue]).encode()).hexdigest()
    return "sync-" + digest[:16]


def enqueue(
    client: redis.Redis, batch_id: str, config: BatchConfig, queue: str, custom_id: str, record: dict[str, Any]
) -> None:
    """Append one request (a spec record, as submit writes them) to the synchronous
    batch, creating the batch if it is not there, and enqueue a job for it, all in
    one transaction. A job per request: a surplus one finds nothing and ends at once,
    and a request never waits without a job that will claim it."""
    k = keys.BatchKeys(batch_id)
    now = time.time()
    with client.pipeline(transaction=True) as pipe:
        pipe.multi()  # before the first command: RQ's enqueue calls multi() itself otherwise
        meta = {
            "config": canonical(config.to_dict()),
            "created": f"{now:.3f}",
            "queue": sync_queue(queue),
            "source": SYNC_SOURCE,
            "sync": queue,
        }
        for name, value in meta.items():
            pipe.hsetnx(k.meta, name, value)
        pipe.zadd(keys.BATCHES, {batch_id: now}, nx=True)
        pipe.sadd(keys.sync_batches(queue), batch_id)
        pipe.rpush(k.ids, custom_id)
        pipe.hset(k.spec, custom_id, canonical(record))
        pipe.hset(k.state, custom_id, RequestState.QUEUED)
        pipe.hincrby(k.counts, RequestState.QUEUED, 1)
        pipe.rpush(k.pending, custom_id)
        enqueue_batch_jobs(client, sync_queue(queue), batch_id, 1, pipeline=pipe)
        pipe.execute()


def forget(client: redis.Redis, batch_id: str, custom_id: str) -> bool:
    """Remove a finished request (its answer delivered); False if it is not finished."""
    k = keys.BatchKeys(batch_id)
    script = client.register_script(lua.FORGET)
    return bool(
        script(
            keys=[k.state, k.counts, k.ids, k.spec, k.ckpt, k.result, k.error, k.attempts, k.fence, k.req_flags],
            args=[custom_id],
        )
    )


def forget_finished(client: redis.Redis, batch_id: str) -> int:
    """Forget every finished request of the batch (answers a server that stopped
    never delivered). Returns how many."""
    k = keys.BatchKeys(batch_id)
    finished = (RequestState.COMPLETED, RequestState.FAILED, RequestState.CANCELLED)
    done = [rid for rid, st in client.hgetall(k.state).items() if st.decode() in finished]
    return sum(forget(client, batch_id, rid.decode()) for rid in done)


def mark_room(client: redis.Redis, queue: str, worker_id: str, has_room: bool) -> None:
    """Said by a worker decoding a synchronous batch of `queue`, every quarter second:
    whether its decode group could take another request."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    if has_room:
        pipe.zadd(keys.sync_room(queue), {worker_id: now + ROOM_TTL_S})
    else:
        pipe.zrem(keys.sync_room(queue), worker_id)
    pipe.zremrangebyscore(keys.sync_room(queue), "-inf", now)
    pipe.execute()


def should_yield(client: redis.Redis, queue: str, worker_id: str) -> bool:
    """Whether this worker, decoding an ordinary batch of `queue`, should hand it back
    for a synchronous request: one waits, no worker serving them has room, and no
    other worker yielded in the last YIELD_LOCK_MS (one at a time, so that one
    request does not cost every worker its decode group)."""
    batches = client.smembers(keys.sync_batches(queue))
    if not batches:
        return False
    pipe = client.pipeline(transaction=False)
    pipe.zcount(keys.sync_room(queue), time.time(), "+inf")
    for batch_id in batches:
        pipe.llen(keys.BatchKeys(batch_id.decode()).pending)
    room, *waiting = pipe.execute()
    if room or not any(waiting):
        return False
    return bool(client.set(keys.sync_yielding(queue), worker_id, nx=True, px=YIELD_LOCK_MS))


def announce(client: redis.Redis, batch_id: str, request_ids: list[str]) -> None:
    """Wake the server's readers of these requests: their checkpoints just changed."""
    if request_ids:
        client.publish(keys.news(batch_id), " ".join(request_ids))


def listening_workers(client: redis.Redis, queue: str) -> int:
    """Live worker processes that take `queue`'s synchronous requests."""
    fresh = sorted(fresh_workers(client))
    if not fresh:
        return 0
    pipe = client.pipeline(transaction=False)
    for worker_id in fresh:
        pipe.hget(keys.worker(worker_id), "queues")
    wanted = sync_queue(queue)
    return sum(wanted in (raw or b"").decode().split(",") for raw in pipe.execute())

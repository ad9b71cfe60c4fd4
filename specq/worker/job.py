"""The RQ job function, and the job class through which workers read jobs.

Jobs carry only a batch id (JSON); the work itself is the batch's pending list,
claimed one request at a time, so a job may run twice, late, or on any worker
without doing anything twice."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import get_current_job
from rq.job import Job

from specq.errors import SpecqError
from specq.queue.rq_glue import FORMER_JOB_FUNCTIONS, JOB_FUNCTION, enqueue_batch_jobs, sync_queue
from specq.queue.store import BatchStore
from specq.queue.timing import JOB_SECONDS
from specq.requests.config import BatchConfig
from specq.worker import context as context_mod
from specq.worker.batch_runner import BatchRunner

log = logging.getLogger("specq.worker")


def work_on_batch(batch_id: str) -> dict[str, Any]:
    runtime = context_mod.current()
    # The job's time counts from here, where RQ's hard limit (JOB_TIMEOUT_S) counts
    # from: loading an engine can take minutes (a first compile, in its warm-up).
    started = time.monotonic()
    # The runtime's client has short socket timeouts (a cut-off Redis must not hold a
    # checkpoint write for minutes); RQ's own, for blocking dequeues, has long ones.
    client = runtime.client or get_current_job().connection
    store = BatchStore(client, batch_id)
    if not store.exists():
        return {"batch": batch_id, "skipped": "no such batch (deleted?)"}
    if not client.llen(store.keys.pending):
        return {"batch": batch_id, "skipped": "nothing pending"}
    meta = store.meta()
    queue = meta.get("queue", "specq")
    if runtime.breaker.state == "open":
        # Sick: give the job to a healthy worker, and take nothing until the probe.
        enqueue_batch_jobs(client, queue, batch_id, 1)
        runtime.breaker.wait_until_probe(runtime.stop_requested)
        return {"batch": batch_id, "skipped": "circuit breaker open"}
    try:
        config = BatchConfig.from_dict(store.config())
    except (SpecqError, KeyError, TypeError, ValueError, AttributeError) as exc:
        # Damaged or hand-written: nothing any worker can do (status shows it), and
        # not this worker's sickness, so no breaker and no successor job.
        log.error("batch %s has an unreadable configuration (%r); skipping it", batch_id, exc)
        return {"batch": batch_id, "skipped": "unreadable configuration"}
    try:
        loaded = runtime.engine_for(config)
        runner = BatchRunner(
            store,
            config,
            loaded,
            runtime,
            deadline=started + JOB_SECONDS,
            serves_sync=meta.get("sync") or None,
            yields_to_sync=queue if sync_queue(queue) in runtime.queues else None,
        )
        summary = runner.run()
    except (redis.ConnectionError, redis.TimeoutError):
        raise  # Redis is away, not the model: no breaker; the reaper restores a job for the batch
    except Exception as exc:
        # The worker failed, not a request (a request's own failures are handled in
        # the runner): its requests are pending again; leave a job for them.
        runtime.breaker.record_failure(f"{exc.__class__.__name__}: {exc}")
        with contextlib.suppress(Exception):
            enqueue_batch_jobs(client, queue, batch_id, 1)
        raise
    runtime.breaker.record_success()
    if summary["handed_back"]:
        # Its requests are pending again; the jobs that could take them may all be
        # gone, so this job leaves a successor behind.
        enqueue_batch_jobs(client, queue, batch_id, 1)
    runtime.jobs_done += 1
    return {"batch": batch_id, **summary}


class ForeignJobError(SpecqError):
    """A job in specq's queues that specq did not make (a hand-written or forged one)."""


class SpecqJob(Job):
    """A job as a specq worker reads it from Redis. Job hashes are data that anyone
    with write access to Redis can write, and RQ imports whatever dotted name a job
    holds (JSON serialization stops pickle's code execution, not `os.system`): so
    only specq's own function runs, with one string argument, and the callback
    names a job carries are never imported (specq sets none)."""

    @property
    def func(self) -> Callable[[str], dict[str, Any]]:
        name, args, kwargs = self.func_name, self.args, self.kwargs
        if name not in (JOB_FUNCTION, *FORMER_JOB_FUNCTIONS) or self.instance is not None:
            raise ForeignJobError(f"refusing job {self.id}: it names {name!r}; a specq worker runs only {JOB_FUNCTION}")
        if kwargs or len(args) != 1 or not isinstance(args[0], str):
            raise ForeignJobError(f"refusing job {self.id}: {JOB_FUNCTION} takes one batch id, got {args!r} {kwargs!r}")
        return work_on_batch

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

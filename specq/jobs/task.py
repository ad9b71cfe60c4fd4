"""The RQ job function. Jobs carry only a batch id (JSON); the work itself is the
batch's pending list, claimed one request at a time, so a job may run twice, late,
or on any worker without doing anything twice."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rq import get_current_job

from specq.jobs import runtime as runtime_mod
from specq.jobs.batch_runner import BatchRunner
from specq.jobs.config import JOB_SECONDS, BatchConfig
from specq.jobs.rq_glue import enqueue_batch_jobs
from specq.jobs.store import BatchStore

MAX_BACKOFF_S = 60.0


def work_on_batch(batch_id: str) -> dict[str, Any]:
    client = get_current_job().connection
    store = BatchStore(client, batch_id)
    if not store.exists():
        return {"batch": batch_id, "skipped": "no such batch (deleted?)"}
    if not client.llen(store.keys.pending):
        return {"batch": batch_id, "skipped": "nothing pending"}
    runtime = runtime_mod.current()
    config = BatchConfig.from_dict(store.config())
    loaded = runtime.engine_for(config)
    runner = BatchRunner(store, config, loaded, runtime, deadline=time.monotonic() + JOB_SECONDS)
    try:
        summary = runner.run()
    except Exception:
        # The worker failed, not a request: its requests are pending again. Leave a
        # job for them, and back off so this worker does not take it straight back.
        runtime.consecutive_failures += 1
        with contextlib.suppress(Exception):
            enqueue_batch_jobs(client, store.meta().get("queue", "specq"), batch_id, 1)
        time.sleep(min(2.0 ** runtime.consecutive_failures, MAX_BACKOFF_S))
        raise
    runtime.consecutive_failures = 0
    if summary["handed_back"]:
        # Its requests are pending again; the jobs that could take them may all be
        # gone, so this job leaves a successor behind.
        enqueue_batch_jobs(client, store.meta().get("queue", "specq"), batch_id, 1)
    runtime.jobs_done += 1
    return {"batch": batch_id, **summary}

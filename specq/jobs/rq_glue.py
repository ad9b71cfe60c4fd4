"""The one home of RQ options: the job function, the JSON serializer (never pickle:
pickle lets anyone who can write to Redis run code in the workers), timeouts and
TTLs."""

from __future__ import annotations

import uuid

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from specq.jobs.config import JOB_TIMEOUT_S

JOB_FUNCTION = "specq.jobs.task.work_on_batch"
RESULT_TTL_S = 3600  # a job's return value is a small summary; results live in specq's keys
FAILURE_TTL_S = 7 * 24 * 3600


def make_queue(client: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=client, serializer=JSONSerializer)


def enqueue_batch_jobs(client: redis.Redis, queue_name: str, batch_id: str, n_jobs: int, *, pipeline=None) -> None:
    """Jobs are wake-ups: each claims the batch's pending requests one at a time
    until none is left, so any number of jobs is safe (a surplus one finds nothing
    and ends); n_jobs bounds how many workers decode the batch at once."""
    queue = make_queue(client, queue_name)
    for _ in range(n_jobs):
        queue.enqueue_call(
            JOB_FUNCTION,
            args=[batch_id],
            timeout=JOB_TIMEOUT_S,
            result_ttl=RESULT_TTL_S,
            failure_ttl=FAILURE_TTL_S,
            job_id=f"specq-{batch_id}-{uuid.uuid4().hex[:12]}",
            description=f"specq batch {batch_id}",
            pipeline=pipeline,
        )

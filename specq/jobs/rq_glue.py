"""The one home of RQ options: the job function, the job class that refuses every
other function, the JSON serializer (never pickle: pickle lets anyone who can write
to Redis run code in the workers), job ids, timeouts and TTLs."""

from __future__ import annotations

import hashlib
import uuid

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from specq.errors import SpecqError
from specq.jobs import keys
from specq.jobs.config import JOB_TIMEOUT_S

JOB_FUNCTION = "specq.jobs.task.work_on_batch"
RESULT_TTL_S = 3600  # a job's return value is a small summary; results live in specq's keys
FAILURE_TTL_S = 7 * 24 * 3600


class ForeignJobError(SpecqError):
    """A job in specq's queues that specq did not make (a hand-written or forged one)."""


class SpecqJob(Job):
    """A job as a specq worker reads it from Redis. Job hashes are data that anyone
    with write access to Redis can write, and RQ imports whatever dotted name a job
    holds (JSON serialization stops pickle's code execution, not `os.system`): so
    only specq's own function runs, with one string argument, and the callback
    names a job carries are never imported (specq sets none)."""

    @property
    def func(self):
        name, args, kwargs = self.func_name, self.args, self.kwargs
        if name != JOB_FUNCTION or self.instance is not None:
            raise ForeignJobError(f"refusing job {self.id}: it names {name!r}; a specq worker runs only {JOB_FUNCTION}")
        if kwargs or len(args) != 1 or not isinstance(args[0], str):
            raise ForeignJobError(f"refusing job {self.id}: {JOB_FUNCTION} takes one batch id, got {args!r} {kwargs!r}")
        from specq.jobs.task import work_on_batch  # here: task imports this module

        return work_on_batch

    @property
    def success_callback(self):
        return None

    @property
    def failure_callback(self):
        return None

    @property
    def stopped_callback(self):
        return None


def make_queue(client: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=client, serializer=JSONSerializer, job_class=SpecqJob)


def job_id_prefix(batch_id: str) -> str:
    """RQ allows only letters, digits, '_' and '-' in job ids, and batch ids may hold
    '.': a job names its batch by a digest, and its batch lists it in its jobs set."""
    return "specq-" + hashlib.sha256(batch_id.encode()).hexdigest()[:16] + "-"


def enqueue_batch_jobs(client: redis.Redis, queue_name: str, batch_id: str, n_jobs: int, *, pipeline=None) -> list[str]:
    """Jobs are wake-ups: each claims the batch's pending requests one at a time
    until none is left, so any number of jobs is safe (a surplus one finds nothing
    and ends); n_jobs bounds how many workers decode the batch at once. Each job id
    goes into the batch's jobs set, where the reaper looks for a live one."""
    queue = make_queue(client, queue_name)
    batch_jobs = keys.BatchKeys(batch_id).jobs
    # The set and the job are written in one transaction, so the reaper never sees a
    # listed job without its hash (and takes it for dead).
    pipe = pipeline if pipeline is not None else client.pipeline(transaction=True)
    if pipeline is None:
        pipe.multi()  # RQ would otherwise call multi() after our SADD, which redis-py refuses
    ids = []
    for _ in range(n_jobs):
        job_id = job_id_prefix(batch_id) + uuid.uuid4().hex[:12]
        pipe.sadd(batch_jobs, job_id)
        queue.enqueue_call(
            JOB_FUNCTION,
            args=[batch_id],
            timeout=JOB_TIMEOUT_S,
            result_ttl=RESULT_TTL_S,
            failure_ttl=FAILURE_TTL_S,
            job_id=job_id,
            description=f"specq batch {batch_id}",
            pipeline=pipe,
        )
        ids.append(job_id)
    if pipeline is None:
        pipe.execute()
    return ids

"""The one home of RQ options: the job function's name, the JSON serializer (never
pickle: pickle lets anyone who can write to Redis run code in the workers), job ids,
timeouts and TTLs."""

from __future__ import annotations

import hashlib
import uuid

import redis
from redis.client import Pipeline
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from specq.queue import keys
from specq.queue.timing import JOB_TIMEOUT_S

JOB_FUNCTION = "specq.worker.job.work_on_batch"
# Jobs enqueued by specq before its packages moved name the function by its old path;
# workers still run them (the same function, the same one argument).
FORMER_JOB_FUNCTIONS = frozenset({"specq.jobs.task.work_on_batch"})
RESULT_TTL_S = 3600  # a job's return value is a small summary; results live in specq's keys
# A synchronous request enqueues a job of its own: many, small and soon useless.
SYNC_RESULT_TTL_S = 60
# The high-priority queue beside each queue: `specq serve`'s synchronous completions.
# Workers listen on it first, and a worker decoding a batch yields to it (sync.py).
SYNC_QUEUE_SUFFIX = "-sync"


def sync_queue(queue: str) -> str:
    return queue + SYNC_QUEUE_SUFFIX


def listened_queues(queues: list[str] | tuple[str, ...]) -> list[str]:
    """What a worker asked for `queues` listens on: each one's synchronous queue
    first (RQ takes jobs from the first queue that has one), then the queues."""
    syncs = [sync_queue(q) for q in queues if not q.endswith(SYNC_QUEUE_SUFFIX)]
    return list(dict.fromkeys([*syncs, *queues]))


FAILURE_TTL_S = 7 * 24 * 3600


def make_queue(client: redis.Redis, name: str, job_class: type[Job] = Job) -> Queue:
    """A queue that speaks JSON; workers read it through their guarded job class."""
    return Queue(name, connection=client, serializer=JSONSerializer, job_class=job_class)


def job_id_prefix(batch_id: str) -> str:
    """RQ allows only letters, digits, '_' and '-' in job ids, and batch ids may hold
    '.': a job names its batch by a digest, and its batch lists it in its jobs set."""
    return "specq-" + hashlib.sha256(batch_id.encode()).hexdigest()[:16] + "-"


def enqueue_batch_jobs(
    client: redis.Redis, queue_name: str, batch_id: str, n_jobs: int, *, pipeline: Pipeline | None = None
) -> list[str]:
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
            result_ttl=SYNC_RESULT_TTL_S if queue_name.endswith(SYNC_QUEUE_SUFFIX) else RESULT_TTL_S,
            failure_ttl=FAILURE_TTL_S,
            job_id=job_id,
            description=f"specq batch {batch_id}",
            pipeline=pipe,
        )
        ids.append(job_id)
    if pipeline is None:
        pipe.execute()
    return ids

"""Every Redis key specq uses, built in one place.

Layout (B = batch id, R = a request's custom_id):
  specq:batches                 zset  B -> creation time
  specq:batch:B                 hash  meta: options, model, queue, format, counts of lines
  specq:batch:B:ids             list  custom_ids in input order
  specq:batch:B:spec            hash  R -> the request as submitted (JSON, tokenized)
  specq:batch:B:state           hash  R -> queued | running | paused | completed | failed | cancelled
  specq:batch:B:counts          hash  state -> number of requests in it (kept by the Lua scripts)
  specq:batch:B:pending         list  requests ready to be claimed by any worker, in order
  specq:batch:B:running         set   requests whose state is running (the reaper's worklist)
  specq:batch:B:lease:R         str   "owner#token", with a TTL: who decodes R now
  specq:batch:B:fence           hash  R -> the last fencing token handed out
  specq:batch:B:ckpt            hash  R -> checkpoint JSON (decode state, fingerprint, checksum)
  specq:batch:B:result          hash  R -> result JSON
  specq:batch:B:error           hash  R -> error JSON
  specq:batch:B:attempts        hash  R -> times abandoned or failed since its last checkpoint
  specq:batch:B:stats           hash  token and draft counters, summed over checkpoints
  specq:batch:B:rate            list  recent "time tokens_total" samples, newest first
  specq:batch:B:flags           hash  paused / cancelled for the whole batch
  specq:batch:B:req_flags       hash  R -> paused / cancelled for one request
  specq:batch:B:jobs            set   ids of the RQ jobs enqueued for the batch and not yet seen ended
  specq:workers                 zset  worker id -> last heartbeat time
  specq:worker:W                hash  the worker's host, pid, queues, state
  specq:reaper                  str   short lock: one reaper at a time
  specq:dequeued:J              str   ms on Redis's clock when a reaper first saw RQ job J dequeued, not started (TTL)
  specq:api:batches             zset  B -> creation time, for the batches made through `specq serve`
  specq:api:batch:B             hash  what only the Batch API knows of B: input file, endpoint, metadata, times
  specq:syncq:Q:batches         set   the synchronous batches (`specq serve`'s completions) whose jobs go to Q-sync
  specq:syncq:Q:room            zset  worker id -> until when it decodes one of them with room for more
  specq:syncq:Q:yielding        str   short lock: one worker at a time hands its batch back for them
  specq:news:B                  pub/sub channel: the requests of B just checkpointed (a wake-up, not state)
"""

from __future__ import annotations

PREFIX = "specq"

BATCHES = f"{PREFIX}:batches"
WORKERS = f"{PREFIX}:workers"
REAPER_LOCK = f"{PREFIX}:reaper"
API_BATCHES = f"{PREFIX}:api:batches"


def sync_batches(queue: str) -> str:
    return f"{PREFIX}:syncq:{queue}:batches"


def sync_room(queue: str) -> str:
    return f"{PREFIX}:syncq:{queue}:room"


def sync_yielding(queue: str) -> str:
    return f"{PREFIX}:syncq:{queue}:yielding"


def dequeued(job_id: str) -> str:
    return f"{PREFIX}:dequeued:{job_id}"


def news(batch_id: str) -> str:
    return f"{PREFIX}:news:{batch_id}"


def worker(worker_id: str) -> str:
    return f"{PREFIX}:worker:{worker_id}"


def api_batch(batch_id: str) -> str:
    return f"{PREFIX}:api:batch:{batch_id}"


class BatchKeys:
    """The keys of one batch."""

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        base = f"{PREFIX}:batch:{batch_id}"
        self.meta = base
        self.ids = f"{base}:ids"
        self.spec = f"{base}:spec"
        self.state = f"{base}:state"
        self.counts = f"{base}:counts"
        self.pending = f"{base}:pending"
        self.running = f"{base}:running"
        self.fence = f"{base}:fence"
        self.ckpt = f"{base}:ckpt"
        self.result = f"{base}:result"
        self.error = f"{base}:error"
        self.attempts = f"{base}:attempts"
        self.stats = f"{base}:stats"
        self.rate = f"{base}:rate"
        self.flags = f"{base}:flags"
        self.req_flags = f"{base}:req_flags"
        self.jobs = f"{base}:jobs"
        self._lease_prefix = f"{base}:lease:"

    @property
    def lease_prefix(self) -> str:
        return self._lease_prefix

    def lease(self, request_id: str) -> str:
        return self._lease_prefix + request_id

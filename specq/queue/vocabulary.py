"""The words the queue writes into Redis: request states, the flags that pause or
cancel, and the names of a batch's counters. One home for each, so that Python, the
Lua scripts (checked against these by a test), status and metrics cannot drift apart.

They are str enums: each member is the very string stored in Redis, so records
written by any specq version read back the same.
"""

from __future__ import annotations

from enum import StrEnum


class RequestState(StrEnum):
    QUEUED = "queued"  # in the batch's pending list, waiting for a worker
    RUNNING = "running"  # leased by a worker that is decoding it
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


UNFINISHED = (RequestState.QUEUED, RequestState.RUNNING, RequestState.PAUSED)
FINISHED = (RequestState.COMPLETED, RequestState.FAILED, RequestState.CANCELLED)


class Flag(StrEnum):
    """Raised on a batch (or a request) by `pause` and `cancel`; a worker that sees
    one hands the request back at its next checkpoint."""

    PAUSED = "paused"
    CANCELLED = "cancelled"


class FailureKind(StrEnum):
    INVALID_REQUEST = "invalid_request"  # refused at submit (kept, to be reported)
    CHECKPOINT = "checkpoint"  # its checkpoint cannot be read back
    ENGINE_ERROR = "engine_error"  # decoding it raised, more often than MAX_ATTEMPTS
    ABANDONED = "abandoned"  # its workers died, more often than MAX_ATTEMPTS


class Counter(StrEnum):
    """A batch's counters (its stats hash): added to by every write that makes
    progress, summed by `status` and the Prometheus collector."""

    TOKENS = "tokens"
    COMPLETED_TOKENS = "completed_tokens"  # the tokens of completed requests: for time left
    TARGET_FORWARDS = "target_forwards"
    DRAFTED = "drafted"
    ACCEPTED = "accepted"
    EMITTED = "emitted"
    DECODE_SECONDS = "decode_seconds"
    RESUME_PREFILLS = "resume_prefills"
    RECOMPUTED_TOKENS = "recomputed_tokens"
    RESUMES_CRASH = "resumes_crash"
    RESUMES_PREEMPT = "resumes_preempt"
    RESUMES_MANUAL = "resumes_manual"
    RETRIES = "retries"
    CHECKPOINT_WRITES = "checkpoint_writes"
    FENCED_WRITES_REFUSED = "fenced_writes_refused"
    PROPOSER_FALLBACKS = "proposer_fallbacks"  # a worker could not load the proposer
    PROPOSER_ERRORS = "proposer_errors"  # drafting raised mid-decode; decoding went on without it
    JOBS_RESTORED = "jobs_restored"
    FAILED_INVALID_REQUEST = "failed_invalid_request"
    FAILED_CHECKPOINT = "failed_checkpoint"
    FAILED_ENGINE_ERROR = "failed_engine_error"
    FAILED_ABANDONED = "failed_abandoned"

    @staticmethod
    def failed(kind: FailureKind) -> Counter:
        return Counter(f"failed_{kind}")

    @staticmethod
    def drafted_at(position: int | str) -> str:
        """Drafts made at a draft position (0 = the first token after the last accepted)."""
        return f"drafted_pos_{position}"

    @staticmethod
    def accepted_at(position: int | str) -> str:
        return f"accepted_pos_{position}"


RESUME_COUNTERS = {"crash": Counter.RESUMES_CRASH, "preempt": Counter.RESUMES_PREEMPT, "manual": Counter.RESUMES_MANUAL}

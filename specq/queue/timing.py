"""The queue's clocks: leases, heartbeats, job lengths and retry limits (one home
for each; SPECQ_LEASE_TTL_MS, SPECQ_HEARTBEAT_S, SPECQ_MAX_ATTEMPTS and
SPECQ_DEQUEUE_GRACE_MS override four of them)."""

from __future__ import annotations

from specq.requests.config import env_number

DEFAULT_QUEUE = "specq"

LEASE_TTL_MS = int(env_number("SPECQ_LEASE_TTL_MS", 30_000))  # a silent worker's requests are taken over after this
HEARTBEAT_S = env_number("SPECQ_HEARTBEAT_S", 5.0)  # leases are renewed, and the reaper runs, this often
# A request abandoned or failing more often than this without a new checkpoint fails:
# a prompt that kills every worker it reaches must not take the whole pool down. A
# deployment whose workers are preempted often (spot machines) may want more.
MAX_ATTEMPTS = int(env_number("SPECQ_MAX_ATTEMPTS", 3))
JOB_SECONDS = 1800  # a job hands its requests back and re-enqueues itself after this
JOB_TIMEOUT_S = JOB_SECONDS + 900  # RQ's hard limit: only reached by a job that hangs
WORKER_ALIVE_S = 3 * HEARTBEAT_S
# A job out of its queue's list and not yet started is in a worker's hands for the
# milliseconds between RQ's dequeue and its marking the job started, or its worker
# died there. The reaper waits this long after a reaper first noticed the job in that
# state before it enqueues a job in its place, so that a dequeue caught mid-way does
# not get a spare job (and an operator a jobs_restored count) for nothing.
DEQUEUE_GRACE_MS = max(1, round(env_number("SPECQ_DEQUEUE_GRACE_MS", 1000 * HEARTBEAT_S)))

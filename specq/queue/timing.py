"""The queue's clocks: leases, heartbeats, job lengths and retry limits (one home
for each; SPECQ_LEASE_TTL_MS and SPECQ_HEARTBEAT_S override two of them)."""

from __future__ import annotations

from specq.requests.config import env_number

DEFAULT_QUEUE = "specq"

LEASE_TTL_MS = int(env_number("SPECQ_LEASE_TTL_MS", 30_000))  # a silent worker's requests are taken over after this
HEARTBEAT_S = env_number("SPECQ_HEARTBEAT_S", 5.0)  # leases are renewed, and the reaper runs, this often
MAX_ATTEMPTS = 3  # a request abandoned or failing more often than this without a new checkpoint fails
JOB_SECONDS = 1800  # a job hands its requests back and re-enqueues itself after this
JOB_TIMEOUT_S = JOB_SECONDS + 900  # RQ's hard limit: only reached by a job that hangs
WORKER_ALIVE_S = 3 * HEARTBEAT_S

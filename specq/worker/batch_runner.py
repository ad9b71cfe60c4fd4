"""The decode loop of one job: claim a batch's pending requests, decode up to
the configuration's batch_size of them together, a decode group sharing one target
forward per round, checkpoint
each one every chunk, and let go of it when it completes, fails, is paused or
cancelled, or when the job must stop.

Every write is fenced by the request's lease; a write refused means another worker
owns the request now, and this one simply forgets it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
from rq.timeouts import JobTimeoutException

from specq.errors import SpecqError
from specq.queue import sync
from specq.queue.histograms import PendingCounts
from specq.queue.store import BatchStore, Lease
from specq.queue.timing import HEARTBEAT_S, LEASE_TTL_MS, MAX_ATTEMPTS
from specq.queue.vocabulary import Counter, FailureKind, Flag, RequestState
from specq.requests import checkpoint
from specq.requests.config import BatchConfig, kv_memory
from specq.requests.result import Result
from specq.specdec.engine import DecodeGroup, Engine
from specq.specdec.precision import numerics
from specq.specdec.state import DecodeState, GenerationRequest
from specq.worker.context import LoadedEngine, WorkerContext

FLAG_CHECK_S = 0.25  # pause and cancel take effect within this, plus one round
# Redis restarting, failing over or cut off: the call may or may not have reached it.
REDIS_OUTAGE = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)  # ReadOnly: mid-failover

log = logging.getLogger("specq.worker")


@dataclass
class Owned:
    lease: Lease
    spec: dict[str, Any]
    written: DecodeState  # as last written to Redis: deltas and "checkpoint due" count from it
    written_at: float
    # The settle being written (new state, payload, decode state): replayed if Redis
    # went away before it answered.
    settling: tuple[str, str, DecodeState] | None = None
    # Seconds of the rounds since it joined with no token yet: a prompt prefilled in
    # pieces waits several rounds for its first token.
    waited: float = 0.0


def progress_deltas(old: DecodeState, new: DecodeState) -> dict[str, float]:
    """The batch counters a write adds: what `new` did since `old` was written."""
    a, b = old.metrics, new.metrics
    deltas: dict[str, float] = {
        Counter.TOKENS: len(new.output_ids) - len(old.output_ids),
        Counter.TARGET_FORWARDS: b.target_forwards - a.target_forwards,
        Counter.DRAFTED: b.drafted - a.drafted,
        Counter.ACCEPTED: b.accepted - a.accepted,
        Counter.EMITTED: b.emitted - a.emitted,
        Counter.RESUME_PREFILLS: b.resume_prefills - a.resume_prefills,
        Counter.DECODE_SECONDS: round(b.decode_seconds - a.decode_seconds, 6),
    }
    for i, n in enumerate(b.drafted_per_position):
        deltas[Counter.drafted_at(i)] = n - (a.drafted_per_position[i] if i < len(a.drafted_per_position) else 0)
    for i, n in enumerate(b.accepted_per_position):
        deltas[Counter.accepted_at(i)] = n - (a.accepted_per_position[i] if i < len(a.accepted_per_position) else 0)
    return deltas


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def result_payload(engine: Engine, custom_id: str, state: DecodeState, worker_id: str) -> str:
    return json.dumps(Result.of(custom_id, engine.text(state), state, worker_id).stored(), ensure_ascii=False)


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        config: BatchConfig,
        loaded: LoadedEngine,
        runtime: WorkerContext,
        *,
        deadline: float,
        serves_sync: str | None = None,
        yields_to_sync: str | None = None,
    ) -> None:
        self.store = store
        # The queue whose synchronous requests this batch holds (the runner says whether
        # it has room for more), or the queue whose synchronous requests this ordinary
        # batch yields to (sync.py); at most one of them is set.
        self.serves_sync = serves_sync
        self.yields_to_sync = None if serves_sync else yields_to_sync
        self.config = config
        self.engine = loaded.engine
        self.fingerprint = loaded.fingerprint
        self.numerics = numerics(config.precision)
        self.degraded = loaded.degraded
        self.guard = loaded.guard
        self.runtime = runtime
        self.deadline = deadline  # time.monotonic() after which the job hands its work back
        self.group = DecodeGroup(self.engine)
        self.owned: dict[str, Owned] = {}
        self._claimed: dict[str, Lease] = {}  # claimed, not yet owned (spec and checkpoint being read)
        self.summary = {"completed": 0, "failed": 0, "retried": 0, "handed_back": 0, "released": 0, "lost": 0}
        self._last_renew = time.monotonic()
        self._last_check_in = float("-inf")
        # Seconds spent in Redis calls ("store_seconds") and wall seconds of this loop
        # ("worker_seconds"), each reported with the next write: their ratio is the
        # share of a worker's time that checkpointing costs.
        self._store_s = 0.0
        self._wall_mark = time.perf_counter()
        self.pending_counts = PendingCounts()
        self.kv_budget = kv_memory()
        # The KV cache of the last request claimed and handed back for want of room:
        # no claim until that much is free (a claim and hand-back every round is churn).
        self._kv_wanted = 0

    @contextlib.contextmanager
    def _redis_time(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._store_s += time.perf_counter() - t0

    def _deltas(self, old: DecodeState, new: DecodeState) -> dict[str, float]:
        deltas = progress_deltas(old, new)
        now = time.perf_counter()
        deltas["store_seconds"], self._store_s = round(self._store_s, 6), 0.0
        deltas["worker_seconds"], self._wall_mark = round(now - self._wall_mark, 6), now
        if self.guard is not None:
            self.pending_counts.add(Counter.PROPOSER_ERRORS, self.guard.take_failures())
        for name, n in self.pending_counts.drain().items():
            deltas[name] = deltas.get(name, 0) + n
        return deltas

    def run(self) -> dict[str, Any]:
        """Decode until no request is left to claim, or until asked to stop (SIGTERM)
        or the job's time is up; then every owned request goes back to the pending
        list with a fresh checkpoint. Returns counts of what happened. Whatever ends
        the job, its leases are no longer renewed once it returns or raises."""
        try:
            while True:
                self._drop_lost()
                yielding = self._check_in()
                if yielding or self.runtime.stop_requested.is_set() or time.monotonic() > self.deadline:
                    for rid in list(self.owned):
                        self.pending_counts.add(Counter.RESUMES_PREEMPT)
                        self.summary["handed_back" if self._let_go(rid, RequestState.QUEUED) else "lost"] += 1
                    if yielding:
                        self.summary["yielded_to_sync"] = 1
                    break
                self._fill()
                if not self.group:
                    break
                self._round()
        except REDIS_OUTAGE as exc:
            self._ride_out_outage(exc)
        except BaseException:
            # The engine failed mid-round: hand back what can be handed back,
            # unchanged since its last checkpoint, so that healthy workers continue it.
            for rid in list(self.owned):
                with contextlib.suppress(Exception):  # Redis may be failing too; leases then expire
                    self._let_go(rid, RequestState.QUEUED, write_progress=False)
            raise
        finally:
            for rid in list(self.owned) + list(self._claimed):
                self.runtime.release(self.store.batch_id, rid)
            if self.serves_sync:
                with contextlib.suppress(redis.RedisError):  # else its place in the room set expires by itself
                    sync.mark_room(self.store.client, self.serves_sync, self.runtime.worker_id, False)
        return self.summary

    def _ride_out_outage(self, exc: BaseException) -> None:
        """Redis went away mid-job. Redis is called only between rounds, so the decode
        states in memory are whole: wait for Redis to answer, then hand every request
        back with its latest state (a finished one completes), each write fenced, so
        one taken over meanwhile is left alone. Waiting past the lease's lifetime is
        pointless (every lease has expired: the reaper hands the requests back from
        their last checkpoints), and so is waiting once asked to stop."""
        log.warning(
            "lost Redis mid-job (%s); waiting to hand %d requests back",
            exc.__class__.__name__,
            len(self.owned) + len(self._claimed),
        )
        deadline = time.monotonic() + LEASE_TTL_MS / 1000
        delay = 0.1
        while not _answers(self.store.client):
            if time.monotonic() + delay > deadline or self.runtime.stop_requested.is_set():
                self.summary["lost"] += len(self.owned) + len(self._claimed)
                return
            self.runtime.stop_requested.wait(delay)
            delay = min(delay * 2, 1.0)
        try:
            for rid, lease in list(self._claimed.items()):  # claimed, not yet decoding
                self.store.settle(lease, RequestState.QUEUED, "", {})
                del self._claimed[rid]
                self.summary["handed_back"] += 1
            for rid in list(self.owned):
                self.summary["handed_back" if self._hand_back_latest(rid) else "lost"] += 1
        except REDIS_OUTAGE:
            # Gone again: the rest wait for their leases to expire.
            self.summary["lost"] += len(self.owned) + len(self._claimed)

    def _hand_back_latest(self, rid: str) -> bool:
        owned = self.owned[rid]
        if owned.settling is not None:
            new_state, payload, state = owned.settling
            return self._settle(rid, new_state, payload, state)
        self.pending_counts.add(Counter.RESUMES_PREEMPT)
        state = self.group.sessions[rid].state if rid in self.group.sessions else owned.written
        if state.finished:
            payload = result_payload(self.engine, rid, state, self.runtime.worker_id)
            return self._settle(rid, RequestState.COMPLETED, payload, state)
        return self._let_go(rid, RequestState.QUEUED)

    def _round(self) -> None:
        before = {rid: len(session.state.output_ids) for rid, session in self.group.sessions.items()}
        t0 = time.perf_counter()
        try:
            results = self.group.round()
        except Exception as exc:  # the engine failed: find out whether one request is to blame
            if isinstance(exc, JobTimeoutException):  # RQ's hard limit, not the engine's fault
                raise
            self._isolate(exc)
            return
        round_s = time.perf_counter() - t0
        now = time.monotonic()
        for rid, n in before.items():
            if n == 0:  # in its prefill (a piece, or waiting for one)
                self.owned[rid].waited += round_s
        for rid, state in results:
            owned = self.owned[rid]
            self._observe_latency(before[rid], state, round_s, owned.waited)
            if state.finished:
                self.pending_counts.observe("request_duration_seconds", state.metrics.decode_seconds)
                payload = result_payload(self.engine, rid, state, self.runtime.worker_id)
                written = self._settle(rid, RequestState.COMPLETED, payload, state)
                self.summary["completed" if written else "lost"] += 1
            elif state is not owned.written and (  # a prompt's early pieces change nothing to write
                len(state.output_ids) - len(owned.written.output_ids) >= self.config.checkpoint_tokens
                or now - owned.written_at >= self.config.checkpoint_seconds
            ):
                payload = checkpoint.encode(state, self.fingerprint, self.numerics)
                t_write = time.perf_counter()
                with self._redis_time():
                    written = self.store.checkpoint(
                        owned.lease, payload, self._deltas(owned.written, state), LEASE_TTL_MS
                    )
                # Counted with the next write (this one's latency is known only now).
                self.pending_counts.add(Counter.CHECKPOINT_WRITES)
                self.pending_counts.observe("checkpoint_write_seconds", time.perf_counter() - t_write)
                if written:
                    owned.written, owned.written_at = state, now
                else:
                    self.store.count(Counter.FENCED_WRITES_REFUSED)  # a zombie is worth an operator's attention
                    self._forget(rid)
        if self.serves_sync:
            with self._redis_time():
                sync.announce(self.store.client, self.store.batch_id, [rid for rid, _ in results])
        if now - self._last_renew >= HEARTBEAT_S:
            # Also renewed by the worker's heartbeat thread; this covers a job run by
            # a plain RQ worker, which has none.
            self.runtime.renew_all(LEASE_TTL_MS)
            self._last_renew = now

    def _observe_latency(self, n_before: int, state: DecodeState, round_s: float, waited: float) -> None:
        """The prefill's last round gives the time to first token (every round since
        the request joined); later rounds give each token they emitted the round's
        time divided among them. With batching, a round's time is that of the
        shared forward."""
        n_after = len(state.output_ids)
        if n_before == 0:
            if n_after or state.finished:
                self.pending_counts.observe("time_to_first_token_seconds", waited)
        elif n_after > n_before:
            n_new = n_after - n_before
            self.pending_counts.observe("inter_token_latency_seconds", round_s / n_new, n_new)

    def _isolate(self, exc: Exception) -> None:
        """Re-run the failed round one request at a time. A request whose own round
        fails is retried (from its last checkpoint) up to MAX_ATTEMPTS times, then
        fails with the error, so a prompt that crashes the model cannot block the
        batch; the others go on. If every request passes alone, the failure was the
        worker's (memory, say): re-raise, and the job hands everything back."""
        states = {rid: self.group.drop(rid) for rid in list(self.group.sessions)}
        blamed = False
        for rid, state in states.items():
            try:
                # Its own round, a whole prefill (every piece) if it was in one.
                self.engine.session(state).step()
            except Exception as solo_exc:
                if isinstance(solo_exc, JobTimeoutException):
                    raise
                blamed = True
                self._retry_or_fail(rid, solo_exc)
                continue
            self.group.add(rid, state)  # redo its round with the others
        if not blamed:
            raise exc

    def _retry_or_fail(self, rid: str, exc: Exception) -> None:
        owned = self.owned[rid]
        message = f"{exc.__class__.__name__}: {exc}"
        if self.store.bump_attempts(rid) >= MAX_ATTEMPTS:
            error = {
                "custom_id": rid,
                "line": owned.spec.get("line"),
                "reason": FailureKind.ENGINE_ERROR,
                "message": message,
            }
            self.pending_counts.add(Counter.FAILED_ENGINE_ERROR)
            self._settle(rid, RequestState.FAILED, json.dumps(error, ensure_ascii=False), owned.written)
            self.summary["failed"] += 1
        else:
            # Back to the front of the pending list, from its last checkpoint.
            self.pending_counts.add(Counter.RETRIES)
            self._settle(rid, RequestState.QUEUED, "", owned.written)
            self.summary["retried"] += 1

    def _kv_held(self) -> int:
        return sum(self.engine.kv_bytes(session.state) for session in self.group.sessions.values())

    def _fill(self) -> None:
        while len(self.group) < self.config.batch_size:
            if self.group and self._kv_held() + self._kv_wanted > self.kv_budget:
                return
            with self._redis_time():
                lease = self.store.claim(self.runtime.worker_id, LEASE_TTL_MS)
            if lease is None:
                return
            self.runtime.hold(self.store, lease)
            rid = lease.request_id
            self._claimed[rid] = lease
            saved = self.store.checkpoint_of(rid)
            try:
                spec = self.store.spec(rid)
                if saved is not None:
                    try:
                        state = checkpoint.decode(saved, self.fingerprint, self.numerics)
                    except checkpoint.NumericsChanged as exc:
                        # Started again from its prompt (the batch's generated tokens keep
                        # counting the first attempt's: they were generated).
                        log.warning("request %s: %s (%d tokens to redo)", rid, exc, len(exc.state.output_ids))
                        saved = None
                if saved is None:
                    state = self.engine.start(GenerationRequest.from_dict(spec["request"]))
                need = self.engine.kv_bytes(state)
            except (SpecqError, KeyError, TypeError, ValueError, AttributeError) as exc:
                # A record the worker cannot read (corrupt, or written by hand into
                # Redis) fails that request alone; it must not fail the worker.
                reason = (
                    FailureKind.CHECKPOINT
                    if isinstance(exc, checkpoint.CheckpointError)
                    else FailureKind.INVALID_REQUEST
                )
                message = str(exc) if isinstance(exc, SpecqError) else f"unreadable request record ({exc!r})"
                self._fail(lease, reason, message)
                del self._claimed[rid]
                continue
            if self.group and self._kv_held() + need > self.kv_budget:
                # No room beside the others: back to the front of the pending list,
                # untouched, until enough of the caches decoding now are freed.
                with self._redis_time():
                    self.store.settle(lease, RequestState.QUEUED, "", {})
                del self._claimed[rid]
                self.runtime.release(self.store.batch_id, rid)
                self._kv_wanted = need
                return
            self._kv_wanted = 0
            if need > self.kv_budget:
                log.warning(
                    "request %s needs %d bytes of KV cache, more than the budget of %d (--kv-memory): "
                    "decoding it alone",
                    rid,
                    need,
                    self.kv_budget,
                )
            if saved is not None:
                # Resuming re-runs a prefill over everything committed but the last token.
                self.pending_counts.add(Counter.RECOMPUTED_TOKENS, len(state.all_ids) - 1)
            if self.degraded:
                self.pending_counts.add(Counter.PROPOSER_FALLBACKS)
            self.owned[rid] = Owned(lease, spec, state, time.monotonic())
            del self._claimed[rid]
            try:
                self.group.add(rid, state)  # a resumed state re-runs one prefill here
            except Exception as exc:
                if isinstance(exc, JobTimeoutException):
                    raise
                self._retry_or_fail(rid, exc)

    def _check_in(self) -> bool:
        """Once per FLAG_CHECK_S, not every round (a small model's rounds take a few
        milliseconds, and a Redis round trip each would be a large share of them):
        let go of requests paused or cancelled; say whether this synchronous batch's
        decode group has room; or ask whether this ordinary batch should yield to a
        synchronous request. Returns whether to yield."""
        now = time.monotonic()
        if not self.owned or now - self._last_check_in < FLAG_CHECK_S:
            return False
        self._last_check_in = now
        yielding = False
        with self._redis_time():
            flags = self.store.flags(list(self.owned))
            if self.serves_sync:
                has_room = len(self.group) < self.config.batch_size
                sync.mark_room(self.store.client, self.serves_sync, self.runtime.worker_id, has_room)
            elif self.yields_to_sync:
                yielding = sync.should_yield(self.store.client, self.yields_to_sync, self.runtime.worker_id)
        for rid, flag in flags.items():
            if flag in (Flag.PAUSED, Flag.CANCELLED):
                self.summary["released" if self._let_go(rid, flag) else "lost"] += 1
        return yielding

    def _drop_lost(self) -> None:
        for rid in list(self.owned):
            if self.runtime.is_lost(self.store.batch_id, rid):
                self._forget(rid)

    def _let_go(self, rid: str, new_state: str, *, write_progress: bool = True) -> bool:
        owned = self.owned[rid]
        state = self.group.drop(rid) if rid in self.group.sessions else owned.written
        if not write_progress:
            state = owned.written
        payload = checkpoint.encode(state, self.fingerprint, self.numerics) if state.output_ids else ""
        return self._settle(rid, new_state, payload, state)

    def _settle(self, rid: str, new_state: str, payload: str, state: DecodeState) -> bool:
        """False when the write was refused: another worker owns the request now. The
        request stays owned until Redis has answered, so that an outage can replay it."""
        owned = self.owned[rid]
        owned.settling = (new_state, payload, state)
        if rid in self.group.sessions:
            self.group.drop(rid)
        deltas = self._deltas(owned.written, state)
        if new_state == RequestState.COMPLETED:
            deltas[Counter.COMPLETED_TOKENS] = len(state.output_ids)  # status estimates time left from it
        with self._redis_time():
            written = self.store.settle(owned.lease, new_state, payload, deltas)
        del self.owned[rid]
        if not written:
            self.store.count(Counter.FENCED_WRITES_REFUSED)
        self.runtime.release(self.store.batch_id, rid)
        return written

    def _fail(self, lease: Lease, reason: str, message: str) -> None:
        error = {"custom_id": lease.request_id, "reason": reason, "message": message}
        spec_line = self.store.spec_line(lease.request_id)
        if spec_line is not None:
            error["line"] = spec_line
        self.store.settle(
            lease, RequestState.FAILED, json.dumps(error, ensure_ascii=False), {Counter.failed(reason): 1}
        )
        self.runtime.release(self.store.batch_id, lease.request_id)
        self.summary["failed"] += 1

    def _forget(self, rid: str) -> None:
        """Another worker owns the request now: stop decoding it, write nothing."""
        self.owned.pop(rid)
        if rid in self.group.sessions:
            self.group.drop(rid)
        self.runtime.release(self.store.batch_id, rid)
        self.summary["lost"] += 1

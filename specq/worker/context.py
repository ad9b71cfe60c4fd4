"""What a worker process keeps between jobs: the engines it has loaded (a model is
loaded once per process), its identity, its stop flag, and the leases it holds, which
its heartbeat thread renews while the decode loop runs.

RQ calls the job function by name, so the job reaches this through `current()`; the
worker installs one at start. Outside a specq worker (a plain `rq worker`), a
default one is made on first use, without a heartbeat thread: leases then last only
as long as the decode loop's own renewals keep them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import redis

from specq.errors import ModelFileError, SpecqError
from specq.queue.store import BatchStore, Lease
from specq.requests.checkpoint import fingerprint
from specq.requests.config import BatchConfig
from specq.specdec.draft_costs import MeasuredCosts
from specq.specdec.engine import Engine
from specq.specdec.gguf_file import file_sha256
from specq.worker.breaker import Breaker
from specq.worker.guarded_proposer import GuardedProposer

log = logging.getLogger("specq.worker")


@dataclass(frozen=True)
class LoadedEngine:
    engine: Engine
    fingerprint: str
    # Why this worker decodes without the batch's proposer ("" when it has it).
    degraded: str = ""
    guard: GuardedProposer | None = None  # counts drafting failures during decoding


def new_worker_id() -> str:
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


class WorkerContext:
    def __init__(self, worker_id: str | None = None, client: redis.Redis | None = None) -> None:
        self.worker_id = worker_id or new_worker_id()
        self.client = client  # for specq's own reads and writes; None: the job's connection
        self.queues: frozenset[str] = frozenset()  # what this process's RQ worker listens on
        self.stop_requested = threading.Event()
        self.engine_changed = False  # specq's sources changed under this process (Heartbeat)
        self._engines: dict[tuple[str, ...], LoadedEngine] = {}
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], tuple[BatchStore, Lease]] = {}
        self._lost: set[tuple[str, str]] = set()
        self.jobs_done = 0
        self.breaker = Breaker()

    # --- engines -------------------------------------------------------------
    def engine_for(self, config: BatchConfig) -> LoadedEngine:
        key = config.engine_key()
        if key not in self._engines:
            self._engines[key] = load_for_batch(config)
        return self._engines[key]

    # --- leases (shared with the heartbeat thread) ----------------------------
    def hold(self, store: BatchStore, lease: Lease) -> None:
        with self._lock:
            self._held[(store.batch_id, lease.request_id)] = (store, lease)
            self._lost.discard((store.batch_id, lease.request_id))

    def release(self, batch_id: str, request_id: str) -> None:
        with self._lock:
            self._held.pop((batch_id, request_id), None)
            self._lost.discard((batch_id, request_id))

    def held(self) -> list[tuple[BatchStore, Lease]]:
        with self._lock:
            return list(self._held.values())

    def mark_lost(self, batch_id: str, request_id: str) -> None:
        with self._lock:
            if (batch_id, request_id) in self._held:
                self._lost.add((batch_id, request_id))

    def is_lost(self, batch_id: str, request_id: str) -> bool:
        with self._lock:
            return (batch_id, request_id) in self._lost

    def renew_all(self, ttl_ms: int) -> int:
        """Renew every held lease; a lease found lost (this process stalled and the
        request was taken over) is marked so the decode loop drops the request."""
        by_store: dict[int, tuple[BatchStore, list[Lease]]] = {}
        for store, lease in self.held():
            by_store.setdefault(id(store), (store, []))[1].append(lease)
        lost = 0
        for store, leases in by_store.values():
            for lease, ok in zip(leases, store.renew(leases, ttl_ms)):
                if not ok:
                    self.mark_lost(store.batch_id, lease.request_id)
                    lost += 1
        return lost


def load_for_batch(config: BatchConfig) -> LoadedEngine:
    """Load the batch's model, at its precision, and proposer; refuse a model file
    that is not the one the batch was submitted with. A proposer that cannot be loaded
    here (a missing or corrupt heads file, a broken draft model) degrades to plain
    decoding: slower, and still exact, since the target model alone decides every token."""
    from specq.queue.connection import model_cache_dir
    from specq.specdec.loader import default_model_path, load_model_and_tokenizer, make_proposer, shipped_heads_for
    from specq.specdec.proposers.none import NoProposer

    if config.precision != "f32":
        from specq.specdec import int8

        # A CPU without the instructions refuses before reading the weights; like a
        # model file that differs, that is this worker's fault, not the requests'.
        int8.require()
    # Every worker process of this machine maps one copy of the built weights.
    model, tokenizer = load_model_and_tokenizer(
        config.model_path or default_model_path(), config.precision, model_cache_dir()
    )
    degraded = ""
    try:
        proposer = make_proposer(
            config.proposer,
            model,
            tokenizer,
            draft_model_path=config.draft_model_path or None,
            medusa_heads_path=config.medusa_heads_path or None,
        )
    except SpecqError as exc:
        proposer, degraded = NoProposer(), f"proposer {config.proposer!r} unavailable ({exc}); decoding without it"
    guard = None if degraded or config.proposer == "none" else GuardedProposer(proposer)
    engine = Engine(model, tokenizer, guard or proposer, MeasuredCosts())
    if engine.model.fingerprint != config.model_sha256:
        raise ModelFileError(
            f"this machine's model {engine.model.path} (sha256 {engine.model.fingerprint[:12]}) is not the one "
            f"the batch was submitted with (sha256 {config.model_sha256[:12]})"
        )
    # Before any request is claimed: a first compile of the kernels (after an install
    # or an upgrade) takes minutes, and leases held through it would only wait.
    log.info("warming up the engine (the first run after an install or an upgrade compiles its kernels: minutes)")
    started = time.monotonic()
    engine.warm_up()
    if guard:
        guard.take_failures()  # logged; they were no request's, and the batch's metrics count requests'
    log.info(
        "engine ready at %s: its kernels compiled or loaded in %.1f s", config.precision, time.monotonic() - started
    )
    # From the batch's configuration, not from what loaded: a degraded worker may
    # resume the batch's checkpoints (greedy output stays identical; seeded sampling
    # keeps the target's distribution but draws other tokens without the drafts).
    proposer_file = config.draft_model_path or config.medusa_heads_path
    if not proposer_file and config.proposer in ("medusa", "hybrid"):
        proposer_file = shipped_heads_for(config.model_sha256) or ""
    file_sha = file_sha256(proposer_file) if proposer_file and os.path.isfile(proposer_file) else proposer_file
    return LoadedEngine(engine, fingerprint(config.model_sha256, config.proposer, file_sha), degraded, guard)


_current: WorkerContext | None = None


def install(runtime: WorkerContext) -> None:
    global _current
    _current = runtime


def current() -> WorkerContext:
    global _current
    if _current is None:
        _current = WorkerContext()
    return _current

"""Worker processes: RQ's non-forking SimpleWorker (the model is loaded once per
process and stays loaded between jobs), a heartbeat thread (lease renewal, liveness,
the reaper), signal handling that hands work back at the next round, and a
supervisor for N processes on one machine."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import SimpleWorker
from rq.exceptions import StopRequested

from specq.errors import ParameterError, SpecqError
from specq.queue import keys
from specq.queue.connection import RedisUnavailable
from specq.queue.control import reap_all, sweep
from specq.queue.liveness import fresh_workers, worker_is_alive
from specq.queue.rq_glue import listened_queues, make_queue
from specq.queue.server_checks import require_noeviction
from specq.queue.status import read_batch
from specq.queue.store import BatchStore, _text
from specq.queue.timing import HEARTBEAT_S, LEASE_TTL_MS, WORKER_ALIVE_S
from specq.queue.vocabulary import Flag, RequestState
from specq.specdec import kernel_cache
from specq.worker import context as context_mod
from specq.worker.context import WorkerContext
from specq.worker.job import SpecqJob

# specq's own calls (checkpoints, leases, the reaper) are short: a Redis cut off by
# the network must not hold one for minutes (RQ gives its connections 415 s, for its
# blocking dequeue), so the decode loop notices within a fraction of a lease.
STORE_SOCKET_TIMEOUT_S = max(0.5, min(5.0, LEASE_TTL_MS / 1000 / 4))
# RQ's worker TTL sets its blocking dequeue (TTL - 15 s) and its socket timeout (TTL
# - 5 s): 60 s bounds how long a worker idles on a connection that a partition cut.
RQ_WORKER_TTL_S = 60
# How often the thread that listens for RQ's worker commands wakes: the longest a
# teardown waits for it (SpecqWorker.subscribe).
PUBSUB_POLL_S = 1.0

log = logging.getLogger("specq.worker")


class EngineChanged(SpecqError):
    """The engine's sources changed on disk under a running worker (an upgrade in
    place): it handed its work back and stopped, so that a new process runs the new
    code (kernel_cache says why an old one must not run on)."""


class SpecqWorker(SimpleWorker):
    """On SIGTERM or SIGINT, the running job hands its requests back (checkpointed)
    at the next round, then RQ's warm shutdown ends the worker; a second signal
    stops it at once. `docker stop` allows 10 s: one round is well within that. A
    job that loads its batch's model first warms it up (context.load_for_batch),
    which a first signal does not cut short: a first compile takes minutes, and
    holds no request."""

    def __init__(self, *args, runtime: WorkerContext, **kwargs) -> None:
        super().__init__(*args, job_class=SpecqJob, worker_ttl=RQ_WORKER_TTL_S, **kwargs)
        self.runtime = runtime

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self._stop_signal)
        signal.signal(signal.SIGTERM, self._stop_signal)

    def _stop_signal(self, signum: int, frame: FrameType | None) -> None:
        self.runtime.stop_requested.set()
        self.request_stop(signum, frame)

    def subscribe(self) -> None:
        """RQ's subscription to this worker's command channel, its listening thread
        polling every second instead of every 60. Once the subscription is gone (an
        unsubscribe, or a Redis restart that dropped it) the thread waits a whole
        poll for it to come back, and RQ's teardown joins that thread with no time
        limit (redis-py 8's `PubSubWorkerThread.stop`): a worker asked to stop after
        Redis had restarted hung up to 60 s, past any `docker stop` grace (a stack
        dump of such a worker: the main thread in `stop`'s join, the thread in
        `get_message`'s wait)."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )


class Heartbeat(threading.Thread):
    """Renews this process's leases, records it as alive, and runs the reaper; a
    Redis outage is logged and retried, never fatal."""

    def __init__(self, client: redis.Redis, runtime: WorkerContext, queues: Sequence[str]) -> None:
        super().__init__(name="specq-heartbeat", daemon=True)
        self.client = client
        self.runtime = runtime
        self.queues = list(queues)
        self.stopped = threading.Event()
        self._leaving = threading.Lock()  # no SIGTERM of ours once run_worker's handlers are gone

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.stop_if_engine_changed()
                self.beat()
            except (redis.RedisError, OSError) as exc:
                log.warning("heartbeat failed (%s); retrying", exc.__class__.__name__)
            except Exception:  # noqa: BLE001 - this thread keeps the leases alive: it must not die
                log.exception("heartbeat failed; retrying")
            self.stopped.wait(HEARTBEAT_S)

    def stop_if_engine_changed(self) -> None:
        """A SIGTERM to this process once the engine's sources changed: the same
        handback as `kill`, at the next round. Checked here, every beat, so that an
        idle worker, or one in a long job, stops too."""
        if self.runtime.engine_changed or not kernel_cache.changed_since_import():
            return
        with self._leaving:
            if self.stopped.is_set():
                return
            self.runtime.engine_changed = True
            log.error("specq's engine changed on disk since this worker started: handing work back and stopping")
            os.kill(os.getpid(), signal.SIGTERM)

    def beat(self) -> None:
        now = time.time()
        self.runtime.renew_all(LEASE_TTL_MS)
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(keys.WORKERS, {self.runtime.worker_id: now})
        pipe.hset(
            keys.worker(self.runtime.worker_id),
            mapping={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "queues": ",".join(self.queues),
                "beat": f"{now:.3f}",
                "jobs_done": self.runtime.jobs_done,
                "held": len(self.runtime.held()),
                "breaker": self.runtime.breaker.state,
                "last_error": self.runtime.breaker.last_error[:500],
            },
        )
        pipe.expire(keys.worker(self.runtime.worker_id), int(WORKER_ALIVE_S * 4))
        # Forget workers silent for an hour, so the set does not grow forever.
        pipe.zremrangebyscore(keys.WORKERS, "-inf", now - 3600)
        pipe.execute()
        reap_all(self.client)

    def leave(self) -> None:
        with self._leaving:
            self.stopped.set()
        try:
            self.client.zrem(keys.WORKERS, self.runtime.worker_id)
            self.client.delete(keys.worker(self.runtime.worker_id))
        except (redis.RedisError, OSError):
            pass


def run_worker(client: redis.Redis, queues: Sequence[str], *, burst: bool = False) -> bool:
    """Work until stopped (or, with burst, until nothing of the queues is left to
    do). A Redis outage (a restart, a failover, a partition) ends RQ's work loop;
    this one waits with backoff for Redis to answer again and starts a new one,
    keeping the loaded model. A refused password ends it with RedisUnavailable, and
    an upgrade of specq under it with EngineChanged, once its work is handed back."""
    store_client = with_socket_timeout(client, STORE_SOCKET_TIMEOUT_S)
    runtime = WorkerContext(client=store_client)
    queues = listened_queues(list(queues))
    runtime.queues = frozenset(queues)
    context_mod.install(runtime)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    _stop_on_signals(runtime)
    heartbeat = Heartbeat(store_client, runtime, queues)
    try:
        worked = _work(client, store_client, runtime, heartbeat, queues, burst)
    finally:
        heartbeat.leave()
        for sig, handler in previous.items():  # an embedding program gets its handlers back
            signal.signal(sig, handler)
    if runtime.engine_changed:
        raise EngineChanged(
            "specq's engine changed on disk since this worker started (an upgrade?): "
            "its work is handed back; start the worker again to run the new code"
        )
    return worked


def _show_specq_log(level: str) -> None:
    """specq's own lines (the engine's warm-up, warnings) at RQ's level and in its
    format, on stderr, unless the program set up logging itself. Without a handler
    Python shows warnings only, and a first compile would pass in silence."""
    if not isinstance(logging.getLevelName(level.upper()), int):
        raise ParameterError(f"SPECQ_LOG_LEVEL must be a logging level (DEBUG, INFO, WARNING, ERROR), got {level!r}")
    logger = logging.getLogger("specq")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())


def _work(
    client: redis.Redis,
    store_client: redis.Redis,
    runtime: WorkerContext,
    heartbeat: Heartbeat,
    queues: list[str],
    burst: bool,
) -> bool:
    """run_worker's loop: one RQ work loop after another, across Redis outages."""
    worked = False
    level = os.environ.get("SPECQ_LOG_LEVEL", "INFO")
    _show_specq_log(level)
    _wait_for_redis(store_client, runtime)
    if runtime.stop_requested.is_set():
        return worked
    require_noeviction(store_client)
    heartbeat.start()
    for attempt in itertools.count():
        if runtime.stop_requested.is_set():  # a signal while Redis was away
            return worked
        worker = SpecqWorker(
            [make_queue(client, q, SpecqJob) for q in queues],
            connection=client,
            name=f"{runtime.worker_id}.{attempt}",  # RQ refuses a name whose last life did not end cleanly
            serializer=make_queue(client, queues[0], SpecqJob).serializer,
            runtime=runtime,
        )
        try:
            worked |= worker.work(burst=burst, logging_level=level)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("lost Redis (%s)", exc.__class__.__name__)
        except StopRequested:
            # A signal while RQ tears its loop down (after a burst, say): RQ's own
            # handler raises there, outside the loop that would catch it.
            runtime.stop_requested.set()
        _stop_on_signals(runtime)  # RQ's handlers assume its loop is running
        if runtime.stop_requested.is_set():
            return worked
        if _redis_answers(store_client) and burst:
            try:
                left = burst_work_left(store_client, queues)
            except (redis.ConnectionError, redis.TimeoutError):
                left = True  # Redis went away again: look once it is back
            if not left:
                return worked
            runtime.stop_requested.wait(HEARTBEAT_S)
        _wait_for_redis(store_client, runtime)
    return worked


def with_socket_timeout(client: redis.Redis, seconds: float) -> redis.Redis:
    """A client on its own connection pool, like `client`'s but with this socket timeout."""
    pool = client.connection_pool
    # One immediate retry (a connection the server closed while idle), not redis-py's
    # default three with backoff: those would stretch a cut-off call to seconds.
    kwargs = {**pool.connection_kwargs, "socket_timeout": seconds, "retry": Retry(NoBackoff(), 1)}
    if "path" not in kwargs:  # TCP (a Unix socket has no keepalive)
        kwargs["socket_keepalive"] = True
    return redis.Redis(connection_pool=pool.__class__(connection_class=pool.connection_class, **kwargs))


def burst_work_left(client: redis.Redis, queues: Sequence[str]) -> bool:
    """Whether a burst worker on these queues must go on: a batch of theirs has
    claimable requests, or running requests whose owner is dead (their leases
    expire within a TTL and they come back). Requests that a live worker decodes
    are that worker's. Runs a reaper pass over those batches first (no lock: the
    scripts are atomic and a spare job is harmless), so work re-queued meanwhile
    has a job."""
    wanted = set(queues)
    mine = [
        b
        for b in (_text(x) for x in client.zrange(keys.BATCHES, 0, -1))
        if (_text(client.hget(keys.BatchKeys(b).meta, "queue")) or "") in wanted
    ]
    sweep(client, mine)
    fresh = fresh_workers(client)
    for batch_id in mine:
        try:
            record = read_batch(client, batch_id)
        except SpecqError:
            continue  # damaged or gone: no worker can do its work (status says what is wrong)
        if record.counts[RequestState.QUEUED] and not set(record.flags) & set(Flag):
            return True
        store = BatchStore(client, batch_id)
        for rid in store.running():
            lease = _text(client.get(store.keys.lease(rid)))
            if lease is None or not worker_is_alive(lease.rsplit("#", 1)[0], fresh):
                return True
    return any(make_queue(client, q).count for q in queues)


def check_health(client: redis.Redis, host: str | None = None) -> tuple[bool, str]:
    """For a container's health check: healthy when some worker process on this host
    has a fresh heartbeat and none has its circuit breaker open."""
    host = host or socket.gethostname()
    now = time.time()
    mine = []
    for raw in client.zrangebyscore(keys.WORKERS, "-inf", "+inf"):
        info = {k.decode(): v.decode() for k, v in client.hgetall(keys.worker(raw.decode())).items()}
        if info.get("host") == host:
            mine.append(info)
    fresh = [w for w in mine if now - float(w.get("beat", 0)) <= WORKER_ALIVE_S]
    if not fresh:
        return False, f"no worker on {host} has a heartbeat from the last {WORKER_ALIVE_S:.0f}s"
    sick = [w for w in fresh if w.get("breaker") == "open"]
    if sick:
        return False, f"circuit breaker open on {host} (pid {sick[0].get('pid')}): {sick[0].get('last_error', '')}"
    return True, f"{len(fresh)} worker process(es) on {host} healthy"


def _stop_on_signals(runtime: WorkerContext) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        runtime.stop_requested.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _redis_answers(client: redis.Redis) -> bool:
    """False while Redis cannot be reached; a refused password raises instead: it
    will not mend itself by waiting."""
    try:
        return bool(client.ping())
    except redis.AuthenticationError:
        raise RedisUnavailable(
            f"Redis at {_where(client)} refused the password (check the URL or SPECQ_REDIS_URL)"
        ) from None
    except redis.ResponseError as exc:
        if "AUTH" in str(exc).upper():
            raise RedisUnavailable(f"Redis at {_where(client)} refused the credentials: {exc}") from None
        return False
    except (redis.RedisError, OSError):
        return False


def _where(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"


def _wait_for_redis(client: redis.Redis, runtime: WorkerContext, max_wait_s: float = 5.0) -> None:
    delay = 0.5
    while not _redis_answers(client):
        if runtime.stop_requested.is_set():
            return
        log.warning("Redis at %s does not answer; retrying in %.1fs", _where(client), delay)
        runtime.stop_requested.wait(delay)
        delay = min(delay * 2, max_wait_s)


class Supervisor:
    """N `specq worker` child processes on this machine. A child that dies is
    restarted (the reaper hands its requests to the others meanwhile), unless it
    keeps dying right after it starts. On stop(), children get SIGTERM and hand
    their work back."""

    RESTART_WINDOW_S = 20.0
    MAX_QUICK_DEATHS = 3

    def __init__(self, argv: list[str], n: int, *, restart: bool, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.n = n
        self.restart = restart
        self.env = threads_per_process(dict(os.environ if env is None else env), n)
        self.children: list[tuple[subprocess.Popen, float]] = []
        self.quick_deaths = 0
        self.stopping = False

    def start(self) -> None:
        self.children = [self._spawn() for _ in range(self.n)]

    def _spawn(self) -> tuple[subprocess.Popen, float]:
        return subprocess.Popen(self.argv, env=self.env), time.monotonic()

    def poll(self) -> list[int]:
        """Restart dead children (when allowed); returns the exit codes seen."""
        codes = []
        alive = []
        for proc, started in self.children:
            code = proc.poll()
            if code is None:
                alive.append((proc, started))
                continue
            codes.append(code)
            if self.stopping or not self.restart:
                continue
            self.quick_deaths = self.quick_deaths + 1 if time.monotonic() - started < self.RESTART_WINDOW_S else 0
            if self.quick_deaths < self.MAX_QUICK_DEATHS:
                log.warning("worker process %d exited with %d; restarting it", proc.pid, code)
                alive.append(self._spawn())
            else:
                log.error("worker processes keep exiting right after they start; not restarting")
        self.children = alive
        return codes

    def running(self) -> int:
        return len(self.children)

    def signal_stop(self) -> None:
        """SIGTERM to every child, without waiting: they hand their work back and exit
        while the caller does something else (stop() then waits)."""
        self.stopping = True
        for proc, _ in self.children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> None:
        self.signal_stop()
        deadline = time.monotonic() + timeout
        for proc, _ in self.children:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.children = []


THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def threads_per_process(env: dict[str, str], n_processes: int) -> dict[str, str]:
    """Share the cores among the processes: a kernel's threads must all be running at
    once, and with more threads than cores every product waits for the scheduler
    (measured: a 2-thread numba product of a small matrix took 8 ms instead of 5 us
    while another process kept both cores busy). Variables the user set are kept."""
    per = str(max(1, (os.cpu_count() or 1) // n_processes))
    return {**{v: per for v in THREAD_VARIABLES}, **env}


def worker_argv(queues: Sequence[str], *, burst: bool) -> list[str]:
    """The child's command line; the Redis URL goes in its environment instead, where
    `ps` does not show a password."""
    argv = [sys.executable, "-m", "specq", "worker"]
    for q in queues:
        argv += ["--queue", q]
    if burst:
        argv.append("--burst")
    return argv

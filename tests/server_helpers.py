"""Running `specq serve` as a user does: a real process on a loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request

from queue_helpers import wait_until

KEY = "test-key-" + "x" * 24


def get(url: str) -> tuple[int, str]:
    """(status, body) of a plain GET, with no API key."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env: dict[str, str], model_path: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """(process, base URL) of a `specq serve` that answers /health."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specq", "serve", "--port", str(port), "--model", model_path, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"specq serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            return get(url + "/health")[0] == 200
        except OSError:
            return False

    wait_until(up, 60, "the server to answer /health")
    return proc, url

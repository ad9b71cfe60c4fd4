"""Helpers for the queue tests: prompt files, the CLI and worker processes as real
processes, and waiting for a condition with a deadline."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def write_prompts(path: Path, n: int, **fields) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"custom_id": f"r{i:03d}", "prompt": f"story {i} " * (1 + i % 4), **fields}) + "\n")
    return path


def specq(args: list[str], env: dict[str, str], *, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a real process."""
    proc = subprocess.run([sys.executable, "-m", "specq", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"specq {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def start_worker(env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specq", "worker", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout)


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")

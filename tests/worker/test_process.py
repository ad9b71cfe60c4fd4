"""Pieces of the worker shell that need no Redis."""

from __future__ import annotations

import os

from specq.worker.process import THREAD_VARIABLES, threads_per_process


def test_cores_are_shared_among_worker_processes(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    env = threads_per_process({"PATH": "/bin"}, 4)
    assert {v: env[v] for v in THREAD_VARIABLES} == {v: "2" for v in THREAD_VARIABLES}
    assert env["PATH"] == "/bin"
    assert threads_per_process({}, 16)["NUMBA_NUM_THREADS"] == "1"  # never zero


def test_thread_counts_the_user_chose_are_kept(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    env = threads_per_process({"OMP_NUM_THREADS": "3"}, 2)
    assert env["OMP_NUM_THREADS"] == "3" and env["NUMBA_NUM_THREADS"] == "4"

"""Pieces of the worker shell, on their own (a real Redis where one is needed)."""

from __future__ import annotations

import os

import pytest

from specq.errors import ParameterError
from specq.worker.process import THREAD_VARIABLES, _show_specq_log, threads_per_process


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


def test_a_worker_whose_subscription_is_gone_tears_down_at_once(client):
    """Once the command channel's subscription is gone (as after a Redis restart),
    RQ's listening thread waits a poll for it, and RQ's teardown joins that thread
    with no limit: with RQ's 60 s poll a worker asked to stop hung up to a minute."""
    import time

    from specq.queue.rq_glue import make_queue
    from specq.worker.context import WorkerContext
    from specq.worker.job import SpecqJob
    from specq.worker.process import SpecqWorker

    worker = SpecqWorker([make_queue(client, "q", SpecqJob)], connection=client, runtime=WorkerContext("w"))
    worker.subscribe()
    time.sleep(0.3)  # the thread listens
    worker.pubsub.unsubscribe()
    time.sleep(0.5)  # it reads the confirmation, then waits for a subscription
    assert not worker.pubsub.subscribed and worker.pubsub_thread.is_alive()
    t0 = time.monotonic()
    worker.unsubscribe()
    assert time.monotonic() - t0 < 5
    assert not worker.pubsub_thread.is_alive()


def test_an_unknown_log_level_is_one_clear_error():
    with pytest.raises(ParameterError, match="SPECQ_LOG_LEVEL.*'verbose'"):
        _show_specq_log("verbose")

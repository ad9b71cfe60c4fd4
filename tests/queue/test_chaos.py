"""The short chaos run (specq/testing/chaos.py): under a minute of worker SIGKILLs at uniformly
random times from process start, SIGSTOPs past the lease and Redis SIGKILLed and
restarted, over mixed greedy and seeded-sampling requests. scripts/chaos.py runs
the long one."""

from __future__ import annotations

import pytest

from specq.testing.chaos import Chaos, ChaosConfig


@pytest.mark.slow
def test_random_faults_lose_nothing_and_change_no_output(tmp_path):
    config = ChaosConfig(
        requests=40,
        min_requests=80,
        minutes=0.75,
        workers=3,
        worker_life_s=8.0,
        stop_every_s=10.0,
        redis_kill_every_s=12.0,
        deadline_minutes=8.0,
        seed=13,
    )
    report = Chaos(tmp_path, config).run()
    print(report)
    assert report["faults"]["sigkill"] >= 3 and report["faults"]["redis_kill"] >= 1, report
    assert report["lost"] == report["not_completed"] == report["mismatched_outputs"] == 0, report
    # Tokens are counted only by accepted fenced writes (and Redis fsyncs each one):
    # a request finished twice, or a zombie's write accepted, would show here.
    assert report["tokens_counted_minus_results"] == 0, report
    assert report["held_never_recovered"] == 0, report

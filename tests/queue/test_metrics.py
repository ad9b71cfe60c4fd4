"""The Prometheus endpoint, served by `specq metrics` as a real process and parsed
with prometheus_client's own parser, against a known small batch: drafts, accepted
tokens, per-position counts, resumes after a crash and after a preemption."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from queue_helpers import N_REQUESTS, setup_batch, stop_after_rounds, stop_process, wait_until

from specq.worker.batch_runner import BatchRunner
from specq.worker.context import WorkerContext


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


@pytest.mark.slow
def test_metrics_match_a_known_batch_with_a_crash_and_a_preemption(client, queue_env, tmp_path, long_model_path):
    store, config, loaded, alone = setup_batch(client, tmp_path, long_model_path, temperature=0.8)
    # A worker is preempted (SIGTERM) after 2 rounds: its requests are handed back.
    preempted = BatchRunner(store, config, loaded, WorkerContext("p"), deadline=time.monotonic() + 600)
    stop_after_rounds(preempted, 2)
    preempted.run()
    handed_back = preempted.summary["handed_back"]
    # Another one crashes after a few rounds: its leases expire and the reaper resumes them.
    crashed = BatchRunner(store, config, loaded, WorkerContext("c"), deadline=time.monotonic() + 600)
    crashed._fill()
    for _ in range(6):
        crashed._round()
    held = list(crashed.owned)
    for rid in held:
        client.delete(store.keys.lease(rid))
        assert store.reap(rid, max_attempts=3) == 1
    BatchRunner(store, config, loaded, WorkerContext("ok"), deadline=time.monotonic() + 600).run()
    results = [json.loads(r) for r in store.results(store.request_ids())]
    assert len(results) == N_REQUESTS

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "specq", "metrics", "--port", str(port)],
        env=queue_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _answers(port), 60, "the metrics endpoint")
        m = scrape(port)
    finally:
        stop_process(server)
    labels = (("model", os.path.basename(long_model_path)), ("proposer", "ngram"))
    model = dict(labels)["model"]
    assert any(k[1] and dict(k[1]).get("model") == model for k in m), f"no series for {model}: {sorted(m)[:5]}"

    def value(name, **extra):
        return m[(name, tuple(sorted({**dict(labels), **extra}.items())))]

    metrics = [r["metrics"] for r in results]
    assert value("specq_spec_decode_num_draft_tokens_total") == sum(x["drafted"] for x in metrics) > 0
    assert value("specq_spec_decode_num_accepted_tokens_total") == sum(x["accepted"] for x in metrics)
    assert value("specq_spec_decode_num_drafts_total") == sum(
        x["drafted_per_position"][0] for x in metrics if x["drafted_per_position"]
    )
    width = max(len(x["accepted_per_position"]) for x in metrics)
    for pos in range(width):
        expected = sum(x["accepted_per_position"][pos] for x in metrics if pos < len(x["accepted_per_position"]))
        assert value("specq_spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == expected
    assert value("specq_generation_tokens_total") == sum(len(r["token_ids"]) for r in results)
    assert value("specq_resumes_total", reason="crash") == len(held) > 0
    assert value("specq_resumes_total", reason="preempt") == handed_back > 0
    assert value("specq_recomputed_tokens_total") > 0
    assert m[("specq_requests", (("queue", "unused"), ("state", "completed")))] == N_REQUESTS
    assert m[("specq_requests", (("queue", "unused"), ("state", "running")))] == 0
    assert value("specq_request_duration_seconds_count") == N_REQUESTS
    n_ttft = value("specq_time_to_first_token_seconds_count")
    assert N_REQUESTS <= n_ttft <= N_REQUESTS + len(held)  # a crash before the first checkpoint repeats a prefill
    assert value("specq_checkpoint_writes_total") == value("specq_checkpoint_write_seconds_count") > 0
    assert value("specq_fenced_writes_refused_total") == 0
    assert ("specq_workers_alive", ()) in m


def _answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
        return True
    except OSError:
        return False


def test_every_metric_the_dashboard_queries_exists(client):
    import re
    from pathlib import Path

    from specq.queue.metrics import SpecqCollector

    names = set()
    for family in SpecqCollector(client).collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + s for s in suffixes}
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana" / "specq-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"specq_[a-z_]+", target["expr"])
    }
    assert queried and queried <= names, sorted(queried - names)

"""The Prometheus view of a whole deployment, read from Redis at each scrape with
plain reads (no side effects): queue-wide figures from specq's keys, and worker
counters that every worker process adds to its batches' counters with its fenced
writes, so any number of processes on any number of machines appear.

Names follow Prometheus conventions (specq_ prefix, base units, _total counters) and
mirror vLLM's speculative-decoding metrics so existing dashboards carry over. Labels
are model, proposer, queue, state, position, reason and kind: never a job or request
id. Counters are summed over the batches Redis still holds, so deleting a batch
makes them drop; Prometheus's rate() treats a drop as a counter reset. A damaged
batch (keys lost or unreadable, see specq.queue.status) is left out of them and
counted in specq_batches_damaged, so it cannot fail a scrape.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterator

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from specq.errors import InputError
from specq.queue.histograms import BUCKETS, cumulative
from specq.queue.liveness import fresh_workers, is_stalled
from specq.queue.status import BatchDamaged, batch_ids, read_batch, workers_alive
from specq.queue.vocabulary import RESUME_COUNTERS, Counter, FailureKind

HISTOGRAM_HELP = {
    "time_to_first_token_seconds": "Seconds of a request's first (prefill) round.",
    "inter_token_latency_seconds": "Seconds per emitted token: a round's time divided among the tokens it emitted.",
    "request_duration_seconds": "Seconds of decoding per completed request (over all its workers).",
    "checkpoint_write_seconds": "Seconds per fenced checkpoint write.",
}

# (model label, proposer) -> counter name -> its sum over the batches
Sums = dict[tuple[str, str], dict[str, float]]


def model_label(model_path: str) -> str:
    return os.path.basename(model_path) if model_path else "default"


class SpecqCollector(Collector):
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def collect(self) -> Iterator:
        sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        by_state: dict[tuple[str, str], int] = defaultdict(int)
        damaged = stalled = 0
        fresh = fresh_workers(self.client)
        for batch_id in batch_ids(self.client):
            try:
                record = read_batch(self.client, batch_id)
            except InputError:
                continue  # gone since the list was read
            except BatchDamaged:
                damaged += 1  # counted, not summed: one broken batch must not fail the scrape
                continue
            labels = (model_label(record.config.get("model_path", "")), record.config.get("proposer", ""))
            for name, value in record.stats.items():
                sums[labels][name] += value
            for state, n in record.counts.items():
                by_state[(record.meta["queue"], state)] += n
            stalled += is_stalled(self.client, batch_id, fresh)
        yield from self._spec_decode(sums)
        yield from self._generation(sums)
        yield from self._reliability(sums, by_state)
        batches_damaged = GaugeMetricFamily(
            "specq_batches_damaged",
            "Batches whose keys are partly lost or unreadable (`specq status` says what is wrong); left out of "
            "every other metric.",
        )
        batches_damaged.add_metric([], damaged)
        yield batches_damaged
        batches_stalled = GaugeMetricFamily(
            "specq_batches_stalled",
            "Batches with queued requests and no live job to run them (no worker on their queue, or none alive); "
            "a running worker's reaper restores a job within seconds, so a lasting non-zero value is an alert.",
        )
        batches_stalled.add_metric([], stalled)
        yield batches_stalled

    def _spec_decode(self, sums: Sums) -> Iterator:
        drafts = CounterMetricFamily(
            "specq_spec_decode_num_drafts",
            "Rounds that verified at least one draft token.",
            labels=["model", "proposer"],
        )
        draft_tokens = CounterMetricFamily(
            "specq_spec_decode_num_draft_tokens", "Draft tokens verified.", labels=["model", "proposer"]
        )
        accepted = CounterMetricFamily(
            "specq_spec_decode_num_accepted_tokens", "Draft tokens accepted.", labels=["model", "proposer"]
        )
        per_pos = CounterMetricFamily(
            "specq_spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0 = first).",
            labels=["model", "proposer", "position"],
        )
        for (model, proposer), s in sorted(sums.items()):
            drafts.add_metric([model, proposer], s.get(Counter.drafted_at(0), 0.0))
            draft_tokens.add_metric([model, proposer], s.get(Counter.DRAFTED, 0.0))
            accepted.add_metric([model, proposer], s.get(Counter.ACCEPTED, 0.0))
            # Every drafted position gets a series, zero acceptances included.
            positions = sorted(
                {int(k.rsplit("_", 1)[1]) for k in s if k.startswith((Counter.accepted_at(""), Counter.drafted_at("")))}
            )
            for pos in positions:
                per_pos.add_metric([model, proposer, str(pos)], s.get(Counter.accepted_at(pos), 0.0))
        yield from (drafts, draft_tokens, accepted, per_pos)

    def _generation(self, sums: Sums) -> Iterator:
        generated = CounterMetricFamily(
            "specq_generation_tokens", "Tokens generated (committed and checkpointed).", labels=["model", "proposer"]
        )
        recomputed = CounterMetricFamily(
            "specq_recomputed_tokens",
            "Tokens re-run through the model to rebuild caches after a resume.",
            labels=["model", "proposer"],
        )
        forwards = CounterMetricFamily(
            "specq_target_forwards", "Target model forwards (rounds).", labels=["model", "proposer"]
        )
        for (model, proposer), s in sorted(sums.items()):
            generated.add_metric([model, proposer], s.get(Counter.TOKENS, 0.0))
            recomputed.add_metric([model, proposer], s.get(Counter.RECOMPUTED_TOKENS, 0.0))
            forwards.add_metric([model, proposer], s.get(Counter.TARGET_FORWARDS, 0.0))
        yield from (generated, recomputed, forwards)
        for name in BUCKETS:
            family = HistogramMetricFamily(f"specq_{name}", HISTOGRAM_HELP[name], labels=["model", "proposer"])
            for (model, proposer), s in sorted(sums.items()):
                buckets, total = cumulative(name, s)
                family.add_metric([model, proposer], buckets, total)
            yield family

    def _reliability(self, sums: Sums, by_state: dict[tuple[str, str], int]) -> Iterator:
        requests = GaugeMetricFamily("specq_requests", "Requests by state.", labels=["queue", "state"])
        for (queue, state), n in sorted(by_state.items()):
            requests.add_metric([queue, state], n)
        workers = GaugeMetricFamily("specq_workers_alive", "Worker processes with a recent heartbeat.")
        workers.add_metric([], len(workers_alive(self.client, time.time())))
        resumes = CounterMetricFamily(
            "specq_resumes", "Requests resumed from a checkpoint, by reason.", labels=["model", "proposer", "reason"]
        )
        checkpoints = CounterMetricFamily(
            "specq_checkpoint_writes", "Fenced checkpoint writes.", labels=["model", "proposer"]
        )
        refused = CounterMetricFamily(
            "specq_fenced_writes_refused",
            "Writes refused because another worker owned the request (zombie workers).",
            labels=["model", "proposer"],
        )
        retries = CounterMetricFamily(
            "specq_retries", "Requests retried after a failed round.", labels=["model", "proposer"]
        )
        failures = CounterMetricFamily(
            "specq_failures", "Requests failed, by kind.", labels=["model", "proposer", "kind"]
        )
        fallbacks = CounterMetricFamily(
            "specq_proposer_fallbacks",
            "Requests that went on without drafts: the proposer failed to load on a "
            "worker (reason load) or failed while drafting (reason error).",
            labels=["model", "proposer", "reason"],
        )
        for (model, proposer), s in sorted(sums.items()):
            for reason, field in RESUME_COUNTERS.items():
                resumes.add_metric([model, proposer, reason], s.get(field, 0.0))
            checkpoints.add_metric([model, proposer], s.get(Counter.CHECKPOINT_WRITES, 0.0))
            refused.add_metric([model, proposer], s.get(Counter.FENCED_WRITES_REFUSED, 0.0))
            retries.add_metric([model, proposer], s.get(Counter.RETRIES, 0.0))
            for kind in FailureKind:
                failures.add_metric([model, proposer, kind], s.get(Counter.failed(kind), 0.0))
            fallbacks.add_metric([model, proposer, "load"], s.get(Counter.PROPOSER_FALLBACKS, 0.0))
            fallbacks.add_metric([model, proposer, "error"], s.get(Counter.PROPOSER_ERRORS, 0.0))
        yield from (requests, workers, resumes, checkpoints, refused, retries, failures, fallbacks)

"""The speed benchmark: proposers and draft lengths against plain decoding, on the
same loaded model, in one run, reported as ratios (the machine is shared and noisy;
absolute times drift, ratios measured side by side hold). Optionally each
configuration batched, and external tools (bench_external) on the same prompts.

Repetitions interleave the configurations (rep 1: A, B, C; rep 2: A, B, C ...) so
that drift hits them alike; per category the median over repetitions is reported.
tokens/s is over each request's wall time, prefill included.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from specq.bench_external import TimedBaseline
from specq.requests.inputs import GenerationDefaults, PromptSpec, to_request
from specq.specdec.acceptance import drafts_free, resolve_rule
from specq.specdec.draft_costs import MeasuredCosts
from specq.specdec.engine import Engine
from specq.specdec.model import KVCache, LlamaModel, Segment
from specq.specdec.proposers import Proposer
from specq.specdec.state import GenerationRequest, Metrics
from specq.specdec.tokenizer import Tokenizer

BASELINE = "none"


@dataclass(frozen=True)
class BenchConfig:
    proposer: str
    k: int

    @property
    def label(self) -> str:
        return BASELINE if self.proposer == BASELINE else f"{self.proposer} k={self.k}"


@dataclass
class CategoryResult:
    config: str
    category: str
    tokens_per_s: float  # median over repetitions of (tokens / wall seconds); batched: aggregate
    # The same for the decoding after each first token (prefill excluded): every token
    # but the first over the time after it. None where the prefill's time is not known
    # (batched passes, where prefills and decoding share forwards; HuggingFace).
    decode_tokens_per_s: float | None
    speedup: float | None  # over the baseline in the same category and run
    tau: float | None  # None for the external tools
    acceptance_rate: float | None
    accepted_per_position: list[float]  # share of drafts accepted at each position
    # Outputs free of their drafts (greedy, race) all identical to the baseline's;
    # batched ones to their own single stream.
    exact: bool | None
    identical: float | None  # the share of them that are (external tools: a parity figure, not a promise)
    tokens: int
    requests: int
    batch_size: int = 1


@dataclass
class BenchReport:
    machine: dict
    results: list[CategoryResult]
    verify_cost: dict[int, float]  # rows -> forward time relative to a 1-row forward
    settings: dict = field(default_factory=dict)
    batch_cost: dict[int, float] = field(default_factory=dict)  # requests -> decode round time relative to one
    # requests -> what one more row per request (a draft each) adds to that round, per
    # request, relative to a lone one-row step
    batch_draft_cost: dict[int, float] = field(default_factory=dict)
    # The row-cost curve: "verify" -> rows of one sequence, "decode" -> sequences of one
    # row each (a decode round); each -> R -> forward time relative to a 1-row forward
    row_curve: dict[str, dict[int, float]] = field(default_factory=dict)
    # requests -> a decode round of that many requests, each at its own context
    # (mixed_contexts: a request's prompt and half its plain answer, taken in turn from
    # the first), against the same requests' lone steps: what batching multiplies
    # decoding throughput by where contexts differ
    mixed_batch_gain: dict[int, float] = field(default_factory=dict)
    mixed_contexts: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "verify_cost": {str(k): v for k, v in self.verify_cost.items()},
            "batch_cost": {str(k): v for k, v in self.batch_cost.items()},
            "batch_draft_cost": {str(k): v for k, v in self.batch_draft_cost.items()},
            "row_curve": {kind: {str(k): v for k, v in curve.items()} for kind, curve in self.row_curve.items()},
            "mixed_batch_gain": {str(k): v for k, v in self.mixed_batch_gain.items()},
            "mixed_contexts": self.mixed_contexts,
            "results": [asdict(r) for r in self.results],
        }


@dataclass(frozen=True)
class Run:
    """One request's outcome in one repetition. Batched runs share their wall time:
    `seconds` is then the whole pass's, on the pass's first request, 0 on the rest."""

    spec: PromptSpec
    output_ids: list[int]
    seconds: float
    metrics: Metrics | None  # None for the external tools
    plain_outputs: bool  # the outputs are plain decoding's whatever was drafted (acceptance.drafts_free)
    first_token_seconds: float | None = None  # the prefill's share of `seconds`, where known


def machine_info() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    import os

    import numpy as np

    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def run_bench(
    model: LlamaModel,
    tokenizer: Tokenizer,
    specs: Sequence[PromptSpec],
    configs: Sequence[BenchConfig],
    make_proposer: Callable[[str], Proposer],
    *,
    defaults: GenerationDefaults,
    repeat: int = 3,
    batch_sizes: Sequence[int] = (),
    row_curve: Sequence[int] = (),
    baselines: Sequence[TimedBaseline] = (),
    progress: Callable[[str], None] = lambda _: None,
) -> BenchReport:
    """Every configuration, each external tool and, for each of `batch_sizes`, every
    configuration batched, on the same prompts, in each repetition: the single-stream
    ones prompt by prompt (each prompt by all of them in turn), then the batched
    passes; with `row_curve` (row counts), the cost of a forward of that many rows."""
    if all(c.proposer != BASELINE for c in configs):
        configs = [BenchConfig(BASELINE, 1), *configs]
    engines = {c.proposer: Engine(model, tokenizer, make_proposer(c.proposer), MeasuredCosts()) for c in configs}
    # Single-stream configurations run a prompt at a time, all of them on one prompt
    # before the next (`singles`); batched ones take every prompt in one pass
    # (`wholes`). Labels keep the order in which results are reported.
    singles: dict[str, Callable[[int], Run]] = {}
    wholes: dict[str, Callable[[], list[Run]]] = {}
    labels: list[str] = []
    for config in configs:
        requests = [(spec, to_request(spec, tokenizer, _with_k(defaults, config.k))) for spec in specs]
        singles[config.label] = _single(engines[config.proposer], requests)
        labels.append(config.label)
        for size in batch_sizes:
            wholes[_batched(config.label, size)] = _batched_pass(engines[config.proposer], requests, size)
            labels.append(_batched(config.label, size))
    plain_requests = [(spec, to_request(spec, tokenizer, defaults)) for spec in specs]
    for baseline in baselines:
        singles[baseline.name] = _baseline_one(baseline, plain_requests, tokenizer.end_of_turn_ids)
        labels.append(baseline.name)
        for size in batch_sizes if baseline.batches else ():
            label = _batched(baseline.name, size)
            wholes[label] = _baseline_batched_pass(baseline, plain_requests, tokenizer.end_of_turn_ids, size)
            labels.append(label)
    runs: dict[str, list[list[Run]]] = {label: [] for label in labels}  # label -> repetition -> runs
    order = list(singles)
    for rep in range(repeat):
        # Every single-stream configuration decodes a prompt right after the others, in
        # turn reversed from one prompt to the next: the shared machine's slow spells
        # last seconds to minutes, and when each configuration took all the prompts in
        # one pass, a spell during plain decoding's pass moved every speedup of that
        # repetition (plain single stream 132.9 tokens/s in one repetition, 176.0 in
        # the next, minutes apart). Now a spell weighs on a prompt's configurations alike.
        done: dict[str, list[Run]] = {label: [] for label in order}
        for i in range(len(specs)):
            for label in order if i % 2 == 0 else order[::-1]:
                done[label].append(singles[label](i))
            # A line a prompt: the configurations' figures come once all have been
            # decoded, minutes later with a slow --compare tool.
            progress(f"rep {rep + 1}/{repeat} prompt {i + 1}/{len(specs)}: every single-stream configuration done")
        for label in labels:
            runs[label].append(done[label] if label in singles else wholes[label]())
            tokens = sum(len(r.output_ids) for r in runs[label][-1])
            progress(f"rep {rep + 1}/{repeat} {label}: {tokens / sum(r.seconds for r in runs[label][-1]):.1f} tokens/s")
    categories = sorted({s.category or "all" for s in specs})
    if len(categories) > 1:
        categories.append("all")
    results = []
    for label, reps in runs.items():
        batched = label.rsplit(" batch=", 1)
        if len(batched) == 2:  # one shared pass: only its aggregate figure means anything
            results.append(_summarize(label, "all", reps, runs[BASELINE], runs[batched[0]], int(batched[1])))
        else:
            results += [_summarize(label, cat, reps, runs[BASELINE], runs[BASELINE]) for cat in categories]
    batch_cost, batch_draft_cost, mixed, mixed_contexts = {}, {}, {}, []
    if batch_sizes:
        progress("decode rounds at a common context, then at the requests' own")
        batch_cost, batch_draft_cost = measure_batch_cost(model, list(batch_sizes))
        # A batch's rounds mix contexts, which the rounds above, every request at
        # CURVE_CONTEXT, never do.
        mixed_contexts = halfway_contexts(plain_requests, runs[BASELINE][0], model.config.context_length)
        mixed = measure_mixed_rounds(model, list(batch_sizes), mixed_contexts)
    curve = {}
    if row_curve:
        progress(f"row-cost curve: {', '.join(map(str, row_curve))} rows")
        curve = {
            "verify": measure_verify_cost(model, list(row_curve), trials=7),
            "decode": measure_batch_cost(model, list(row_curve), trials=7)[0],
        }
    return BenchReport(
        machine=machine_info(),
        results=results,
        verify_cost=measure_verify_cost(model, sorted({c.k + 1 for c in configs if c.proposer != BASELINE})),
        batch_cost=batch_cost,
        batch_draft_cost=batch_draft_cost,
        row_curve=curve,
        mixed_batch_gain=mixed,
        mixed_contexts=mixed_contexts,
        settings={
            "repeat": repeat,
            "adaptive": defaults.adaptive,
            "batch_sizes": list(batch_sizes),
            "max_tokens": sorted({s.overrides.get("max_tokens", defaults.max_tokens) for s in specs}),
            "temperature": defaults.temperature,
            "top_p": defaults.top_p,
            "top_k": defaults.top_k,
            "accept": defaults.accept,
            "requests": len(specs),
            "configs": list(runs),
            "threads": _threads(),
            "precision": model.precision,
        },
    )


def _batched(label: str, batch_size: int) -> str:
    return f"{label} batch={batch_size}"


def _threads() -> int:
    import numba

    return numba.get_num_threads()


def _single(engine: Engine, requests: list) -> Callable[[int], Run]:
    """Decodes request i alone."""

    def run(i: int) -> Run:
        spec, request = requests[i]
        t0 = time.perf_counter()
        state = engine.run(request)
        return Run(
            spec,
            list(state.output_ids),
            time.perf_counter() - t0,
            state.metrics,
            _plain_outputs(request),
            state.metrics.prefill_seconds,
        )

    return run


def _batched_pass(engine: Engine, requests: list, batch_size: int) -> Callable[[], list[Run]]:
    def run() -> list[Run]:
        t0 = time.perf_counter()
        states = engine.run_many([r for _, r in requests], group_size=batch_size)
        wall = time.perf_counter() - t0
        return [
            Run(spec, list(s.output_ids), wall if i == 0 else 0.0, s.metrics, _plain_outputs(r))
            for i, ((spec, r), s) in enumerate(zip(requests, states))
        ]

    return run


def _baseline_one(baseline: TimedBaseline, requests: list, end_ids: frozenset[int]) -> Callable[[int], Run]:
    def run(i: int) -> Run:
        spec, request = requests[i]
        timed = baseline.generate_timed(request.prompt_ids, request.max_tokens, end_ids)
        return Run(spec, timed.ids, timed.seconds, None, _plain_outputs(request), timed.first_token_seconds)

    return run


def _baseline_batched_pass(
    baseline: TimedBaseline, requests: list, end_ids: frozenset[int], batch_size: int
) -> Callable[[], list[Run]]:
    def run() -> list[Run]:
        outputs, wall = baseline.generate_many_timed(
            [r.prompt_ids for _, r in requests], [r.max_tokens for _, r in requests], end_ids, batch_size
        )
        return [
            Run(spec, ids, wall if i == 0 else 0.0, None, _plain_outputs(r))
            for i, ((spec, r), ids) in enumerate(zip(requests, outputs))
        ]

    return run


def _plain_outputs(request: GenerationRequest) -> bool:
    return drafts_free(resolve_rule(request.accept, request.sampling), request.sampling)


def _with_k(defaults: GenerationDefaults, k: int) -> GenerationDefaults:
    return GenerationDefaults(**{**asdict(defaults), "k": k})


def _summarize(
    label: str,
    category: str,
    reps: list[list[Run]],
    baseline_reps: list[list[Run]],
    reference_reps: list[list[Run]],
    batch_size: int = 1,
) -> CategoryResult:
    """`baseline_reps` (plain decoding) gives the speedup; `reference_reps` the outputs
    that ones free of their drafts must equal (plain decoding, or a batched config's
    single stream)."""

    def pick(done: list[Run]) -> list[Run]:
        return [r for r in done if category == "all" or (r.spec.category or "all") == category]

    def rate(done: list[Run]) -> float:
        return sum(len(r.output_ids) for r in done) / sum(r.seconds for r in done)

    def decode_rate(done: list[Run]) -> float | None:
        if batch_size > 1 or any(r.first_token_seconds is None for r in done):
            return None
        return sum(len(r.output_ids) - 1 for r in done) / sum(r.seconds - r.first_token_seconds for r in done)

    rates = [rate(pick(done)) for done in reps]
    decode_rates = [decode_rate(pick(done)) for done in reps]
    base_rates = [rate(pick(base)) for base in baseline_reps]
    first = pick(reps[0])
    m = [r.metrics for r in first if r.metrics is not None]
    drafted_pos = _sum_lists([x.drafted_per_position for x in m])
    accepted_pos = _sum_lists([x.accepted_per_position for x in m])
    drafted = sum(x.drafted for x in m)
    identical = None
    # Greedy and race-rule outputs are plain decoding's whatever drafts them; the sample
    # rule's only the same configuration's single stream's (the drafts decide which
    # draws pick what).
    if label != BASELINE and (batch_size > 1 or all(r.plain_outputs for r in first)):
        same = [a.output_ids == b.output_ids for a, b in zip(first, pick(reference_reps[0]))]
        identical = sum(same) / len(same)
    return CategoryResult(
        config=label,
        category=category,
        tokens_per_s=round(statistics.median(rates), 2),
        decode_tokens_per_s=None if None in decode_rates else round(statistics.median(decode_rates), 2),
        # Pairwise ratios within each repetition, then the median: robust to drift.
        speedup=round(statistics.median(r / b for r, b in zip(rates, base_rates)), 3),
        tau=round(sum(x.emitted for x in m) / sum(x.target_forwards for x in m), 3) if m else None,
        acceptance_rate=(round(sum(x.accepted for x in m) / drafted, 3) if drafted else 0.0) if m else None,
        accepted_per_position=[round(a / d, 3) if d else 0.0 for a, d in zip(accepted_pos, drafted_pos)],
        exact=None if identical is None or not m else identical == 1.0,
        identical=None if identical is None else round(identical, 3),
        tokens=sum(len(r.output_ids) for r in first),
        requests=len(first),
        batch_size=batch_size,
    )


def _sum_lists(lists: list[tuple[int, ...]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]


CURVE_CONTEXT = 200  # the context the row costs are measured at


def measure_verify_cost(
    model: LlamaModel, rows: Sequence[int], *, context: int = CURVE_CONTEXT, trials: int = 9
) -> dict[int, float]:
    """Time of one forward over n new rows relative to one row, at a typical context
    length, each in the steady state of its own shape (_settled); the trials
    interleave the sizes and the median ratio is kept."""
    cache = model.new_cache(context + max(rows, default=1) + 1)
    model.forward([Segment(cache, [5] * context, 0, all_logits=False)])
    ratios: dict[int, list[float]] = {n: [] for n in rows}
    for _ in range(trials):
        one = _time_forward(model, cache, 1, context)
        for n in rows:
            ratios[n].append(_time_forward(model, cache, n, context) / one)
    return {n: round(statistics.median(r), 3) for n, r in ratios.items()}


def measure_batch_cost(
    model: LlamaModel, sizes: Sequence[int], *, context: int = CURVE_CONTEXT, trials: int = 7
) -> tuple[dict[int, float], dict[int, float]]:
    """Time of one decode round of n requests (n segments of one new row each, every
    one at `context` positions) relative to a lone request's, each in the steady
    state of its own shape (_settled); n over that ratio is
    what batching multiplies decoding throughput by, prefill aside. And, from the
    same trials, what a second row per request (one draft each) adds to the round,
    per request, in lone steps: the price a draft pays in a batch
    (specq.specdec.adaptive's docstring)."""
    caches = [model.new_cache(context + 3) for _ in range(max(sizes, default=1))]
    for cache in caches:
        model.forward([Segment(cache, [5] * context, 0, all_logits=False)])
    ratios: dict[int, list[float]] = {n: [] for n in sizes}
    drafts: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(trials):
        one = _time_round(model, caches[:1], context)
        for n in sizes:
            plain, drafted = (_time_round(model, caches[:n], context, rows) / one for rows in (1, 2))
            ratios[n].append(plain)
            drafts[n].append((drafted - plain) / n)
    return (
        {n: round(statistics.median(r), 3) for n, r in ratios.items()},
        {n: round(statistics.median(r), 3) for n, r in drafts.items()},
    )


def halfway_contexts(requests: list, plain_runs: list[Run], context_length: int) -> list[int]:
    """Where each request stood halfway through its plain answer (its prompt and half
    its output), in an order shuffled with a fixed seed: the prompt file groups its
    requests by category, so its first few are alike, where a round smaller than the
    file should hold short and long ones as a batch does. Below the model's context,
    as the engine's caches are."""
    contexts = [
        min(len(request.prompt_ids) + len(run.output_ids) // 2, context_length - 1)
        for (_, request), run in zip(requests, plain_runs)
    ]
    order = np.random.default_rng(0).permutation(len(contexts))
    return [contexts[i] for i in order]


def measure_mixed_rounds(
    model: LlamaModel, sizes: Sequence[int], contexts: Sequence[int], *, trials: int = 7
) -> dict[int, float]:
    """For each n of `sizes`: a decode round of n requests, request i at contexts[i]
    (taken in turn, as many times as n needs), against the same requests decoded one
    at a time: the sum of their lone steps' times (each at its own context) over the
    round's time, the median over `trials` interleaved trials. Contexts that differ
    are what attention's threads must share (block_ops._task_edges), which rounds of
    equal contexts (measure_batch_cost) cannot show."""
    if not contexts:
        return {}
    largest = max(sizes, default=1)
    chosen = [contexts[i % len(contexts)] for i in range(largest)]
    caches = [model.new_cache(c + 2) for c in chosen]
    for cache, context in zip(caches, chosen):
        model.forward([Segment(cache, [5] * context, 0, all_logits=False)])
    first_cache = {c: caches[chosen.index(c)] for c in chosen}
    gains: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(trials):
        lone = {c: _time_round(model, [cache], c) for c, cache in first_cache.items()}
        for n in sizes:
            round_time = _settled(
                lambda n=n: model.forward([Segment(c, [7], s, argmax_only=True) for c, s in zip(caches[:n], chosen)])
            )
            gains[n].append(sum(lone[c] for c in chosen[:n]) / round_time)
    return {n: round(statistics.median(g), 3) for n, g in gains.items()}


# The bench decodes greedily, so its forwards are timed as the engine runs a greedy
# request's: wanting only each row's largest logit (from head_screen.SCREEN_ROWS rows,
# the screened output head or the whole head, whichever the model's HeadChoice has
# found cheaper; one call in 16 takes the other, as in decoding).
def _time_round(model: LlamaModel, caches: list, start: int, rows: int = 1) -> float:
    return _settled(lambda: model.forward([Segment(c, [7] * rows, start, argmax_only=True) for c in caches]))


def _time_forward(model: LlamaModel, cache: KVCache, n: int, start: int) -> float:
    return _settled(lambda: model.forward([Segment(cache, [7] * n, start, argmax_only=True)]))


# A forward is timed once it has run SETTLE_RUNS times in a row, as decoding runs it:
# a step follows steps of its own shape. On an Intel Xeon whose 480 MB L3 holds the
# model's 96 MB of weights (2026-12-06), lone steps right after a round of 64 took
# 5.6, 5.1, 4.8, 4.5 ... ms and settled at 3.3 to 3.5 ms after about ten: the weights
# come back into the cache as the steps reread them. Timed right after bigger
# forwards, as this bench did before, the lone step that every ratio is divided by
# was the unsettled one, and a round of 32 measured 6.2x a lone step where settled
# it is 10.8x (docs/performance.md, eleventh session).
SETTLE_RUNS, TIMED_RUNS = 10, 3


def _settled(forward: Callable[[], object]) -> float:
    """The median time of TIMED_RUNS calls of `forward` after SETTLE_RUNS untimed ones."""
    for _ in range(SETTLE_RUNS):
        forward()
    times = []
    for _ in range(TIMED_RUNS):
        t0 = time.perf_counter()
        forward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def format_table(report: BenchReport) -> str:
    """tok/s counts the prefill, decode/s does not (each request's tokens after its
    first, over the time after it). exact: yes/NO for specq's configurations (a
    promise); for the external tools the share of outputs identical to specq's plain
    decoding, or batched, to the tool's own single stream (quantization and summation
    order differ, so near-ties can go the other way)."""
    width = max([14, *(len(r.config) + 2 for r in report.results)])
    lines = [
        f"{'config':<{width}}{'category':<15}{'tok/s':>8}{'decode/s':>9}{'speedup':>9}{'tau':>7}{'accept':>8}"
        "  exact  per-position acceptance"
    ]
    for r in report.results:
        if r.exact is not None:
            exact = "yes" if r.exact else "NO"
        else:
            exact = "-" if r.identical is None else f"{r.identical:.0%}"
        per_pos = " ".join(f"{a:.2f}" for a in r.accepted_per_position)
        tau = "-" if r.tau is None else f"{r.tau:.2f}"
        accept = "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.2f}"
        decode = "-" if r.decode_tokens_per_s is None else f"{r.decode_tokens_per_s:.1f}"
        lines.append(
            f"{r.config:<{width}}{r.category:<15}{r.tokens_per_s:>8.1f}{decode:>9}{r.speedup:>8.2f}x{tau:>7}"
            f"{accept:>8}  {exact:<5}  {per_pos}"
        )
    costs = ", ".join(f"{n} rows {c:.2f}x" for n, c in report.verify_cost.items())
    if costs:
        lines.append(f"verify cost (forward time relative to 1 row): {costs}")
    for n, c in report.batch_cost.items():
        line = (
            f"decode round of {n} requests: {c:.2f}x one request's, so {n / c:.2f}x the decoding throughput "
            "(prefill aside)"
        )
        if n in report.batch_draft_cost:
            line += f"; a draft each adds {report.batch_draft_cost[n]:.2f} of a lone step per request"
        lines.append(line)
    if report.mixed_batch_gain:
        contexts = report.mixed_contexts
        parts = []
        for n, gain in report.mixed_batch_gain.items():
            held = [contexts[i % len(contexts)] for i in range(n)]
            parts.append(f"{n} requests (contexts {min(held)} to {max(held)}, mean {sum(held) / n:.0f}) {gain:.2f}x")
        lines.append(
            "decode rounds at the requests' own contexts, against the same requests one at a time: " + ", ".join(parts)
        )
    for kind, what in (("verify", "rows of one sequence"), ("decode", "sequences of one row (a decode round)")):
        curve = report.row_curve.get(kind)
        if curve:
            lines.append(
                f"row cost, {what}, forward time relative to 1 row: "
                + ", ".join(f"{n}: {c:.2f}x" for n, c in curve.items())
            )
    m = report.machine
    lines.append(f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}")
    return "\n".join(lines)

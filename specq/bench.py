"""The speed benchmark: proposers and draft lengths against plain decoding, on the
same loaded model, in one run, reported as ratios (the machine is shared and noisy;
absolute times drift, ratios measured side by side hold).

Repetitions interleave the configurations (rep 1: A, B, C; rep 2: A, B, C ...) so
that drift hits them alike; per category the median over repetitions is reported.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from specq.jobs.inputs import GenerationDefaults, PromptSpec, to_request
from specq.specdec.engine import Engine
from specq.specdec.model import LlamaModel, Segment
from specq.specdec.proposers import Proposer
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
    tokens_per_s: float  # median over repetitions of (tokens / decode seconds)
    speedup: float | None  # over the baseline in the same category and run
    tau: float
    acceptance_rate: float
    accepted_per_position: list[float]  # share of drafts accepted at each position
    exact: bool | None  # greedy outputs identical to the baseline's
    tokens: int
    requests: int


@dataclass
class BenchReport:
    machine: dict
    results: list[CategoryResult]
    verify_cost: dict[int, float]  # rows -> forward time relative to a 1-row forward
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "verify_cost": {str(k): v for k, v in self.verify_cost.items()},
            "results": [asdict(r) for r in self.results],
        }


def machine_info() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    import os

    import numpy as np

    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform()}


def run_bench(
    model: LlamaModel,
    tokenizer: Tokenizer,
    specs: Sequence[PromptSpec],
    configs: Sequence[BenchConfig],
    make_proposer: Callable[[str], Proposer],
    *,
    defaults: GenerationDefaults,
    repeat: int = 3,
    progress: Callable[[str], None] = lambda _: None,
) -> BenchReport:
    if all(c.proposer != BASELINE for c in configs):
        configs = [BenchConfig(BASELINE, 1), *configs]
    engines = {c.proposer: Engine(model, tokenizer, make_proposer(c.proposer)) for c in configs}
    # runs[config label][repetition] = list of (spec, final state)
    runs: dict[str, list[list]] = {c.label: [] for c in configs}
    for rep in range(repeat):
        for config in configs:
            engine = engines[config.proposer]
            done = []
            for spec in specs:
                request = to_request(spec, tokenizer, _with_k(defaults, config.k))
                done.append((spec, engine.run(request)))
            runs[config.label].append(done)
            tokens = sum(len(s.output_ids) for _, s in done)
            seconds = sum(s.metrics.decode_seconds for _, s in done)
            progress(f"rep {rep + 1}/{repeat} {config.label}: {tokens / seconds:.1f} tokens/s")
    categories = sorted({s.category or "all" for s in specs})
    if len(categories) > 1:
        categories.append("all")
    results = [_summarize(label, cat, reps, runs[BASELINE]) for label, reps in runs.items() for cat in categories]
    return BenchReport(
        machine=machine_info(),
        results=results,
        verify_cost=measure_verify_cost(model, sorted({c.k + 1 for c in configs if c.proposer != BASELINE})),
        settings={"repeat": repeat, "adaptive": defaults.adaptive,
                  "max_tokens": sorted({s.overrides.get("max_tokens", defaults.max_tokens) for s in specs}), "temperature": defaults.temperature,
                  "requests": len(specs), "configs": [c.label for c in configs]},
    )


def _with_k(defaults: GenerationDefaults, k: int) -> GenerationDefaults:
    return GenerationDefaults(**{**asdict(defaults), "k": k})


def _summarize(label: str, category: str, reps: list[list], baseline_reps: list[list]) -> CategoryResult:
    def pick(done):
        return [(spec, s) for spec, s in done if category == "all" or (spec.category or "all") == category]

    rates, base_rates = [], []
    for done, base in zip(reps, baseline_reps):
        mine, theirs = pick(done), pick(base)
        rates.append(sum(len(s.output_ids) for _, s in mine) / sum(s.metrics.decode_seconds for _, s in mine))
        base_rates.append(sum(len(s.output_ids) for _, s in theirs) / sum(s.metrics.decode_seconds for _, s in theirs))
    first = pick(reps[0])
    m = [s.metrics for _, s in first]
    drafted_pos = _sum_lists([x.drafted_per_position for x in m])
    accepted_pos = _sum_lists([x.accepted_per_position for x in m])
    drafted = sum(x.drafted for x in m)
    greedy = all(s.request.sampling.greedy for _, s in first)
    exact = None
    if greedy and label != BASELINE:
        exact = [s.output_ids for _, s in first] == [s.output_ids for _, s in pick(baseline_reps[0])]
    return CategoryResult(
        config=label,
        category=category,
        tokens_per_s=round(statistics.median(rates), 2),
        # Pairwise ratios within each repetition, then the median: robust to drift.
        speedup=round(statistics.median(r / b for r, b in zip(rates, base_rates)), 3),
        tau=round(sum(x.emitted for x in m) / sum(x.target_forwards for x in m), 3),
        acceptance_rate=round(sum(x.accepted for x in m) / drafted, 3) if drafted else 0.0,
        accepted_per_position=[round(a / d, 3) if d else 0.0 for a, d in zip(accepted_pos, drafted_pos)],
        exact=exact,
        tokens=sum(len(s.output_ids) for _, s in first),
        requests=len(first),
    )


def _sum_lists(lists: list[tuple[int, ...]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]


def measure_verify_cost(model: LlamaModel, rows: Sequence[int], *, context: int = 200, trials: int = 15) -> dict[int, float]:
    """Time of one forward over n new rows relative to one row, at a typical context
    length; the trials interleave the sizes and the median ratio is kept."""
    cache = model.new_cache(context + max(rows, default=1) + 1)
    model.forward([Segment(cache, [5] * context, 0, all_logits=False)])
    ratios: dict[int, list[float]] = {n: [] for n in rows}
    for _ in range(trials):
        one = _time_forward(model, cache, 1, context)
        for n in rows:
            ratios[n].append(_time_forward(model, cache, n, context) / one)
    return {n: round(statistics.median(r), 3) for n, r in ratios.items()}


def _time_forward(model: LlamaModel, cache, n: int, start: int) -> float:
    t0 = time.perf_counter()
    model.forward([Segment(cache, [7] * n, start)])
    return time.perf_counter() - t0


def format_table(report: BenchReport) -> str:
    lines = [f"{'config':<14}{'category':<15}{'tok/s':>8}{'speedup':>9}{'tau':>7}{'accept':>8}  exact  per-position acceptance"]
    for r in report.results:
        exact = "-" if r.exact is None else ("yes" if r.exact else "NO")
        per_pos = " ".join(f"{a:.2f}" for a in r.accepted_per_position)
        lines.append(
            f"{r.config:<14}{r.category:<15}{r.tokens_per_s:>8.1f}{r.speedup:>8.2f}x{r.tau:>7.2f}"
            f"{r.acceptance_rate:>8.2f}  {exact:<5}  {per_pos}"
        )
    costs = ", ".join(f"{n} rows {c:.2f}x" for n, c in report.verify_cost.items())
    if costs:
        lines.append(f"verify cost (forward time relative to 1 row): {costs}")
    m = report.machine
    lines.append(f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}")
    return "\n".join(lines)

"""`specq bench --plot DIR`: PNG charts of a bench report (its JSON form), drawn with
matplotlib (the optional `plot` extra)."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is optional: imported only to plot
    from matplotlib.figure import Figure

import os
import re
from collections import defaultdict

from specq.errors import ParameterError

BASELINE = "none"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise ParameterError("--plot needs matplotlib: pip install 'specq[plot]'") from None
    return plt


def _split(label: str) -> tuple[str, int | None]:
    m = re.fullmatch(r"(\S+) k=(\d+)", label)
    return (m.group(1), int(m.group(2))) if m else (label, None)


def write_plots(report: dict, directory: str) -> list[str]:
    """Three charts; returns their paths."""
    plt = _pyplot()
    os.makedirs(directory, exist_ok=True)
    results = report["results"]
    overall = [r for r in results if r["category"] == "all"] or results
    machine = report.get("machine", {})
    subtitle = f"{machine.get('cpu', '')}, {machine.get('cores', '?')} cores"
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_proposer: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in overall:
        name, k = _split(r["config"])
        if name == BASELINE:
            ax.axhline(r["tokens_per_s"], color="grey", linestyle="--", label="plain decoding")
        elif k is not None:
            by_proposer[name].append((k, r["tokens_per_s"]))
        elif r.get("tau") is None:  # an external tool, for scale
            ax.axhline(r["tokens_per_s"], linestyle=":", color="black" if "llama" in name else "brown", label=name)
    for name, points in sorted(by_proposer.items()):
        points.sort()
        ax.plot([k for k, _ in points], [t for _, t in points], marker="o", label=name)
    ax.set_xlabel("draft length k")
    ax.set_ylabel("tokens/s (all categories)")
    ax.set_title(f"Tokens per second against k\n{subtitle}", fontsize=10)
    ax.legend()
    paths.append(_save(fig, directory, "tokens_per_s_vs_k.png"))

    categories = sorted({r["category"] for r in results})
    configs = [c for c in dict.fromkeys(r["config"] for r in results) if c != BASELINE]
    speedup = {(r["config"], r["category"]): r["speedup"] for r in results}
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(categories)), 4.5))
    width = 0.8 / max(len(configs), 1)
    for i, config in enumerate(configs):
        xs = [j + i * width for j in range(len(categories))]
        ax.bar(xs, [speedup.get((config, c)) or 0 for c in categories], width, label=config)
    ax.axhline(1.0, color="grey", linestyle="--")
    ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(categories))], categories, rotation=30)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"Speedup per category\n{subtitle}", fontsize=10)
    ax.legend(fontsize=8)
    paths.append(_save(fig, directory, "speedup_per_category.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in overall:
        if r["config"] != BASELINE and r["accepted_per_position"]:
            positions = range(len(r["accepted_per_position"]))
            ax.plot(positions, r["accepted_per_position"], marker="o", label=r["config"])
    ax.set_xlabel("draft position (0 = first)")
    ax.set_ylabel("share of drafts accepted")
    ax.set_ylim(0, 1)
    ax.set_title(f"Acceptance per draft position\n{subtitle}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # plain decoding alone drafts nothing
        ax.legend(fontsize=8)
    paths.append(_save(fig, directory, "acceptance_per_position.png"))
    paths += _batch_plots(plt, report, directory, subtitle)
    return paths


def _batch_plots(plt: ModuleType, report: dict, directory: str, subtitle: str) -> list[str]:
    """With batched passes, aggregate tokens/s against the batch size (1 = single
    stream); with a row-cost curve, forward time against rows."""
    paths = []
    sweep: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in report["results"]:
        name, _, size = r["config"].partition(" batch=")
        if size:
            sweep[name].append((int(size), r["tokens_per_s"]))
        elif r["category"] == "all" or len({x["category"] for x in report["results"]}) == 1:
            sweep[name].append((1, r["tokens_per_s"]))
    sweep = {name: sorted(points) for name, points in sweep.items() if len(points) > 1}
    if sweep:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, points in sorted(sweep.items()):
            ax.plot([n for n, _ in points], [t for _, t in points], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests decoded together (batch size)")
        ax.set_ylabel("aggregate tokens/s, prefill included")
        ax.set_title(f"Batched throughput\n{subtitle}", fontsize=10)
        ax.legend(fontsize=8)
        paths.append(_save(fig, directory, "tokens_per_s_vs_batch_size.png"))
    curves = report.get("row_curve") or {}
    if any(curves.values()):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        labels = {"verify": "R rows of one sequence", "decode": "R sequences, one row each"}
        top = 1
        for kind, curve in curves.items():
            points = sorted((int(n), c) for n, c in curve.items())
            top = max(top, *(n for n, _ in points))
            ax.plot([n for n, _ in points], [c for _, c in points], marker="o", label=labels.get(kind, kind))
        ax.plot([1, top], [1, top], color="grey", linestyle=":", label="every row a full step")
        ax.axhline(1.0, color="grey", linestyle="--", label="rows for free")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("rows R in one forward")
        ax.set_ylabel("forward time relative to one row")
        ax.set_title(f"Row-cost curve\n{subtitle}", fontsize=10)
        ax.legend(fontsize=8)
        paths.append(_save(fig, directory, "row_cost.png"))
    return paths


def _save(fig: Figure, directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

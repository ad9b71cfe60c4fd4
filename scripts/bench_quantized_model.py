#!/usr/bin/env python3
"""The default model computing from its quantized blocks against the same model in
float32 (`LlamaModel.dequantized()`: the same values, the products specq computed
before), timed interleaved in one process.

The machine is shared: a sample counts only if other processes used (almost) no CPU
while it ran, read from /proc/stat against this process's own CPU time. Figures are
medians (or the best, for prefills) over clean samples, and ratios are taken within
one trial.

  step     forwards of 1, 3 and 5 new rows at context 200, both models
  plain    plain greedy decoding of 7 bench prompts, 64 tokens each, both models
  prefill  prompts of 48 to 400 rows through the quantized kernel and through BLAS
           (products.BULK_ROWS forced either way), quantized model only

Usage:  python scripts/bench_quantized_model.py step|plain|prefill [--minutes 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import specq.specdec.products as products
from specq.specdec.engine import Engine
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.model import Segment
from specq.specdec.proposers import NoProposer
from specq.specdec.state import GenerationRequest

PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "bench_prompts.jsonl")


def _busy_jiffies() -> int:
    v = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return sum(v) - v[3] - v[4]  # all but idle and iowait


def _own_jiffies() -> float:
    t = os.times()
    return (t.user + t.system) * os.sysconf("SC_CLK_TCK")


def timed(fn, slack: int = 2):
    """(seconds, clean, result): clean when other processes used at most `slack`
    jiffies (plus 2% of the time) meanwhile."""
    busy, own = _busy_jiffies(), _own_jiffies()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    other = (_busy_jiffies() - busy) - (_own_jiffies() - own)
    return seconds, other <= slack + 2 * seconds, result


def step(models: dict, until: float) -> None:
    ctx, sizes = 200, (1, 3, 5)
    caches = {}
    for name, m in models.items():
        caches[name] = m.new_cache(ctx + max(sizes))
        m.forward([Segment(caches[name], [5] * ctx, 0, all_logits=False)])
    trials = []
    while time.time() < until and len(trials) < 40:
        t, ok = {}, True
        for name, m in models.items():
            for n in sizes:
                t[name, n], clean, _ = timed(lambda: m.forward([Segment(caches[name], [7] * n, ctx)]), slack=0)
                ok &= clean
        if ok:
            trials.append(t)
    print(f"{len(trials)} clean trials; a forward of n new rows at context {ctx}, median ms (median ratio to 1 row):")
    for name in models:
        cells = [f"{n} rows {1e3 * statistics.median(t[name, n] for t in trials):6.2f} ms "
                 f"({statistics.median(t[name, n] / t[name, 1] for t in trials):.2f}x)" for n in sizes]
        print(f"  {name:8} " + "  ".join(cells))
    for n in sizes:
        print(f"  {n} rows, float32 / quantized: {statistics.median(t['float32', n] / t['quantized', n] for t in trials):.2f}x")


def plain(models: dict, tokenizer, until: float) -> None:
    lines = [json.loads(line) for line in open(PROMPTS)][::4][:7]  # one prompt per category
    requests = [
        GenerationRequest(prompt_ids=tuple(tokenizer.encode_chat(p.get("messages") or [{"role": "user", "content": p["prompt"]}])),
                          max_tokens=64)
        for p in lines
    ]
    engines = {name: Engine(m, tokenizer, NoProposer()) for name, m in models.items()}
    pairs = []  # per clean pair of runs of one request: name -> (tokens, decode s, prefill s)
    while time.time() < until and len(pairs) < 3 * len(requests):
        for req in requests:
            pair, ok = {}, True
            for name, engine in engines.items():
                _, clean, state = timed(lambda: engine.run(req), slack=5)
                ok &= clean
                m = state.metrics
                pair[name] = (len(state.output_ids), m.decode_seconds, m.prefill_seconds)
            if ok:
                pairs.append(pair)
    print(f"{len(pairs)} clean pairs of runs (plain greedy decoding, 64 tokens, 7 prompts):")
    for name in models:
        tokens = sum(p[name][0] for p in pairs)
        seconds = sum(p[name][1] for p in pairs)
        prefill = sum(p[name][2] for p in pairs)
        print(f"  {name:9} {tokens / seconds:5.1f} tokens/s with the prefill, {tokens / (seconds - prefill):5.1f} "
              f"without it (prefill {prefill / seconds:.0%} of the time)")
    ratios = [(p["quantized"][0] / p["quantized"][1]) / (p["float32"][0] / p["float32"][1]) for p in pairs]
    print(f"  quantized / float32 tokens/s per request: median {statistics.median(ratios):.2f}x "
          f"(from {min(ratios):.2f}x to {max(ratios):.2f}x)")


def prefill(model, until: float) -> None:
    sizes = (48, 52, 53, 56, 64, 100, 200, 400)
    best: dict = {}
    while time.time() < until and min((len(best.get((n, "kernel"), [])) for n in sizes), default=0) < 3:
        for n in sizes:
            ids = ([5, 9, 300, 77, 1000, 2000, 42] * n)[:n]
            pair = {}
            for path, bulk_rows in (("kernel", 10**9), ("blas", 1)):
                products.BULK_ROWS = bulk_rows
                pair[path] = timed(lambda: model.forward([Segment(model.new_cache(n), ids, 0, all_logits=False)]))
            if all(clean for _, clean, _ in pair.values()):
                for path, (seconds, _, _) in pair.items():
                    best.setdefault((n, path), []).append(seconds)
    print("prefill from position 0, best of the clean pairs, ms:")
    for n in sizes:
        k, b = best.get((n, "kernel")), best.get((n, "blas"))
        if k and b:
            print(f"  {n:3} rows ({len(k)} clean): quantized kernel {1e3 * min(k):5.0f}, dequantized + BLAS {1e3 * min(b):5.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("step", "plain", "prefill"))
    ap.add_argument("--minutes", type=float, default=10, help="stop collecting samples after this long")
    args = ap.parse_args()
    until = time.time() + 60 * args.minutes
    model, tokenizer = load_model_and_tokenizer(default_model_path())
    if args.what == "prefill":
        prefill(model, until)
        return
    models = {"quantized": model, "float32": model.dequantized()}
    if args.what == "step":
        step(models, until)
    else:
        plain(models, tokenizer, until)


if __name__ == "__main__":
    main()

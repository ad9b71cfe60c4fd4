"""Whole forwards at an integer precision with each KV cache type, interleaved in one
process (the machine is shared: only ratios taken side by side mean anything):
float32, float16, float16 keys with 8-bit values (float16+int8) and 8-bit (int8's),
model.KV_TYPES.

    python scripts/bench_kv_cache.py --precision int16 --context 200
    python scripts/bench_kv_cache.py --precision int8 --context 500 --caches float16,int8
    python scripts/bench_kv_cache.py --model toy.gguf --context 8 --trials 1   # a smoke run (Q4_1 blocks needed)

    python scripts/bench_kv_cache.py --caches float16,float16+int8 --sequences 32,64 --context 500

For each case (a 1-row step, a 5-row verification, decode rounds of 8 and 32
sequences, or of --sequences) it prints each cache's median time, the ratio to the first cache named,
and the case's time over the 1-row step's with the same cache (the row-cost figures
of docs/performance.md). The float32 variant compiles the integer block loop again
for float32 caches (specq compiles it for float16 and 8-bit caches only).

    python scripts/bench_kv_cache.py --growth --caches float16 --context 200

--growth instead times decode rounds of 1, 8 and 32 sequences (or 1 and --sequences) at context 8 and at
--context, and attention alone (block_ops.attend_many, every layer, over the same
caches): a round should grow with the context by what its attention does, and where
it grew by more (storing keys with positions last, docs/performance.md), something
else in the forward depends on the context.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import replace

import numpy as np
from numba import njit
from numba.typed import List

from specq.specdec import block_ops, int8_stack
from specq.specdec.loader import default_model_path
from specq.specdec.model import KVCache, LlamaModel, Segment

SINGLE = [(1, 1), (5, 1)]  # (rows of each sequence, sequences): a step, a verification
# (keys, values); float16+int8: float16 keys with 8-bit values
DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "float16+int8": (np.float16, np.int8),
    "int8": np.int8,
}


def with_float32_caches(model: LlamaModel) -> LlamaModel:
    run_many = njit(int8_stack._run.py_func)

    def run_one(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):
        """StackedLayers.run's one-segment call, its lists built here for run_many."""
        lists = List(), List(), List()
        for items, item in zip(lists, (visible, keys, values)):
            items.append(item)
        return run_many(x, positions, starts, bounds, lists[0], weights, rope, lists[1], lists[2], sizes)

    other = LlamaModel(model.config, LlamaModel.load(model.path).weights, precision=model.precision)
    other._stack = replace(other._stack, compiled=(run_many, run_one))
    other.new_cache = lambda capacity=256: KVCache(other.config, capacity, np.float32)
    return other


def with_caches(model: LlamaModel, name: str) -> LlamaModel:
    """The same model (the same weights and compiled stack) keeping caches of `name`."""
    if name == "float32":
        return with_float32_caches(model)
    other = copy.copy(model)
    other.new_cache = lambda capacity=256: KVCache(other.config, capacity, DTYPES[name])
    return other


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--precision", default="int16", choices=("int16", "int8"))
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--caches", default="float32,float16,int8", help="cache types, comma-separated")
    parser.add_argument("--growth", action="store_true", help="rounds and attention alone, context 8 against --context")
    parser.add_argument("--sequences", default="8,32", help="decode rounds' sequence counts, comma-separated")
    args = parser.parse_args()
    names = args.caches.split(",")
    if not names or any(n not in DTYPES for n in names):
        parser.error(f"--caches: a comma-separated list of {', '.join(DTYPES)}")
    try:
        rounds = [int(n) for n in args.sequences.split(",")]
    except ValueError:
        rounds = []
    if not rounds or min(rounds) < 1:
        parser.error("--sequences: a comma-separated list of positive counts, e.g. 8,32")
    cases = SINGLE + [(1, n) for n in rounds]
    base = LlamaModel.load(args.model or default_model_path(), args.precision)
    if base._stack is None:
        raise SystemExit(
            f"{base.path}: no compiled integer layer stack at {args.precision} "
            "(it needs Q4_1 block matrices, as the default model has)"
        )
    models = {name: with_caches(base, name) for name in names}
    if args.growth:
        growth(models, args.precision, args.context, args.trials, (1, *rounds))
        return
    caches = {}
    for name, model in models.items():
        caches[name] = [model.new_cache(args.context + 8) for _ in range(max(s for _, s in cases))]
        for cache in caches[name]:
            model.forward([Segment(cache, [5] * args.context, 0, all_logits=False)])

    def timed(name: str, rows: int, seqs: int) -> float:
        model, cs = models[name], caches[name]
        segments = (
            [Segment(cs[0], [7] * rows, args.context)]
            if seqs == 1
            else [Segment(c, [7], args.context) for c in cs[:seqs]]
        )
        t0 = time.perf_counter()
        model.forward(segments)
        return time.perf_counter() - t0

    for name in models:  # compile and warm up
        for case in cases:
            timed(name, *case)
    times = {(name, case): [] for name in models for case in cases}
    for _ in range(args.trials):
        for case in cases:
            for name in models:
                times[(name, case)].append(timed(name, *case))
    median = {key: statistics.median(t) * 1e3 for key, t in times.items()}
    first = names[0]
    for case in cases:
        parts = [
            f"{name} {median[(name, case)]:.2f} ms ({median[(first, case)] / median[(name, case)]:.3f}x {first}, "
            f"{median[(name, case)] / median[(name, cases[0])]:.2f}x its 1 row)"
            for name in names
        ]
        print(
            f"{args.precision}, context {args.context}, {case[0]} row(s) x {case[1]} sequence(s): " + "; ".join(parts)
        )


def growth(models: dict[str, LlamaModel], precision: str, context: int, trials: int, counts: tuple) -> None:
    """The --growth figures (the module docstring), interleaved, medians."""
    contexts = (8, context)
    setups = {}
    for name, model in models.items():
        for n in counts:
            for ctx in contexts:
                caches = [model.new_cache(ctx + 8) for _ in range(n)]
                for cache in caches:
                    model.forward([Segment(cache, [5] * ctx, 0, all_logits=False)])
                setups[(name, n, ctx)] = caches
    rng = np.random.default_rng(0)

    def round_time(name: str, n: int, ctx: int) -> float:
        segments = [Segment(c, [7], ctx) for c in setups[(name, n, ctx)]]
        t0 = time.perf_counter()
        models[name].forward(segments)
        return time.perf_counter() - t0

    def attention_time(name: str, n: int, ctx: int) -> float:
        model, caches = models[name], setups[(name, n, ctx)]
        cfg = model.config
        keys, values = List([c.kernel_keys for c in caches]), List([c.kernel_values for c in caches])
        visible = List([np.ones((1, 1), np.bool_) for _ in caches])
        q = rng.standard_normal((n, cfg.n_heads, cfg.head_dim)).astype(np.float32)
        starts, bounds = np.full(n, ctx, np.int64), np.arange(n + 1, dtype=np.int64)
        scale = np.float32(cfg.attention_scale)
        t0 = time.perf_counter()
        for layer in range(cfg.n_layers):
            block_ops.attend_many(q, starts, bounds, visible, keys, values, layer, scale)
        return time.perf_counter() - t0

    kinds = {"round": round_time, "attention": attention_time}
    for key in setups:  # compile and warm up
        for fn in kinds.values():
            fn(*key)
    times: dict = {}
    for _ in range(trials):
        for key in setups:
            for kind, fn in kinds.items():
                times.setdefault((kind, *key), []).append(fn(*key))
    ms = {key: statistics.median(t) * 1e3 for key, t in times.items()}
    for name in models:
        for n in counts:
            a, b = (ms[("round", name, n, c)] for c in contexts)
            x, y = (ms[("attention", name, n, c)] for c in contexts)
            print(
                f"{precision}, {name} cache, {n} sequence(s), context {contexts[0]} -> {context}: "
                f"round {a:.2f} -> {b:.2f} ms (+{b - a:.2f}); attention alone {x:.2f} -> {y:.2f} ms (+{y - x:.2f})"
            )


if __name__ == "__main__":
    main()

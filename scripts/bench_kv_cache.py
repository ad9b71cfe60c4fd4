"""Whole forwards at an integer precision with the float16 KV cache specq uses, against
the same model with float32 caches, interleaved in one process (the machine is shared:
only ratios taken side by side mean anything).

    python scripts/bench_kv_cache.py --precision int16 --context 200
    python scripts/bench_kv_cache.py --precision int16 --context 500
    python scripts/bench_kv_cache.py --model toy.gguf --context 8 --trials 1   # a smoke run (Q4_1 blocks needed)

The float32 variant compiles the integer block loop again for float32 caches (specq
itself compiles it for float16 only) and gives the model float32 caches; everything
else is the same code.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np
from numba import njit
from numba.typed import List

from specq.specdec import int8_stack, layer_stack
from specq.specdec.loader import default_model_path
from specq.specdec.model import KVCache, LlamaModel, Segment

CASES = [(1, 1), (5, 1), (1, 8), (1, 32)]  # (rows of each sequence, sequences)


def with_float32_caches(model: LlamaModel) -> LlamaModel:
    run_many = njit(int8_stack._run.py_func)

    def run_one(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):
        """StackedLayers.run's one-segment call, its lists built here for run_many."""
        lists = List(), List(), List()
        for items, item in zip(lists, (visible, keys, values)):
            items.append(item)
        return run_many(x, positions, starts, bounds, lists[0], weights, rope, lists[1], lists[2], sizes)

    other = LlamaModel(model.config, LlamaModel.load(model.path).weights, precision=model.precision)
    other._stack = replace(other._stack, compiled=(run_many, run_one), cache=layer_stack.CACHE)
    other.new_cache = lambda capacity=256: KVCache(other.config, capacity, np.float32)
    return other


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--precision", default="int16", choices=("int16", "int8"))
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--trials", type=int, default=15)
    args = parser.parse_args()
    half = LlamaModel.load(args.model or default_model_path(), args.precision)
    if half._stack is None:
        raise SystemExit(
            f"{half.path}: no compiled integer layer stack at {args.precision} "
            "(it needs Q4_1 block matrices, as the default model has)"
        )
    models = {"float16": half, "float32": with_float32_caches(half)}
    caches = {}
    for name, model in models.items():
        caches[name] = [model.new_cache(args.context + 8) for _ in range(max(s for _, s in CASES))]
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
        for case in CASES:
            timed(name, *case)
    times = {(name, case): [] for name in models for case in CASES}
    for _ in range(args.trials):
        for case in CASES:
            for name in models:
                times[(name, case)].append(timed(name, *case))
    for case in CASES:
        full, half_ms = (statistics.median(times[(n, case)]) * 1e3 for n in ("float32", "float16"))
        print(
            f"{args.precision}, context {args.context}, {case[0]} row(s) x {case[1]} sequence(s): "
            f"float32 cache {full:.2f} ms, float16 {half_ms:.2f} ms, {full / half_ms:.3f}x"
        )


if __name__ == "__main__":
    main()

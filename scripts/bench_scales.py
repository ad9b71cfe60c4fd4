"""The int16 layer products alone, block scales as float16 (as specq keeps them, int8.py)
against the same matrices with float32 scales, interleaved in one process (the machine
is shared: only ratios taken side by side mean anything).

    python scripts/bench_scales.py --rows 1,2,5,8,32 --trials 31
    python scripts/bench_scales.py --model toy.gguf --rows 1,3 --trials 1   # a smoke run (Q4_1 blocks needed)

Each trial runs every layer's four products (q|k|v, out, gate|up, down) of R random
rows in turn, as a forward does, so the weights come from memory; `--cached` runs the
first layer's products as many times instead, so they come from cache, which shows
whether a row count waits on memory or on arithmetic. Both forms give the same bits
(checked on the first layer before timing).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from numba import config, njit

from specq.errors import SpecqError
from specq.specdec import int8
from specq.specdec.loader import default_model_path
from specq.specdec.model import LlamaModel


@njit(nogil=True)
def _products(xs, arrays, n_out, layers, n_threads):  # pragma: no cover - compiled
    """Every listed layer's four products of xs (width d, then d_ffn for the down
    product); returns a sum so that nothing is optimized away."""
    qq, qd, qm, oq, od, om, gq, gd, gm, dq, dd, dm = arrays
    total = 0.0
    for i in layers:
        total += int8.product_q4_1(xs[0], qq[i], qd[i], qm[i], n_out[0], n_threads, True)[0, 0]
        total += int8.product_q4_1(xs[0], oq[i], od[i], om[i], n_out[1], n_threads, True)[0, 0]
        total += int8.product_q4_1(xs[0], gq[i], gd[i], gm[i], n_out[2], n_threads, True)[0, 0]
        total += int8.product_q4_1(xs[1], dq[i], dd[i], dm[i], n_out[3], n_threads, True)[0, 0]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rows", default="1,2,5,8,32", help="row counts, comma-separated")
    parser.add_argument("--trials", type=int, default=31)
    parser.add_argument("--cached", action="store_true", help="the first layer's products again and again")
    args = parser.parse_args()
    try:
        counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        parser.error("--rows: a comma-separated list of positive row counts")
    try:
        int8.require()
        model = LlamaModel.load(args.model or default_model_path(), "int16")
    except SpecqError as exc:  # a missing or unreadable file, a CPU without AVX2
        parser.error(str(exc))
    stack = model._stack
    if stack is None or stack.arrays[1].dtype != np.uint16:
        raise SystemExit(f"{model.path}: no Q4_1 layer stack with float16 scales (the default model has one)")
    narrow = tuple(stack.arrays)
    wide = tuple(a if i % 3 == 0 else int8.widened(a) for i, a in enumerate(narrow))
    n_out = np.array(stack.n_out, np.int64)
    n_layers = narrow[0].shape[0]
    layers = np.zeros(n_layers, np.int64) if args.cached else np.arange(n_layers)
    threads = config.NUMBA_NUM_THREADS
    rng = np.random.default_rng(0)
    cfg = model.config
    print(f"{model.path}: {n_layers} layers, {'from cache' if args.cached else 'from memory'}, {threads} threads")
    for rows in counts:
        xs = (
            rng.standard_normal((rows, cfg.d_model)).astype(np.float32),
            rng.standard_normal((rows, cfg.d_ffn)).astype(np.float32),
        )
        got, want = (
            int8.product_q4_1(xs[0], a[0][0], a[1][0], a[2][0], n_out[0], threads, True) for a in (narrow, wide)
        )
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "float16 and float32 scales differ"
        times: dict[str, list[float]] = {"float32": [], "float16": []}
        for arrays in (wide, narrow):  # compile and warm up
            _products(xs, arrays, n_out, layers, threads)
        for _ in range(args.trials):
            for name, arrays in (("float32", wide), ("float16", narrow)):
                t0 = time.perf_counter()
                _products(xs, arrays, n_out, layers, threads)
                times[name].append(time.perf_counter() - t0)
        a, b = (statistics.median(times[k]) * 1e3 for k in ("float32", "float16"))
        print(f"{rows} row(s): float32 scales {a:.3f} ms, float16 scales {b:.3f} ms, {a / b:.3f}x")


if __name__ == "__main__":
    main()

"""Attention alone (block_ops.attend_many over every layer) for S sequences of one row
each (or of --rows R, a verification chain's causal rows), their contexts spread over
a block of positions (c to c + 7, so that rows end anywhere in a block, as in decode
rounds), at int16's cache (float16 keys and 8-bit values; float16 values before
2026-12-05, whose block_ops --against cannot take this cache, nor can one from
before the frozen blocks held their value scales, 2026-12-07: it reads the frozen
blocks at other offsets, and the bits check stops it); with --against, another copy
of block_ops (an earlier commit's) interleaved in the same process, its outputs
checked bit for bit against this one's.

A case SxC:L puts the first half of the sequences at context C and the second half
at L: a round whose long sequences all come last, which attention's two threads
must still share evenly.

With --one-cache, every sequence at exactly the context (not spread), timed as it is
beside the same rows all reading the first sequence's cache: the same instructions
and, the caches holding the same tokens, the same bits (checked), but one cache's
bytes, which stay in the CPU's caches. The difference is what attention waits on
memory (32 x 500 on the Intel Xeon with AMX, 2026-12-07: 17.8 ms against 11.9).

    python scripts/bench_attention.py --cases 1x200,32x50,32x200,32x500
    git show 556218f:specq/specdec/block_ops.py > /tmp/block_ops_before.py
    python scripts/bench_attention.py --against /tmp/block_ops_before.py
    python scripts/bench_attention.py --rows 5 --cases 1x200,1x500   # a 5-row verification
    python scripts/bench_attention.py --cases 8x500,32x200,32x500 --one-cache
    python scripts/bench_attention.py --cases 32x150:850 --against /tmp/block_ops_before.py   # short ones first
    python scripts/bench_attention.py --model toy.gguf --cases 2x8 --trials 1   # a smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import numpy as np
from numba.typed import List

from specq.errors import SpecqError
from specq.specdec import block_ops
from specq.specdec.loader import default_model_path
from specq.specdec.model import LlamaModel, Segment


def _module(path: str):
    spec = importlib.util.spec_from_file_location("block_ops_against", path)
    module = importlib.util.module_from_spec(spec)
    # numba's cache, loading the module's compiled functions on a second run, imports
    # the module by name: without this entry that import failed (ModuleNotFoundError).
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _cases(text: str) -> list[tuple[int, int, int]]:
    """(sequences, context, long context): SxC, or SxC:L for half the sequences at C
    and then half at L."""
    cases = []
    for part in text.split(","):
        seqs, _, contexts = part.partition("x")
        context, colon, long = contexts.partition(":")
        if not (seqs.isdigit() and context.isdigit() and int(seqs) > 0) or (colon and not long.isdigit()):
            raise ValueError(f"{part} is not SEQUENCESxCONTEXT (e.g. 32x200, or 32x150:850)")
        if long and int(seqs) % 2:
            raise ValueError(f"{part}: a case of two contexts takes an even number of sequences")
        long = long or context
        cases.append((int(seqs), int(context), int(long)))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--cases",
        default="1x200,32x50,32x100,32x200,32x500",
        help="SEQUENCESxCONTEXT (or SEQUENCESxCONTEXT:LONG, half the sequences at each), comma-separated",
    )
    parser.add_argument("--trials", type=int, default=21)
    parser.add_argument("--rows", type=int, default=1, help="rows of each sequence's segment (causal)")
    parser.add_argument("--against", default=None, help="another block_ops.py to time beside this one")
    parser.add_argument(
        "--one-cache", action="store_true", help="also time every sequence reading the first one's cache"
    )
    args = parser.parse_args()
    try:
        cases = _cases(args.cases)
    except ValueError as e:
        parser.error(f"--cases: {e}")
    if args.one_cache and any(context != long for _, context, long in cases):
        parser.error("--one-cache: every sequence reads the first one's cache, so a case takes one context (SxC)")
    if args.rows < 1:
        parser.error(f"--rows: {args.rows} is not a number of rows (1 or more)")
    modules = {"now": block_ops}
    if args.against and args.one_cache:
        parser.error("--one-cache and --against: one comparison at a time")
    if args.against and not os.path.isfile(args.against):
        parser.error(f"--against: no file {args.against}")
    if args.against:
        against = _module(args.against)
        if not callable(getattr(against, "attend_many", None)):
            parser.error(f"--against: {args.against} has no attend_many (a block_ops.py is wanted)")
        modules = {"against": against, "now": block_ops}
    try:
        model = LlamaModel.load(args.model or default_model_path(), "int16")
    except SpecqError as exc:  # a missing or unreadable file, a CPU without AVX2
        parser.error(str(exc))
    cfg = model.config
    scale = np.float32(cfg.attention_scale)
    rng = np.random.default_rng(0)
    rows = args.rows
    for n, context, long in cases:
        lengths = [context if args.one_cache else context + j % 8 for j in range(n)]
        lengths = [length - context + long if j >= n // 2 else length for j, length in enumerate(lengths)]
        caches = [model.new_cache(length + rows + 8) for length in lengths]
        for cache, length in zip(caches, lengths):  # the segments' own rows are in the cache too
            model.forward([Segment(cache, [5 + i % 7 for i in range(length + rows)], 0, all_logits=False)])
        # Per timed variant: (block_ops, its caches' keys, values).
        own = (List([c.kernel_keys for c in caches]), List([c.kernel_values for c in caches]))
        runs = {name: (module, *own) for name, module in modules.items()}
        if args.one_cache:
            first = caches[0]
            runs["one cache"] = (block_ops, List([first.kernel_keys] * n), List([first.kernel_values] * n))
        visible = List([np.tri(rows, dtype=np.bool_) for _ in caches])
        q = rng.standard_normal((n * rows, cfg.n_heads, cfg.head_dim)).astype(np.float32)
        starts, bounds = np.array(lengths, np.int64), np.arange(0, n * rows + 1, rows, dtype=np.int64)
        outputs = [m.attend_many(q, starts, bounds, visible, k, v, 0, scale) for m, k, v in runs.values()]
        assert all(np.array_equal(o.view(np.uint32), outputs[0].view(np.uint32)) for o in outputs), "bits differ"
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.trials):
            for name, (module, keys, values) in runs.items():
                t0 = time.perf_counter()
                for layer in range(cfg.n_layers):
                    module.attend_many(q, starts, bounds, visible, keys, values, layer, scale)
                times[name].append(time.perf_counter() - t0)
        parts = [f"{name} {statistics.median(t) * 1e3:.3f} ms" for name, t in times.items()]
        if args.against:
            ratio = statistics.median(a / b for a, b in zip(times["against"], times["now"]))
            parts.append(f"against / now {ratio:.3f} (median of pairs)")
        if args.one_cache:
            ratio = statistics.median(a / b for a, b in zip(times["now"], times["one cache"]))
            parts.append(f"now / one cache {ratio:.3f} (median of pairs)")
        each = f"{rows} rows each, " if rows > 1 else ""
        spread = f"context {context}" if args.one_cache else f"context {context} to {context + 7}"
        if long != context:  # never with --one-cache
            spread += f", then half at {long} to {long + 7}"
        print(f"{n} sequence(s), {spread}, {each}{cfg.n_layers} layers: " + ", ".join(parts))


if __name__ == "__main__":
    main()

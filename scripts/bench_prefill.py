#!/usr/bin/env python3
"""A prompt's prefill (one forward from position 0, last row's logits only) on the
default model, as specq computes it now against the way it did before 2026-12-01's
second pass, timed interleaved in one process:

  before  each weight dequantized row by row, then x @ w.T; attention over the whole
          n x T square of scores at once
  now     each weight dequantized straight into [n_in, n_out] (QuantizedMatrix.
          dequantize_t), then x @ that; attention in blocks of query rows, each
          against only the keys it sees

The logits agree to about 2e-5 (printed): the blocks' softmax sums run over fewer
masked zeros, so they round a little differently. Figures are medians over the
trials; the ratio is taken within each trial, so it survives a noisy machine better
than the times do.

Usage:  python scripts/bench_prefill.py [--lengths 109,400,1000,2000] [--trials 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import specq.specdec.products as products
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.model import LlamaModel, Segment


def whole_square_attend(self, seg, visible, q_scaled, cache_k, cache_v):
    """LlamaModel._attend_prompt as it was: every score of the segment at once."""
    cfg = self.config
    n, end = seg.n, seg.start + seg.n
    group = cfg.n_heads // cfg.n_kv_heads
    qg = q_scaled.transpose(1, 0, 2).reshape(cfg.n_kv_heads, group * n, cfg.head_dim)
    scores = (qg @ cache_k[:, :, :end]).reshape(cfg.n_kv_heads, group, n, end)
    hidden_from = np.zeros((n, end), dtype=bool)
    hidden_from[:, seg.start :] = ~visible
    scores = np.where(hidden_from, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs.reshape(cfg.n_kv_heads, group * n, end) @ cache_v[:, :end]
    return out.reshape(cfg.n_heads, n, cfg.head_dim).transpose(1, 0, 2).reshape(n, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="109,400,1000,2000")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    model, _ = load_model_and_tokenizer(default_model_path())
    current_attend, current_dense_t = LlamaModel._attend_prompt, products.dequantized_t
    ways = {
        "before": (whole_square_attend, lambda w: products.dequantized(w).T),
        "now": (current_attend, current_dense_t),
    }
    times: dict = {}
    logits: dict = {}
    for _ in range(args.trials):
        for n in lengths:
            ids = [5 + (i * 7) % 1000 for i in range(n)]  # any ids: the cost does not depend on them
            for way, (attend, dense_t) in ways.items():
                LlamaModel._attend_prompt, products.dequantized_t = attend, dense_t
                cache = model.new_cache(n + 1)
                t0 = time.perf_counter()
                out = model.forward([Segment(cache, ids, 0, all_logits=False)])[0]
                times.setdefault((n, way), []).append(time.perf_counter() - t0)
                logits[n, way] = out.logits
    LlamaModel._attend_prompt, products.dequantized_t = current_attend, current_dense_t
    print(f"prefill from position 0, {args.trials} trials, median ms (tokens/s):")
    for n in lengths:
        before, now = (statistics.median(times[n, w]) for w in ways)
        ratio = statistics.median(b / a for b, a in zip(times[n, "before"], times[n, "now"]))
        same = np.array_equal(logits[n, "before"], logits[n, "now"])
        diff = float(np.abs(logits[n, "before"] - logits[n, "now"]).max())
        print(f"  {n:5} tokens  before {1e3 * before:7.0f} ms ({n / before:4.0f})  now {1e3 * now:7.0f} ms "
              f"({n / now:4.0f})  before/now {ratio:.2f}x  same logits: {same} (max diff {diff:.1e})")


if __name__ == "__main__":
    main()

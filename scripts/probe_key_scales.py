#!/usr/bin/env python3
"""How much 8-bit keys would change the model's predictions, by the grouping of their
scales (docs/performance.md, tenth session).

Simulated on the f32 model: after every forward, the keys it wrote are rounded to
int8 with one float32 scale per group of G dimensions of each head (the largest
magnitude maps to 127) and written back; values stay float32. Each prompt is
prefilled, then the f32 model's own greedy continuation is fed one token a step, so
every position compares the candidate's next-token prediction with that token
(top-1 agreement) and with f32's distribution (KL), as `specq bench --quality` does.
Group 0 is the check: float32 keys, the same step-by-step path, must agree at 100%.

Usage:  python scripts/probe_key_scales.py [--groups 0,64,32,16,8] [--input F] [--max-tokens 128]
                                          [--model PATH]
"""

from __future__ import annotations

import argparse

import numpy as np

from specq.errors import SpecqError
from specq.quality import _log_softmax, continuation_tokens, greedy
from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.model import KVCache, Segment


def round_keys(cache: KVCache, positions, group: int, head_dim: int) -> None:
    """The keys at `positions` as int8 with a scale per `group` dimensions, in place.
    Keys lie in blocks of 8 positions, dimension d of lane p at d * 8 + p (KVCache)."""
    keys = cache.all_keys
    for p in positions:
        block, lane = divmod(p, 8)
        at = np.arange(head_dim) * 8 + lane
        k = keys[:, :, block, at]  # [layers, kv heads, head_dim]
        grouped = k.reshape(*k.shape[:2], head_dim // group, group)
        largest = np.abs(grouped).max(axis=-1, keepdims=True)
        scale = np.where(largest > 0, largest / np.float32(127), np.float32(1)).astype(np.float32)
        keys[:, :, block, at] = (np.rint(grouped / scale) * scale).reshape(k.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", default="0,64,32,16,8", help="dimensions a scale covers (0: float32 keys)")
    ap.add_argument("--input", default="examples/bench_prompts.jsonl")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="a GGUF file (default: the shipped model)")
    args = ap.parse_args()
    try:
        groups = [int(g) for g in args.groups.split(",")]
    except ValueError:
        raise SystemExit(f"--groups {args.groups!r}: not a list of numbers") from None
    if args.max_tokens < 1:
        raise SystemExit("--max-tokens must be at least 1")
    try:
        specs = read_jsonl(args.input)
        model, tokenizer = load_model_and_tokenizer(args.model or default_model_path(), "f32")
    except SpecqError as exc:  # a missing or unreadable file, a CPU without AVX2
        raise SystemExit(str(exc)) from None
    head_dim = model.config.head_dim
    if bad := [g for g in groups if g < 0 or (g and head_dim % g)]:
        raise SystemExit(f"--groups {bad}: each must divide the head's {head_dim} dimensions (or be 0)")
    totals = {g: [0, 0, 0.0] for g in groups}  # agreeing positions, positions, KL sum
    for spec in specs:
        prompt = list(to_request(spec, tokenizer, GenerationDefaults()).prompt_ids)
        try:
            n = continuation_tokens(model, spec, prompt, args.max_tokens)
        except SpecqError as exc:  # a prompt that fills the context
            raise SystemExit(str(exc)) from None
        continuation = greedy(model, prompt, n, tokenizer.end_of_turn_ids)
        tokens = prompt + continuation
        reference = model.forward([Segment(model.new_cache(len(tokens)), tokens, 0)])[0].logits
        reference = _log_softmax(reference[len(prompt) - 1 : len(tokens) - 1])
        for g in groups:
            cache = model.new_cache(len(tokens) + 8)
            rows = [model.forward([Segment(cache, prompt, 0, all_logits=False)])[0].logits[-1]]
            if g:
                round_keys(cache, range(len(prompt)), g, head_dim)
            for j, token in enumerate(continuation[:-1]):
                rows.append(model.forward([Segment(cache, [token], len(prompt) + j)])[0].logits[-1])
                if g:
                    round_keys(cache, [len(prompt) + j], g, head_dim)
            candidate = np.stack(rows)
            total = totals[g]
            total[0] += int((candidate.argmax(-1) == np.array(continuation)).sum())
            total[1] += len(continuation)
            total[2] += float((np.exp(reference) * (reference - _log_softmax(candidate))).sum())
    for g, (agree, n, kl) in totals.items():
        name = f"one scale per {g} dimensions" if g else "float32 keys (the check)"
        print(f"{name}: top-1 agreement {100 * agree / n:.2f}% of {n} positions, mean KL {kl / n:.6f} nats")


if __name__ == "__main__":
    main()

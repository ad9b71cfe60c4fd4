#!/usr/bin/env python3
"""How much 8-bit keys would change the model's predictions, by how their scales are
grouped (docs/performance.md, tenth and thirteenth sessions).

Simulated: after every forward, the keys it wrote are rounded to 8 bits and written
back; values stay as the cache keeps them. Two kinds of rounding:
- `--groups G`: each position's key, one float32 scale per G dimensions of a head
  (the largest magnitude maps to 127; int8's cache is G = head_dim);
- `--blocks B`: per channel over a block of B positions, with a minimum (KIVI's
  keys): each dimension of each head gets a float16 minimum and a float16 step
  ((largest - smallest) / 255) over the block, and its B values become 0 to 255
  steps above the minimum. A block is rounded once its last position is written;
  the positions of the block still being written keep the cache's own keys, as a
  cache that rounds a block only when it is whole would have to.
Rounded keys are stored back at the cache's type: at int16, float16, one more
rounding than an 8-bit cache would make (a relative 2^-11, far below 8 bits').

Each prompt is prefilled, then the f32 model's own greedy continuation is fed one
token a step, so every position compares the candidate's next-token prediction with
that token (top-1 agreement) and with f32's distribution (KL), as `specq bench
--quality` does. The candidate runs at `--precision` (f32, or int16 with its float16
keys and 8-bit values). Group 0 is the check: the cache's own keys by the same
step-by-step path, which at f32 must agree at 100%.

Usage:  python scripts/probe_key_scales.py [--groups 0,64,32,16,8] [--blocks 8,16,32]
                                          [--precision f32|int16] [--input F]
                                          [--max-tokens 128] [--model PATH]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from specq.errors import SpecqError
from specq.quality import _log_softmax, continuation_tokens, greedy
from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.block_ops import KEY_BLOCK
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.model import KVCache, Segment

PRECISIONS = ("f32", "int16")


def key_blocks(cache: KVCache, head_dim: int) -> np.ndarray:
    """The cache's keys as float arrays [layers, kv heads, blocks, head_dim, 8]: a view
    (KVCache keeps keys in blocks of 8 positions, dimension d of lane p at d * 8 + p;
    float16 keys are stored as their bits)."""
    keys = cache.all_keys
    if keys.dtype == np.uint16:
        keys = keys.view(np.float16)
    keys = keys[..., : head_dim * KEY_BLOCK]
    return keys.reshape(*keys.shape[:-1], head_dim, KEY_BLOCK)


def round_groups(blocks: np.ndarray, positions: range, group: int) -> None:
    """The keys at `positions` as int8 with a scale per `group` dimensions, in place."""
    for p in positions:
        block, lane = divmod(p, KEY_BLOCK)
        k = blocks[:, :, block, :, lane].astype(np.float32)  # [layers, kv heads, head_dim]
        grouped = k.reshape(*k.shape[:2], -1, group)
        largest = np.abs(grouped).max(axis=-1, keepdims=True)
        scale = np.where(largest > 0, largest / np.float32(127), np.float32(1)).astype(np.float32)
        blocks[:, :, block, :, lane] = (np.rint(grouped / scale) * scale).reshape(k.shape)


def round_channels(blocks: np.ndarray, first: int, size: int) -> None:
    """Positions first .. first + size - 1 (whole blocks of 8) per channel, 8 bits
    above a float16 minimum in float16 steps, in place."""
    span = slice(first // KEY_BLOCK, (first + size) // KEY_BLOCK)
    k = blocks[:, :, span].astype(np.float32)  # [layers, kv heads, size / 8, head_dim, 8]
    low = k.min(axis=(2, 4), keepdims=True).astype(np.float16).astype(np.float32)
    high = k.max(axis=(2, 4), keepdims=True)
    step = np.where(high > low, (high - low) / np.float32(255), np.float32(1))
    step = step.astype(np.float16).astype(np.float32)
    blocks[:, :, span] = low + np.clip(np.rint((k - low) / step), 0, 255) * step


def rounder(kind: str, size: int, blocks: np.ndarray) -> Callable[[int], None]:
    """A function called with how many positions the cache holds after each forward,
    rounding what it has not rounded yet."""
    done = 0

    def after(written: int) -> None:
        nonlocal done
        if kind == "groups" and size:
            round_groups(blocks, range(done, written), size)
            done = written
        while kind == "blocks" and done + size <= written:
            round_channels(blocks, done, size)
            done += size

    return after


def variant_name(kind: str, size: int, precision: str) -> str:
    if kind == "blocks":
        return f"per channel over {size} positions, with a minimum"
    if size:
        return f"one scale per {size} dimensions"
    return "float32 keys (the check)" if precision == "f32" else f"{precision}'s own keys"


def numbers(text: str, option: str) -> list[int]:
    try:
        return [int(g) for g in text.split(",") if g]
    except ValueError:
        raise SystemExit(f"{option} {text!r}: not a list of numbers") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", default="0,64,32,16,8", help="dimensions a scale covers (0: the cache's keys)")
    ap.add_argument("--blocks", default="", help="positions a channel's minimum and step cover (multiples of 8)")
    ap.add_argument("--precision", default="f32", help="the candidate's: f32 or int16")
    ap.add_argument("--input", default="examples/bench_prompts.jsonl")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="a GGUF file (default: the shipped model)")
    args = ap.parse_args()
    groups, sizes = numbers(args.groups, "--groups"), numbers(args.blocks, "--blocks")
    if not groups and not sizes:
        raise SystemExit("--groups and --blocks name nothing to compare")
    if args.max_tokens < 1:
        raise SystemExit("--max-tokens must be at least 1")
    if args.precision not in PRECISIONS:
        raise SystemExit(f"--precision {args.precision!r}: one of {', '.join(PRECISIONS)}")
    if bad := [b for b in sizes if b < KEY_BLOCK or b % KEY_BLOCK]:
        raise SystemExit(f"--blocks {bad}: each must be a multiple of {KEY_BLOCK} positions")
    try:
        specs = read_jsonl(args.input)
        path = args.model or default_model_path()
        model, tokenizer = load_model_and_tokenizer(path, "f32")
        candidate = model if args.precision == "f32" else load_model_and_tokenizer(path, args.precision)[0]
    except SpecqError as exc:  # a missing or unreadable file, a CPU without AVX2
        raise SystemExit(str(exc)) from None
    head_dim = model.config.head_dim
    if bad := [g for g in groups if g < 0 or (g and head_dim % g)]:
        raise SystemExit(f"--groups {bad}: each must divide the head's {head_dim} dimensions (or be 0)")
    variants = [("groups", g) for g in groups] + [("blocks", b) for b in sizes]
    totals = {v: [0, 0, 0.0] for v in variants}  # agreeing positions, positions, KL sum
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
        for kind, size in variants:
            cache = candidate.new_cache(len(tokens) + KEY_BLOCK)
            after = rounder(kind, size, key_blocks(cache, head_dim))
            rows = [candidate.forward([Segment(cache, prompt, 0, all_logits=False)])[0].logits[-1]]
            after(len(prompt))
            for j, token in enumerate(continuation[:-1]):
                rows.append(candidate.forward([Segment(cache, [token], len(prompt) + j)])[0].logits[-1])
                after(len(prompt) + j + 1)
            predicted = np.stack(rows)
            total = totals[kind, size]
            total[0] += int((predicted.argmax(-1) == np.array(continuation)).sum())
            total[1] += len(continuation)
            total[2] += float((np.exp(reference) * (reference - _log_softmax(predicted))).sum())
    for (kind, size), (agree, n, kl) in totals.items():
        name = variant_name(kind, size, args.precision)
        print(f"{name}: top-1 agreement {100 * agree / n:.2f}% of {n} positions, mean KL {kl / n:.6f} nats")


if __name__ == "__main__":
    main()

"""Where a forward's time goes, at the int16 precision: the whole forward of R rows,
then the same forward with its layers' matrix products left out, and with its
attention left out. R rows of one sequence (a verification chain) and R sequences of
one row each (a decode round), every sequence at --context positions of the bench
mix's text (examples/bench_prompts.jsonl), its rows the text's next tokens.

    python scripts/bench_forward_parts.py --rows 1,5,8,64 --context 200

Per shape it prints the forward's median time and its parts:
- products: the layers' four products (q|k|v, attention output, gate|up, down);
- attention: RoPE, the cache writes and attention over the cache;
- the rest of the layers: RMSNorm, the activations' quantization, SwiGLU's gate, the
  residual additions;
- outside the layers: the embedding, the final norm and the output head.

The layers run in a copy of the compiled loop (int8_stack._run) with a part switched
off; a part's time is the whole loop's less the loop's without it, each timed inside
the real forward (the forward's own time is the copy's, nothing switched off). The
copy with nothing switched off must give the real loop's bits (checked first), so a
change to the loop that this copy has not followed stops the script instead of
timing something else. Each figure is the median of --trials forwards of one shape,
the variants taking turns, each timed forward after 6 untimed ones of the same
variant: on a CPU whose L3 holds the weights, forwards take several steps to settle
after a different one (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from numba import njit

from specq.errors import SpecqError
from specq.specdec import int8
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.model import Segment

PROMPTS = Path(__file__).resolve().parent.parent / "examples" / "bench_prompts.jsonl"
SETTLE = 6  # untimed forwards of a variant before each timed one


def _loop(products: bool, attention: bool):
    """int8_stack._run with the products or attention switched off (constants when
    compiled). Left out, a product's output is a constant array of its shape, and
    attention's the q part of q|k|v: the parts after them see inputs of the same
    shapes."""
    from specq.specdec import int8_stack
    from specq.specdec.layer_stack import attention as attend
    from specq.specdec.layer_stack import one

    @njit(nogil=True)
    def run(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):  # pragma: no cover - compiled
        attn_norm, ffn_norm, qkv_q, qkv_d, qkv_m, out_q, out_d, out_m, gu_q, gu_d, gu_m, down_q, down_d, down_m = (
            weights
        )
        cos, sin = rope
        n_heads, n_qkv, d_ffn, eps, scale, n_threads, split = sizes
        n, d = x.shape
        some_qkv = np.full((n, n_qkv), np.float32(0.01))
        some_gate_up = np.full((n, 2 * d_ffn), np.float32(0.01))
        for layer in range(qkv_q.shape[0]):
            h = int8_stack._normed(x, attn_norm[layer], eps, split, n_threads)
            qkv = some_qkv
            if products:
                qkv = int8.product_q4_1_of(h, n, d, qkv_q[layer], qkv_d[layer], qkv_m[layer], n_qkv, n_threads, split)
            if attention:
                attn = attend(x, qkv, positions, starts, bounds, visible, cos, sin, keys, values, layer, n_heads, scale)
            else:
                attn = np.ascontiguousarray(qkv[:, :d])
            if products:
                x = x + int8.product_q4_1(attn, out_q[layer], out_d[layer], out_m[layer], d, n_threads, split)
            h = int8_stack._normed(x, ffn_norm[layer], eps, split, n_threads)
            gate_up = some_gate_up
            if products:
                gate_up = int8.product_q4_1_of(
                    h, n, d, gu_q[layer], gu_d[layer], gu_m[layer], 2 * d_ffn, n_threads, split
                )
            gated = int8_stack._gated(gate_up, d_ffn, split, n_threads)
            if products:
                x = x + int8.product_q4_1_of(
                    gated, n, d_ffn, down_q[layer], down_d[layer], down_m[layer], d, n_threads, split
                )
        return x

    @njit(nogil=True)
    def run_one(x, positions, starts, bounds, visible, weights, rope, keys, values, sizes):  # pragma: no cover
        return run(x, positions, starts, bounds, one(visible), weights, rope, one(keys), one(values), sizes)

    return run, run_one


class _Timed:
    """The stack's run, timed: the layers' share of each forward."""

    def __init__(self, stack) -> None:
        self.stack, self.real = stack, stack.compiled
        self.seconds = 0.0
        self._run = stack.run

    def use(self, compiled) -> None:
        object.__setattr__(self.stack, "compiled", compiled)

    def __call__(self, *args):
        t0 = time.perf_counter()
        out = self._run(*args)
        self.seconds += time.perf_counter() - t0
        return out


def _text_ids(tokenizer, n: int) -> list[int]:
    """n token ids of the bench mix's text, repeated as needed: a forward of real text
    gives the output head's screen (head_screen.py) the few candidates it finds on
    real hidden states, where repeated made-up tokens made it take the whole head
    as well."""
    texts = []
    with open(PROMPTS) as fh:
        for line in fh:
            item = json.loads(line)
            texts += [m["content"] for m in item.get("messages", [])] + [item.get("prompt", "")]
    ids = tokenizer.encode(" ".join(t for t in texts if t))
    return (ids * (n // len(ids) + 1))[:n]


def _segments(caches, ids: list[int], rows: int, context: int) -> list[Segment]:
    """Rows of one sequence (one cache) or a row of each; each sequence i holds the
    text from token i, and its rows are the text's next tokens."""
    if len(caches) == 1:
        return [Segment(caches[0], ids[context : context + rows], context, argmax_only=True)]
    return [Segment(cache, [ids[i + context]], context, argmax_only=True) for i, cache in enumerate(caches)]


def _timed(model, timer: _Timed, variants: dict, segments, trials: int) -> dict[str, tuple[float, float]]:
    """Per variant, (forward, layers) medians in ms. The variants take turns, a
    forward each after SETTLE of their own, so that the machine's drift falls on
    them alike."""
    whole: dict[str, list[float]] = {name: [] for name in variants}
    layers: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(trials):
        for name, compiled in variants.items():
            timer.use(compiled)
            for _ in range(SETTLE):
                model.forward(segments)
            timer.seconds = 0.0
            t0 = time.perf_counter()
            model.forward(segments)
            whole[name].append(time.perf_counter() - t0)
            layers[name].append(timer.seconds)
    timer.use(timer.real)
    return {name: (statistics.median(whole[name]) * 1e3, statistics.median(layers[name]) * 1e3) for name in variants}


def _same_bits(model, timer: _Timed, copy, segments) -> bool:
    """Whether the copied loop, nothing switched off, gives the real loop's hidden
    states (the forward's argmax rows come from them)."""
    outputs = []
    for compiled in (timer.real, copy):
        timer.use(compiled)
        outputs.append([o.hidden.copy() for o in model.forward(segments)])
    timer.use(timer.real)
    return all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(*outputs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rows", default="1,5,8,32,64", help="comma-separated row counts")
    parser.add_argument("--context", type=int, default=200, help="positions in each sequence's cache")
    parser.add_argument("--trials", type=int, default=15)
    args = parser.parse_args()
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: {args.rows!r} is not a comma-separated list of numbers")
    if not rows or min(rows) < 1:
        parser.error(f"--rows: {args.rows} must be numbers of rows, 1 or more")
    if args.context < 1 or args.trials < 1:
        parser.error("--context and --trials must be 1 or more")
    if not int8.AVAILABLE:
        parser.error("the int16 precision needs a CPU with AVX2")
    try:
        model, tokenizer = load_model_and_tokenizer(args.model or default_model_path(), "int16")
    except SpecqError as exc:  # a missing or unreadable file
        parser.error(str(exc))
    from specq.specdec import int8_stack

    stack = model._stack
    if stack is None or stack.compiled[1] is not int8_stack._run_one:
        parser.error("this model's layers do not run in the compiled Q4_1 loop (every block matrix Q4_1)")
    if max(rows) >= model._stack_rows:
        parser.error(f"--rows: forwards of {model._stack_rows} rows or more take the prompt path, not this loop")
    if args.context + max(rows) >= model.config.context_length:
        parser.error(f"--context: {args.context} and {max(rows)} rows do not fit the model's context")
    timer = _Timed(stack)
    object.__setattr__(stack, "run", timer)
    variants = {"whole": _loop(True, True), "no products": _loop(False, True), "no attention": _loop(True, False)}

    n_caches = max(rows)
    ids = _text_ids(tokenizer, args.context + 2 * n_caches)
    caches = [model.new_cache(args.context + n_caches + 8) for _ in range(n_caches)]
    for i, cache in enumerate(caches):
        model.forward([Segment(cache, ids[i : i + args.context], 0, all_logits=False)])
    shapes = [(1, 1)] + [(r, 1) for r in rows if r > 1] + [(1, r) for r in rows if r > 1]
    shapes = sorted(set(shapes), key=lambda s: (s[1] > 1, s[0] * s[1]))
    # Both of the copy's entry points: a sequence's rows, and a row of each of two.
    for checked in (_segments(caches[:1], ids, 2, args.context), _segments(caches[:2], ids, 1, args.context)):
        if not _same_bits(model, timer, variants["whole"], checked):
            raise SystemExit("the copied loop no longer gives the real loop's bits: follow int8_stack._run's changes")
    print(f"int16, context {args.context}, medians of {args.trials} forwards, each after {SETTLE} of its own")
    for per_seq, n_seqs in shapes:
        segments = _segments(caches[:n_seqs], ids, per_seq, args.context)
        times = _timed(model, timer, variants, segments, args.trials)
        forward, layers = times["whole"]
        products = layers - times["no products"][1]
        attention = layers - times["no attention"][1]
        rest = layers - products - attention
        outside = forward - layers
        what = "1 row"
        if n_seqs > 1:
            what = f"{n_seqs} sequences of 1 row"
        elif per_seq > 1:
            what = f"{per_seq} rows of one sequence"
        parts = ", ".join(
            f"{label} {ms:.2f} ms ({100 * ms / forward:.0f}%)"
            for label, ms in (
                ("products", products),
                ("attention", attention),
                ("rest of the layers", rest),
                ("outside the layers", outside),
            )
        )
        print(f"{what}: forward {forward:.2f} ms = {parts}", flush=True)


if __name__ == "__main__":
    main()

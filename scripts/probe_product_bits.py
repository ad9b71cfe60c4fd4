#!/usr/bin/env python3
"""int16 with some kinds of its products at 8-bit activations: how far each moves the
predictions from f32's (docs/performance.md, tenth session).

int8 (8-bit activations for every product) predicts f32's next token at about 97% of
the bench mix's positions, below issue 14's 99% for a default, while its rows cost
about 0.7x int16's. This asks which products carry the loss: the int16 model is
built, its layer stack set aside (the Python path multiplies each matrix by its own
`split`), and the named kinds get int8's 8-bit activations. Each variant is compared
with f32 as `specq bench --quality` compares a precision (specq.quality).

Usage:  python scripts/probe_product_bits.py [--variants ,w_out,w_down,w_gate_up,w_qkv]
                                             [--input F] [--max-tokens 128] [--model PATH]
        (a variant names kinds joined by +; the empty one is int16 itself)
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from specq.errors import SpecqError
from specq.quality import QualityReport, compare, continuation_tokens
from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.int8 import Int8Matrix
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.precision import require_integer

KINDS = ("w_qkv", "w_out", "w_gate_up", "w_down")


def with_8_bit(f32, kinds: list[str]):
    model = f32.at_precision("int16")
    model._stack = None  # the compiled loop takes one split for every product
    layers = model.weights.layers
    if any(not isinstance(getattr(lw, k), Int8Matrix) for lw in layers for k in kinds):
        raise SystemExit(f"--model: its {', '.join(kinds)} matrices are not all of integer blocks at int16")
    layers = tuple(replace(lw, **{k: replace(getattr(lw, k), split=False) for k in kinds}) for lw in layers)
    model.weights = replace(model.weights, layers=layers)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",w_out,w_down,w_gate_up,w_qkv")
    ap.add_argument("--input", default="examples/bench_prompts.jsonl")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="a GGUF file of Q4_1/Q8_0 blocks (default: the shipped model)")
    args = ap.parse_args()
    variants = [v.split("+") if v else [] for v in args.variants.split(",")]
    if unknown := sorted({k for v in variants for k in v} - set(KINDS)):
        raise SystemExit(f"--variants: unknown kinds {', '.join(unknown)} (choose from {', '.join(KINDS)})")
    if args.max_tokens < 1:
        raise SystemExit("--max-tokens must be at least 1")
    try:
        require_integer()
        specs = read_jsonl(args.input)
        f32, tokenizer = load_model_and_tokenizer(args.model or default_model_path(), "f32")
    except SpecqError as exc:  # a missing or unreadable file, a CPU without AVX2
        raise SystemExit(str(exc)) from None
    models = {"+".join(v) or "int16": with_8_bit(f32, v) for v in variants}
    reports = {name: QualityReport() for name in models}
    for spec in specs:
        prompt = to_request(spec, tokenizer, GenerationDefaults()).prompt_ids
        try:
            n = continuation_tokens(f32, spec, prompt, args.max_tokens)
        except SpecqError as exc:  # a prompt that fills the context
            raise SystemExit(str(exc)) from None
        for name, model in models.items():
            compare(f32, model, [prompt], n, tokenizer.end_of_turn_ids, reports[name])
    for name, report in reports.items():
        print(f"{name} at 8 bits:" if name != "int16" else "int16:", report.format(name), sep="\n")


if __name__ == "__main__":
    main()

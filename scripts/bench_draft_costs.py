"""Drafting by measured costs against the lone, constant figures, in one process.

Three engines on one model take turns, pass by pass, in an order that rotates every
repetition: plain decoding, the proposer drafting by the constant row cost of its
precision (every request as if alone), and the proposer drafting by the costs the
engine measures (greedy requests: their share of a batched round). Each figure is a
median of ratios to plain decoding taken within one repetition, since the machine's
speed drifts more between passes than the effect measured.

    python scripts/bench_draft_costs.py --batch-size 1,8 --repeat 6

Prints, per batch size and engine, tokens/s (prefill included), the median ratio to
plain decoding, tokens drafted and accepted; and refuses outputs that differ from
plain decoding's (greedy).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.draft_costs import MeasuredCosts
from specq.specdec.engine import Engine
from specq.specdec.loader import default_model_path, load_model_and_tokenizer, make_proposer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default="examples/bench_prompts.jsonl")
    p.add_argument("--model", default=None)
    p.add_argument("--precision", default="int16")
    p.add_argument("--proposer", default="auto")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch-size", default="1,8")
    p.add_argument("--repeat", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    model, tokenizer = load_model_and_tokenizer(args.model or default_model_path(), args.precision)
    proposer = make_proposer(args.proposer, model, tokenizer)
    engines = {
        "plain": Engine(model, tokenizer, make_proposer("none", model, tokenizer)),
        "lone costs": Engine(model, tokenizer, proposer),
        "measured costs": Engine(model, tokenizer, proposer, MeasuredCosts()),
    }
    defaults = GenerationDefaults(max_tokens=args.max_tokens, k=args.k)
    requests = [
        to_request(replace(s, overrides={**s.overrides, "max_tokens": args.max_tokens}), tokenizer, defaults)
        for s in read_jsonl(args.input)
    ]
    names = list(engines)
    for size in [int(b) for b in args.batch_size.split(",")]:
        rates: dict[str, list[float]] = {name: [] for name in names}
        counts: dict[str, tuple[int, int]] = {}
        outputs: dict[str, list[tuple[int, ...]]] = {}
        for rep in range(args.repeat):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                engine = engines[name]
                t0 = time.perf_counter()
                states = engine.run_many(requests, group_size=size) if size > 1 else [engine.run(r) for r in requests]
                seconds = time.perf_counter() - t0
                rates[name].append(sum(len(s.output_ids) for s in states) / seconds)
                counts[name] = (sum(s.metrics.drafted for s in states), sum(s.metrics.accepted for s in states))
                outputs[name] = [s.output_ids for s in states]
            if any(outputs[name] != outputs["plain"] for name in names):
                raise SystemExit(f"batch size {size}: outputs differ from plain decoding's")
        print(f"batch size {size}, {len(requests)} requests, {args.repeat} repetitions, {args.precision}:")
        for name in names:
            ratios = [a / b for a, b in zip(rates[name], rates["plain"])]
            drafted, accepted = counts[name]
            print(
                f"  {name:15s} {statistics.median(rates[name]):7.1f} tokens/s  "
                f"{statistics.median(ratios):.3f}x plain (median of ratios; {min(ratios):.2f}-{max(ratios):.2f})  "
                f"drafted {drafted}, accepted {accepted}"
            )


if __name__ == "__main__":
    main()

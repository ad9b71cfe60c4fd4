"""The precisions side by side in one process: f32, int16 and int8 on the same prompts.

`specq bench` loads one model at one precision, so two runs would compare two moments
of a shared, noisy machine. Here the three models (the same weights) take turns,
pass by pass, and each figure is a median of ratios taken within one repetition.

    python scripts/bench_precision.py --input examples/bench_prompts.jsonl --batch-size 1,8,32 --repeat 2
    python scripts/bench_precision.py --copies 4 --batch-size 8,16,32,64 --proposer none

Prints, per precision and batch size, aggregate tokens/s (prefill included) and its
ratio to f32, and how many outputs equal f32's (greedy).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.engine import Engine
from specq.specdec.loader import default_model_path, load_model_and_tokenizer, make_proposer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default="examples/bench_prompts.jsonl")
    p.add_argument("--model", default=None)
    p.add_argument("--copies", type=int, default=1, help="the prompts this many times (more requests than a batch)")
    p.add_argument("--batch-size", default="1,8,32")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--proposer", default="none", help="none, auto, ngram, ... (the same for every precision)")
    p.add_argument("--precisions", default="f32,int16,int8")
    args = p.parse_args()
    f32, tokenizer = load_model_and_tokenizer(args.model or default_model_path(), "f32")
    models = {name: f32.at_precision(name) for name in args.precisions.split(",")}
    engines = {name: Engine(m, tokenizer, make_proposer(args.proposer, m, tokenizer)) for name, m in models.items()}
    specs = read_jsonl(args.input) * args.copies
    defaults = GenerationDefaults(max_tokens=args.max_tokens)
    requests = [
        to_request(replace(s, overrides={**s.overrides, "max_tokens": args.max_tokens}), tokenizer, defaults)
        for s in specs
    ]
    sizes = [int(b) for b in args.batch_size.split(",")]
    rates: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], list] = {}
    for rep in range(args.repeat):
        for size in sizes:
            for name, engine in engines.items():
                t0 = time.perf_counter()
                if size == 1:
                    states = [engine.run(r) for r in requests]
                else:
                    states = engine.run_many(requests, group_size=size)
                seconds = time.perf_counter() - t0
                tokens = sum(len(s.output_ids) for s in states)
                rates.setdefault((name, size), []).append(tokens / seconds)
                outputs[(name, size)] = [list(s.output_ids) for s in states]
                print(f"rep {rep + 1} batch {size} {name}: {tokens / seconds:.1f} tokens/s", flush=True)
    print(f"\n{len(requests)} requests, at most {args.max_tokens} tokens, proposer {args.proposer}")
    print("batch  precision  tokens/s  vs f32 (median of per-repetition ratios)  outputs equal to f32's")
    for size in sizes:
        for name in engines:
            ratio = statistics.median(a / b for a, b in zip(rates[(name, size)], rates[("f32", size)]))
            same = sum(a == b for a, b in zip(outputs[(name, size)], outputs[("f32", size)]))
            print(
                f"{size:5d}  {name:9s}  {statistics.median(rates[(name, size)]):8.1f}  {ratio:5.2f}x"
                f"{'':36s}{same}/{len(requests)}"
            )


if __name__ == "__main__":
    main()

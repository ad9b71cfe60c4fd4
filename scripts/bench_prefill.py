"""A prompt's prefill alone: prompt tokens per second at each length, one forward each.

The prompts are token ids spread over the vocabulary (a prefill's cost depends on the
length, not on which tokens). Each length is timed --trials times, interleaved with
the other lengths, and the second fastest is printed (the fastest can be a lucky
moment of a shared machine, the median a burst of another process's).

    python scripts/bench_prefill.py --lengths 100,400,1000 --precision int16
    PYTHONPATH=/tmp/before python scripts/bench_prefill.py ...   # the same against other code
"""

from __future__ import annotations

import argparse
import time

from specq.errors import SpecqError
from specq.specdec.loader import default_model_path
from specq.specdec.model import LlamaModel, Segment


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--precision", default="int16", choices=("f32", "int16", "int8"))
    p.add_argument("--lengths", default="100,400,1000")
    p.add_argument("--trials", type=int, default=4)
    args = p.parse_args()
    try:
        lengths = list(dict.fromkeys(int(n) for n in args.lengths.split(",")))  # each once
    except ValueError:
        p.error(f"--lengths takes comma-separated token counts, not {args.lengths!r}")
    if args.trials < 2:  # before the model loads: a mistake costs no wait
        p.error("--trials must be at least 2 (the second fastest is printed)")
    try:
        model = LlamaModel.load(args.model or default_model_path(), args.precision)
    except SpecqError as exc:  # a missing or unreadable file, a precision this CPU lacks
        p.error(str(exc))
    vocab = model.config.vocab_size
    too_long = [n for n in lengths if n < 1 or n > model.config.context_length]
    if too_long:
        p.error(f"lengths must be 1..{model.config.context_length}, not {too_long}")
    prompts = {n: [(i * 7919) % (vocab - 1) + 1 for i in range(n)] for n in lengths}
    first = lengths[0]  # a warm-up: the prompt path's first call compiles and allocates
    model.forward([Segment(model.new_cache(first), prompts[first], 0, all_logits=False)])
    seconds: dict[int, list[float]] = {n: [] for n in lengths}
    for _ in range(args.trials):
        for n in lengths:
            cache = model.new_cache(n)
            t0 = time.perf_counter()
            model.forward([Segment(cache, prompts[n], 0, all_logits=False)])
            seconds[n].append(time.perf_counter() - t0)
    print(f"prefill, {args.precision}, second fastest of {args.trials}:")
    for n in lengths:
        t = sorted(seconds[n])[1]
        print(f"  {n:>5} tokens: {t * 1e3:9.2f} ms  {n / t:8.1f} tokens/s")


if __name__ == "__main__":
    main()

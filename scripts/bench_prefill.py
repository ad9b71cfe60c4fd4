"""A prompt's prefill alone: prompt tokens per second at each length, one forward each.

The prompts are token ids spread over the vocabulary (a prefill's cost depends on the
length, not on which tokens). Each length is timed --trials times, interleaved with
the other lengths, and the second fastest is printed (the fastest can be a lucky
moment of a shared machine, the median a burst of another process's).

    python scripts/bench_prefill.py --lengths 100,400,1000 --precision int16
    python scripts/bench_prefill.py --lengths 400,2000 --pieces 0,128,256,512   # whole, and in pieces
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
    p.add_argument(
        "--pieces",
        default="0",
        help="comma-separated piece sizes: each prompt prefilled in forwards of at most that many rows, "
        "as the engine does at int16 and int8 (0: whole, one forward)",
    )
    args = p.parse_args()
    try:
        lengths = list(dict.fromkeys(int(n) for n in args.lengths.split(",")))  # each once
    except ValueError:
        p.error(f"--lengths takes comma-separated token counts, not {args.lengths!r}")
    try:
        pieces = list(dict.fromkeys(int(n) for n in args.pieces.split(",")))
    except ValueError:
        p.error(f"--pieces takes comma-separated row counts, not {args.pieces!r}")
    if any(n < 0 for n in pieces):
        p.error("--pieces must be 0 (whole) or positive row counts")
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

    def prefill(n: int, piece: int) -> float:
        cache = model.new_cache(n)
        step = piece or n
        t0 = time.perf_counter()
        for start in range(0, n, step):
            model.forward([Segment(cache, prompts[n][start : start + step], start, all_logits=False)])
        return time.perf_counter() - t0

    for piece in pieces:  # a warm-up: the prompt path's first call compiles and allocates
        prefill(lengths[0], piece)
    # A piece holding the whole prompt is the whole prompt: timed once.
    ways = dict.fromkeys((n, piece if piece < n else 0) for n in lengths for piece in pieces)
    seconds: dict[tuple[int, int], list[float]] = {way: [] for way in ways}
    for _ in range(args.trials):
        for n, piece in seconds:
            seconds[n, piece].append(prefill(n, piece))
    print(f"prefill, {args.precision}, second fastest of {args.trials}:")
    for (n, piece), times in seconds.items():
        t = sorted(times)[1]
        how = f"pieces of {piece}" if piece else "whole"
        print(f"  {n:>5} tokens, {how:>15}: {t * 1e3:9.2f} ms  {n / t:8.1f} tokens/s")


if __name__ == "__main__":
    main()

"""A long prompt joining a batch of decoding requests: how long the others wait.

--batch requests decode (plain, greedy, prompts of token ids spread over the
vocabulary) until they are all past their prefill; then a prompt of --prompt tokens
joins them. For each way of prefilling it, the engine's (a piece a round where the
precision allows, Engine.prefill_rows) and the whole prompt in one forward, this
prints the others' round before it joined, the longest round while it went in, the
others' tokens/s meanwhile, and its time to first token. The two ways alternate,
--trials times each, and the medians are printed.

    python scripts/bench_stall.py --batch 31 --prompt 2000 --precision int16
"""

from __future__ import annotations

import argparse
import statistics
import time

from specq.errors import SpecqError
from specq.specdec.engine import DecodeGroup, Engine
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.proposers import NoProposer
from specq.specdec.state import GenerationRequest

SHORT_PROMPT = 64  # the decoding requests' prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--precision", default="int16", choices=("f32", "int16", "int8"))
    p.add_argument("--batch", type=int, default=31, help="requests decoding when the prompt joins")
    p.add_argument("--prompt", type=int, default=2000, help="the joining prompt's tokens")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--pieces", default="", help="comma-separated piece sizes to try (default: the engine's)")
    args = p.parse_args()
    if args.batch < 1 or args.prompt < 1 or args.trials < 1:
        p.error("--batch, --prompt and --trials must be at least 1")
    try:
        sizes = [int(n) for n in args.pieces.split(",")] if args.pieces else []
    except ValueError:
        p.error(f"--pieces takes comma-separated row counts, not {args.pieces!r}")
    if any(n < 1 for n in sizes):
        p.error("--pieces must be positive row counts")
    try:
        model, tokenizer = load_model_and_tokenizer(args.model or default_model_path(), args.precision)
    except SpecqError as exc:  # a missing or unreadable file, a precision this CPU lacks
        p.error(str(exc))
    context = model.config.context_length
    if args.prompt + 8 > context:
        p.error(f"--prompt must leave room for a few tokens in the context ({context})")
    engine = Engine(model, tokenizer, NoProposer())
    if sizes and engine.prefill_rows is None:
        p.error(f"this model's prompts go whole at {args.precision}: pieces would change their bits")
    if any(n >= 1024 for n in sizes):  # the stack's rows (model._INTEGER_STACK_ROWS)
        p.error("--pieces must be below 1024 rows")
    sizes = sizes or ([engine.prefill_rows] if engine.prefill_rows else [])
    vocab = model.config.vocab_size

    def ids(n: int, seed: int) -> tuple[int, ...]:
        return tuple((i * 7919 + seed * 104729) % (vocab - 1) + 1 for i in range(n))

    def trial(piece: int | None, seed: int) -> dict[str, float]:
        engine.prefill_rows = piece
        group = DecodeGroup(engine)
        # Enough tokens to decode through the prompt's pieces (at least a row a round)
        # and no more: a cache is allocated for all of them, 23 KB a position at int16.
        budget = min(context - SHORT_PROMPT - 1, args.prompt + 16)
        for i in range(args.batch):
            group.add(i, engine.start(GenerationRequest(ids(SHORT_PROMPT, seed + i), max_tokens=budget, k=1)))
        while any(not s.state.output_ids for s in group.sessions.values()):
            group.round()
        before = []
        for _ in range(5):
            t0 = time.perf_counter()
            group.round()
            before.append(time.perf_counter() - t0)
        group.add("long", engine.start(GenerationRequest(ids(args.prompt, seed), max_tokens=4, k=1)))
        n_others = sum(len(s.state.output_ids) for key, s in group.sessions.items() if key != "long")
        rounds = []
        while not group.sessions["long"].state.output_ids:
            t0 = time.perf_counter()
            group.round()
            rounds.append(time.perf_counter() - t0)
        emitted = sum(len(s.state.output_ids) for key, s in group.sessions.items() if key != "long") - n_others
        return {
            "round before": statistics.median(before),
            "longest round": max(rounds),
            "others per s": emitted / sum(rounds),
            "time to first token": sum(rounds),
        }

    ways: dict[str, int | None] = {f"pieces of {n}": n for n in sizes}
    ways["whole"] = None
    results: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    trial(sizes[0] if sizes else None, 0)  # a warm-up: first calls compile and allocate
    for t in range(args.trials):
        for name, piece in ways.items():
            results[name].append(trial(piece, t + 1))
    how = f"{args.precision}, medians of {args.trials}"
    print(f"{args.batch} requests decoding, a {args.prompt}-token prompt joins ({how}):")
    for name, runs in results.items():
        figures = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"  {name:>14}: round before {figures['round before'] * 1e3:7.1f} ms, "
            f"longest round {figures['longest round'] * 1e3:8.1f} ms, "
            f"others {figures['others per s']:7.1f} tokens/s, "
            f"time to first token {figures['time to first token'] * 1e3:8.1f} ms"
        )


if __name__ == "__main__":
    main()

"""The output head of greedy rows three ways, on the final-normed rows of a text: the
screen alone (head_screen.ScreenedHead.argmax_logits), the whole head alone, and
what a model's forwards do, a HeadChoice picking one of the two call by call from
their timings (LlamaModel._greedy_logits). Calls take turns in a rotating order; each
call's rows are the next R rows of the text; every call's three answers must have
the same argmax (the script stops otherwise). The "screened" column counts the
choice's calls that left some logit out (-inf): a screened call whose every row was
unsure counts as whole. Between two calls the script reads
--between MB, as a decode's layers do between two heads: without it, the path
called last keeps its arrays in the core's caches, and looks cheaper than it is
in a forward.

A .jsonl text is read as specq's input (each line's prompt, chat-templated); any
other file as plain text. The default: the bench mix's prompts, then the README's
markdown, where many rows have near ties everywhere and the screen alone loses
(docs/performance.md, 2026-12-07).

    python scripts/bench_head_screen.py
    python scripts/bench_head_screen.py --texts notes.md --rows 12,32 --calls 128
    python scripts/bench_head_screen.py --model toy.gguf --rows 12 --calls 4   # a smoke run

With --decode, greedy decoding instead: the first --batch prompts of each .jsonl
text, --suffix appended to each one's last message, decoded together (a batch,
no drafts, greedy and --max-tokens whatever a line asks) with the choice, with the
screen always and with the whole head always, --runs times each in alternating
orders; the outputs must be identical. Rounds shrink below 12 rows as requests end,
and those take the whole head every way.

    python scripts/bench_head_screen.py --decode --texts examples/bench_prompts.jsonl \\
        --suffix " Answer with a markdown table and a bulleted list."
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from specq.errors import SpecqError
from specq.requests.inputs import GenerationDefaults, parse_line, to_request
from specq.specdec.engine import Engine
from specq.specdec.head_screen import SCREEN_ROWS, HeadChoice, ScreenedHead
from specq.specdec.loader import default_model_path, load_model_and_tokenizer, make_proposer
from specq.specdec.model import Segment
from specq.specdec.precision import INTEGER
from specq.specdec.sampling import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
PIECE = 64  # tokens a forward when the text's rows are made (a prompt's piece)
TEXT_CONTEXT = 1024  # a plain text's tokens a context (within any model's)
# Untimed first calls: the choice's first four take each path twice, whatever they cost.
WARM_CALLS = 4


def _prompts(path: Path, tokenizer, context: int) -> list[list[int]]:
    """The token ids of each prompt of a .jsonl input, or of a plain text's passages."""
    if path.suffix != ".jsonl":  # in passages of up to TEXT_CONTEXT tokens, each its own context
        ids = list(tokenizer.encode(path.read_text(encoding="utf-8")))
        n = min(TEXT_CONTEXT, context)
        return [ids[i : i + n] for i in range(0, len(ids), n)]
    lines = enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
    specs = [parse_line(json.loads(line), n, str(path)) for n, line in lines if line.strip()]
    return [list(to_request(spec, tokenizer, GenerationDefaults()).prompt_ids) for spec in specs]


def _rows(model, prompts: list[list[int]], most: int) -> np.ndarray:
    """Up to `most` final-normed rows: each prompt's, prefilled a piece at a time."""
    if not any(prompts):
        raise SpecqError("a text has no tokens")
    rows = []
    for ids in prompts:
        cache = model.new_cache()
        for start in range(0, len(ids), PIECE):
            rows.append(model.forward([Segment(cache, ids[start : start + PIECE], start)])[0].hidden)
            if sum(len(r) for r in rows) >= most:
                return np.concatenate(rows)[:most]
    return np.concatenate(rows)


def _time_text(model, screen: ScreenedHead, rows: np.ndarray, r: int, calls: int, between: np.ndarray) -> dict:
    model.head_choice = HeadChoice()
    greedy = [Segment(None, [0] * r, 0, argmax_only=True)]  # only its flag is read
    paths = {
        "screen": screen.argmax_logits,
        "whole": model.head_logits,
        "choice": lambda h: model._greedy_logits(greedy, h, None),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    unsure = screened = 0
    for call in range(calls + WARM_CALLS):
        start = (call * r) % (len(rows) - r + 1)
        h = rows[start : start + r]
        names = list(paths)
        names = names[call % 3 :] + names[: call % 3]
        out = {}
        for name in names:
            between.sum()  # what a forward's layers do to the core's caches between two heads
            t0 = time.perf_counter()
            out[name] = paths[name](h)
            took = time.perf_counter() - t0
            if call >= WARM_CALLS:
                times[name].append(took)
        argmaxes = {name: tuple(o.argmax(axis=1)) for name, o in out.items()}
        if len(set(argmaxes.values())) != 1:
            raise SpecqError(f"the three heads' argmax differ at rows {start} to {start + r}")
        if call >= WARM_CALLS:
            unsure += int(np.isfinite(out["screen"]).all(axis=1).sum())
            screened += not np.isfinite(out["choice"]).all()  # the screen leaves out some -inf
    return {
        "ms": {name: statistics.median(t) * 1e3 for name, t in times.items()},
        "whole/screen": statistics.median(w / s for w, s in zip(times["whole"], times["screen"])),
        "whole/choice": statistics.median(w / c for w, c in zip(times["whole"], times["choice"])),
        "unsure": unsure / (calls * r),
        "screened": screened / calls,
    }


class _Always:
    """A head choice that takes one path whatever it costs (the decode comparison's)."""

    def __init__(self, screened: bool) -> None:
        self.screened = screened

    def screen(self, rows: int) -> bool:
        return self.screened

    def record(self, rows: int, screened: bool, seconds: float) -> None:
        pass


def _decode(model, tokenizer, path: Path, args) -> None:
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    requests = []
    for n, line in lines[: args.batch]:
        spec = parse_line(json.loads(line), n, str(path))
        if spec.messages is not None:
            last = {**spec.messages[-1], "content": spec.messages[-1]["content"] + args.suffix}
            spec = replace(spec, messages=(*spec.messages[:-1], last))
        else:
            spec = replace(spec, prompt=spec.prompt + args.suffix)
        request = to_request(spec, tokenizer, GenerationDefaults())
        # Greedy and --max-tokens whatever the line asks: only greedy rows reach the choice.
        requests.append(replace(request, max_tokens=args.max_tokens, sampling=SamplingParams()))
    if len(requests) < SCREEN_ROWS:
        raise SpecqError(f"{path.name} has {len(requests)} prompts: the screen takes rounds of {SCREEN_ROWS} or more")
    engine = Engine(model, tokenizer, make_proposer("none", model, tokenizer))
    engine.warm_up()
    heads = {"choice": HeadChoice, "screen": lambda: _Always(True), "whole": lambda: _Always(False)}
    seconds: dict[str, list[float]] = {name: [] for name in heads}
    outputs: dict[str, list] = {}
    for run in range(args.runs):
        for name in list(heads) if run % 2 == 0 else list(heads)[::-1]:
            model.head_choice = heads[name]()
            t0 = time.perf_counter()
            states = engine.run_many(requests, group_size=len(requests))
            seconds[name].append(time.perf_counter() - t0)
            outputs.setdefault(name, [s.output_ids for s in states])
            if [s.output_ids for s in states] != outputs[name] or outputs[name] != outputs["choice"]:
                raise SpecqError(f"{name}'s outputs differ from another run's")
    tokens = sum(len(o) for o in outputs["choice"])
    for name, times in seconds.items():
        runs = ", ".join(f"{t:.3f}" for t in times)
        print(
            f"{path.name[:16]:<16}{name:>8}  {len(requests)} requests, {tokens} tokens: {runs} s;"
            f" best {tokens / min(times):.1f} tokens/s",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--texts",
        default=f"{ROOT / 'examples' / 'bench_prompts.jsonl'},{ROOT / 'README.md'}",
        help="comma-separated files: .jsonl inputs or plain text",
    )
    parser.add_argument("--rows", default="12,32,64", help=f"rows a call, comma-separated (at least {SCREEN_ROWS})")
    parser.add_argument("--calls", type=int, default=96)
    parser.add_argument(
        "--between", type=int, default=16, help="MB read between two calls, as a forward's layers read theirs"
    )
    parser.add_argument("--decode", action="store_true", help="time greedy decoding of .jsonl prompts instead")
    parser.add_argument("--suffix", default="", help="--decode: appended to each prompt's last message")
    parser.add_argument(
        "--batch", type=int, default=32, help=f"--decode: prompts decoded together (at least {SCREEN_ROWS})"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="--decode: tokens a request")
    parser.add_argument("--runs", type=int, default=3, help="--decode: runs of each head")
    args = parser.parse_args()
    if args.decode and (args.max_tokens < 1 or args.runs < 1):
        parser.error("--max-tokens and --runs must be at least 1")
    if args.decode and args.batch < SCREEN_ROWS:
        parser.error(f"--batch: the screen takes rounds of {SCREEN_ROWS} rows or more")
    try:
        sizes = [int(x) for x in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: {args.rows!r} is not a comma-separated list of numbers")
    if min(sizes) < SCREEN_ROWS:
        parser.error(f"--rows: the screen takes rounds of {SCREEN_ROWS} rows or more")
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    if args.between < 0:
        parser.error("--between must be at least 0")
    between = np.ones(args.between << 18, dtype=np.float32)
    paths = [Path(p) for p in args.texts.split(",")]
    for path in paths:
        if not path.is_file():
            parser.error(f"--texts: {path} is not a file")
        if args.decode and path.suffix != ".jsonl":
            parser.error(f"--texts: --decode takes .jsonl inputs, not {path}")
    try:
        model, tokenizer = load_model_and_tokenizer(args.model or default_model_path(), "int16")
        if model.precision not in INTEGER:
            raise SpecqError("the screen needs the integer kernels (AVX2)")
        screen = ScreenedHead.of(model.weights.w_output)
        if screen is None:
            raise SpecqError("this model's output head is not Q8_0: it has no screen")
        if args.decode:
            for path in paths:
                _decode(model, tokenizer, path, args)
            return
        print("text             rows  screen ms  whole ms  choice ms  whole/screen  whole/choice  unsure  screened")
        for path in paths:
            rows = _rows(model, _prompts(path, tokenizer, model.config.context_length), max(sizes) * args.calls)
            for r in sizes:
                if len(rows) < r:
                    raise SpecqError(f"{path.name} makes only {len(rows)} rows, fewer than {r}")
                got = _time_text(model, screen, rows, r, args.calls, between)
                ms = got["ms"]
                print(
                    f"{path.name[:16]:<16}{r:>5}{ms['screen']:>11.2f}{ms['whole']:>10.2f}{ms['choice']:>11.2f}"
                    f"{got['whole/screen']:>14.3f}{got['whole/choice']:>14.3f}{got['unsure']:>8.1%}"
                    f"{got['screened']:>10.0%}",
                    flush=True,
                )
    except (SpecqError, OSError, ValueError) as e:
        sys.exit(f"bench_head_screen: {e}")


if __name__ == "__main__":
    main()

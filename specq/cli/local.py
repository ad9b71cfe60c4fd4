"""Local commands, no queue: `generate` and `bench`."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from specq.cli.options import (
    config_from,
    format_bytes,
    generation_options,
    kv_memory_option,
    model_options,
    option_check,
    precision_option,
)
from specq.errors import InputError, SpecqError
from specq.jsonl import dumps_line
from specq.requests.config import DEFAULT_BATCH_SIZE, BatchConfig
from specq.requests.inputs import GenerationDefaults, PromptSpec, read_jsonl, to_request
from specq.requests.result import Result
from specq.specdec.acceptance import ACCEPT_RULES
from specq.specdec.precision import INTEGER
from specq.specdec.proposer_names import PROPOSERS
from specq.specdec.state import DecodeState

if TYPE_CHECKING:  # the engine (numba, the model) is imported by the commands that decode
    from specq.specdec.engine import Engine


@click.command()
@click.option("--prompt", "prompt_text", help="One prompt (sent as a user chat message).")
@click.option("--input", "input_path", type=click.Path(dir_okay=False), help="JSONL file of requests.")
@model_options
@generation_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per request on stdout.")
@click.option("--stream", is_flag=True, help="Print text as it is committed (one request at a time).")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1, max=64),
    help="Requests decoded together, sharing each target forward (a decode group) [default: 8; 1 with --stream].",
)
@kv_memory_option
def generate(prompt_text, input_path, as_json, stream, batch_size, kv_memory, **options) -> None:
    """Generate completions locally, with no queue.

    \b
    specq generate --prompt "Write a haiku about queues."
    specq generate --input examples/prompts.jsonl --json > out.jsonl
    """
    if (prompt_text is None) == (input_path is None):
        raise click.UsageError("give exactly one of --prompt and --input")
    if as_json and stream:
        raise click.UsageError("--stream prints text; it cannot be combined with --json")
    if stream and batch_size not in (None, 1):
        raise click.UsageError("--stream decodes one request at a time; it cannot be combined with --batch-size")
    batch_size = batch_size or (1 if stream else DEFAULT_BATCH_SIZE)
    try:
        if input_path is not None:
            specs = read_jsonl(input_path)
        else:
            if not prompt_text:
                raise click.UsageError("--prompt is empty")
            specs = [PromptSpec(custom_id="prompt", line=1, prompt=prompt_text)]
        config, _ = config_from({**options, "batch_size": batch_size})
        engine = _load(config)
        # Every request is checked against the model before any is decoded.
        states = [_start(engine, spec, config.defaults) for spec in specs]
        _check_kv_memory(engine, specs, states, batch_size, kv_memory)
        if stream:
            for spec, state in zip(specs, states):
                _stream_one(engine, spec, state)
        else:
            _decode_batch(engine, specs, states, batch_size=batch_size, kv_budget=kv_memory, as_json=as_json)
    except SpecqError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


def _start(engine: Engine, spec: PromptSpec, defaults: GenerationDefaults) -> DecodeState:
    """The request's fresh state; a fault found against the model (a prompt too long
    for the context) names the request and its line, as input-file errors do."""
    request = to_request(spec, engine.tokenizer, defaults)
    try:
        return engine.start(request)
    except SpecqError as exc:
        raise type(exc)(f"request {spec.custom_id!r} (line {spec.line}): {exc}") from None


def _load(config: BatchConfig) -> Engine:
    from specq.queue.connection import model_cache_dir
    from specq.specdec.loader import load_engine

    started = time.perf_counter()
    engine = load_engine(
        cache_dir=model_cache_dir(),
        model_path=config.model_path or None,
        proposer=config.proposer,
        draft_model_path=config.draft_model_path or None,
        medusa_heads_path=config.medusa_heads_path or None,
        precision=config.precision,
    )
    click.echo(
        f"loaded {engine.model.path} ({engine.model.config.n_layers} layers, proposer {config.proposer}, "
        f"precision {engine.model.precision}) "
        f"in {time.perf_counter() - started:.1f}s",
        err=True,
    )
    return engine


def _stream_one(engine: Engine, spec: PromptSpec, state: DecodeState) -> None:
    shown = 0
    for state in engine.generate(state):
        text = engine.stream_text(state)
        click.echo(text[shown:], nl=False, color=True)  # model text verbatim, escapes included
        sys.stdout.flush()
        shown = len(text)
    click.echo("")
    _summary(spec, state)


def _check_kv_memory(
    engine: Engine, specs: list[PromptSpec], states: list[DecodeState], batch_size: int, budget: int
) -> None:
    """Refuse a request whose KV cache alone exceeds the budget; say when the budget,
    not --batch-size, will bound how many decode together."""
    needs = [engine.kv_bytes(state) for state in states]
    per_position = format_bytes(engine.model.kv_bytes_per_position)
    for spec, need in zip(specs, needs):
        if need > budget:
            raise InputError(
                f"request {spec.custom_id!r} (line {spec.line}): its KV cache needs {format_bytes(need)} "
                f"({need // engine.model.kv_bytes_per_position} positions at {per_position}), more than "
                f"--kv-memory {format_bytes(budget)}"
            )
    largest = sorted(needs, reverse=True)[:batch_size]
    if len(largest) == batch_size and sum(largest) > budget:
        fit = next(n for n in range(batch_size, 0, -1) if sum(largest[:n]) <= budget)
        click.echo(
            f"note: --kv-memory {format_bytes(budget)} holds as few as {fit} of these requests at once "
            f"(the largest KV cache is {format_bytes(largest[0])}, {per_position} a position); "
            f"fewer than --batch-size {batch_size} may decode together",
            err=True,
        )


def _decode_batch(
    engine: Engine,
    specs: list[PromptSpec],
    states: list[DecodeState],
    *,
    batch_size: int,
    kv_budget: int,
    as_json: bool,
) -> None:
    """Decode together; print each result in input order as soon as it and every
    result before it are done."""
    done: dict[int, DecodeState] = {}
    next_out = 0
    for index, state in engine.generate_many(states, group_size=batch_size, kv_budget=kv_budget):
        if not state.finished:
            continue
        done[index] = state
        while next_out in done:
            spec, final = specs[next_out], done.pop(next_out)
            if as_json:
                result = Result.of(spec.custom_id, engine.text(final), final)
                click.echo(dumps_line(result.line(endpoint=spec.endpoint, model=spec.model)))
            else:
                click.echo(engine.text(final), color=True)
            _summary(spec, final)
            next_out += 1


def _summary(spec: PromptSpec, state: DecodeState) -> None:
    m = state.metrics
    rate = len(state.output_ids) / m.decode_seconds if m.decode_seconds else 0.0
    click.echo(
        f"{spec.custom_id}: {len(state.output_ids)} tokens ({state.finish_reason}), {rate:.1f} tokens/s, "
        f"tau {m.tau:.2f}, accepted {m.accepted}/{m.drafted} drafts",
        err=True,
    )


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"expected integers >= 1, got {value!r}")
    return values


def _optional_int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    return _int_list(ctx, param, value) if value else []


def _batch_sizes(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    sizes = _optional_int_list(ctx, param, value)
    if any(n < 2 for n in sizes):  # 1 is the single stream, always measured
        raise click.BadParameter(f"batch sizes must be >= 2, got {value!r}")
    return list(dict.fromkeys(sizes))


def _proposer_list(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in PROPOSERS]
    if not names or unknown:
        raise click.BadParameter(
            f"unknown proposer {unknown[0] if unknown else value!r} (choose from {', '.join(PROPOSERS)})"
        )
    return names


def _compare_list(ctx, param, value: str) -> list[str]:
    from specq.bench_external import BASELINES

    names = [x.strip() for x in value.split(",") if x.strip()]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise click.BadParameter(f"unknown tool {unknown[0]!r} (choose from {', '.join(BASELINES)})")
    return names


# Per prompt, for --quality: the length the speed figures are measured at (every line
# of examples/bench_prompts.jsonl, docs/performance.md), so both describe the same text.
QUALITY_MAX_TOKENS = 128


def _first_per_category(specs: list[PromptSpec], limit: int) -> list[PromptSpec]:
    counts: Counter[str] = Counter()
    kept = []
    for spec in specs:
        if counts[spec.category] < limit:
            kept.append(spec)
            counts[spec.category] += 1
    return kept


@click.command()
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False),
    default="examples/bench_prompts.jsonl",
    show_default=True,
    help="JSONL prompts; an optional 'category' field groups the results.",
)
@click.option(
    "--model", "model_path", type=click.Path(dir_okay=False), help="Target GGUF (default: SmolLM2-135M-Instruct)."
)
@click.option(
    "--proposers",
    default="auto",
    show_default=True,
    callback=_proposer_list,
    help="Comma-separated proposers to compare with plain decoding.",
)
@click.option("--k", "ks", default="3,5", show_default=True, callback=_int_list, help="Comma-separated draft lengths.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--max-tokens", type=int, callback=option_check("max_tokens"), help="Override every line's max_tokens.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N prompts of each category.")
@click.option("--adaptive/--fixed-k", default=True, show_default=True, help="Adaptive draft length, or always k.")
@click.option("--draft-model", "draft_model_path", type=click.Path(dir_okay=False))
@click.option("--medusa-heads", "medusa_heads_path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The full report as JSON on stdout.")
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False),
    help="Write PNG charts here (tokens/s against k, speedup per category, acceptance per position).",
)
@click.option(
    "--batch-size",
    "batch_sizes",
    default="",
    callback=_batch_sizes,
    help="Also decode all prompts N at a time, for each N of a comma-separated list (aggregate tokens/s; "
    "outputs checked against single stream): 8, or a sweep such as 4,8,16,32,64.",
)
@click.option(
    "--row-curve",
    "row_curve",
    default="",
    callback=_optional_int_list,
    help="Also measure the cost of a forward of R rows against one row, for R in a comma-separated list "
    "(e.g. 1,2,4,8,16,32,64): R rows of one sequence (verification) and R sequences (decode round).",
)
@click.option(
    "--compare",
    "compare",
    default="",
    callback=_compare_list,
    help="External tools side by side, if installed: hf, llama.cpp (comma-separated; extra 'compare'). "
    "With --batch-size, llama.cpp also decodes that many sequences per llama_decode.",
)
@click.option(
    "--temperature",
    type=float,
    default=0.0,
    show_default=True,
    callback=option_check("temperature"),
    help="Sample at this temperature (0: greedy). Under the race rule (auto's) sampled outputs are checked "
    "against plain sampling's; under --accept sample they differ by design, and batched ones are checked "
    "against their own single stream.",
)
@click.option(
    "--accept",
    type=click.Choice(("auto",) + ACCEPT_RULES),
    default="auto",
    show_default=True,
    help="The acceptance rule of the sampled runs (auto: greedy at temperature 0, race otherwise).",
)
@click.option("--top-p", type=float, default=1.0, show_default=True, callback=option_check("top_p"))
@click.option("--top-k", type=int, default=0, show_default=True, callback=option_check("top_k"))
@click.option("--seed", type=int, default=0, show_default=True, callback=option_check("seed"))
@precision_option
@click.option(
    "--quality",
    is_flag=True,
    help="Instead of the speed passes: how far int16 and int8 predictions (or --precision's) are from "
    "f32's on the prompts "
    f"(top-1 agreement, KL divergence; --max-tokens defaults to {QUALITY_MAX_TOKENS}).",
)
def bench(
    input_path,
    model_path,
    proposers,
    ks,
    repeat,
    max_tokens,
    limit,
    adaptive,
    draft_model_path,
    medusa_heads_path,
    as_json,
    plot_dir,
    batch_sizes,
    row_curve,
    compare,
    temperature,
    accept,
    top_p,
    top_k,
    seed,
    precision,
    quality,
) -> None:
    """Measure speculative decoding against plain decoding on one loaded model
    (greedy unless --temperature; tokens/s, speedup, tau, acceptance, exactness), as
    ratios from one run.

    \b
    specq bench --repeat 3
    specq bench --proposers ngram,draft --draft-model small.gguf --k 2,4 --json > bench.json
    specq bench --k 1,2,3,4 --plot docs/bench
    specq bench --batch-size 8 --compare hf,llama.cpp
    specq bench --proposers none --batch-size 4,8,16,32,64 --row-curve 1,2,4,8,16,32,64 --plot charts/
    specq bench --temperature 0.7 --top-p 0.95 --batch-size 8
    specq bench --temperature 0.7 --top-p 0.95 --accept sample --batch-size 8,32
    specq bench --quality --limit 2
    """
    from specq.bench import CURVE_CONTEXT, BenchConfig, format_table, run_bench
    from specq.bench_external import load_baselines
    from specq.specdec.loader import default_model_path, load_model_and_tokenizer, make_proposer, resolve_proposer

    if quality:
        speed_only = [
            name
            for name, given in (
                ("--compare", compare),
                ("--plot", plot_dir),
                ("--row-curve", row_curve),
                ("--batch-size", batch_sizes),
                ("--temperature", temperature),
                ("--accept", accept != "auto"),
            )
            if given
        ]
        if speed_only:
            raise click.UsageError(f"--quality measures predictions, not speed: it takes no {speed_only[0]}")
        chosen = click.get_current_context().get_parameter_source("precision") != click.core.ParameterSource.DEFAULT
        _bench_quality(
            input_path,
            model_path,
            limit,
            max_tokens or QUALITY_MAX_TOKENS,
            as_json,
            INTEGER if not chosen or precision == "f32" else (precision,),
        )
        return
    if compare and temperature > 0:
        # The external tools decode greedily: their tokens/s beside sampled ones would mislead.
        raise click.UsageError("--compare runs HuggingFace and llama.cpp greedily: it takes no --temperature")
    if plot_dir:
        from specq.bench_plot import _pyplot

        try:
            _pyplot()  # refuse a missing matplotlib before the long run, not after
        except SpecqError as exc:
            raise click.ClickException(str(exc)) from None
    try:
        specs = read_jsonl(input_path)
        if limit:
            specs = _first_per_category(specs, limit)
        if max_tokens:
            specs = [replace(s, overrides={**s.overrides, "max_tokens": max_tokens}) for s in specs]
        model, tokenizer = load_model_and_tokenizer(model_path or default_model_path(), precision)
        if row_curve and CURVE_CONTEXT + max(row_curve) + 1 > model.config.context_length:
            raise InputError(
                f"--row-curve {max(row_curve)} rows after {CURVE_CONTEXT} positions exceed the model's "
                f"context of {model.config.context_length}"
            )
        proposer_cache: dict = {}
        # Reported by what they are ("auto" is hybrid or ngram, depending on the heads).
        proposers = list(
            dict.fromkeys(
                resolve_proposer(
                    p, model.fingerprint, draft_model_path=draft_model_path, medusa_heads_path=medusa_heads_path
                )
                for p in proposers
            )
        )

        def proposer_for(name: str):
            if name not in proposer_cache:
                proposer_cache[name] = make_proposer(
                    name, model, tokenizer, draft_model_path=draft_model_path, medusa_heads_path=medusa_heads_path
                )
            return proposer_cache[name]

        for name in proposers:
            proposer_for(name)  # refuse bad proposer files before the long run
        configs = [BenchConfig(p, k) for p in proposers for k in (ks if p != "none" else [1])]
        import numba

        # The same thread count as specq's kernels, so the comparison is like for like.
        baselines = load_baselines(compare, model_path or default_model_path(), numba.get_num_threads())
        try:
            report = run_bench(
                model,
                tokenizer,
                specs,
                configs,
                proposer_for,
                defaults=GenerationDefaults(
                    adaptive=adaptive,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=top_k,
                    seed=seed,
                    accept=accept,
                ),
                repeat=repeat,
                batch_sizes=batch_sizes,
                row_curve=row_curve,
                baselines=baselines,
                progress=lambda msg: click.echo(msg, err=True),
            )
        finally:
            for baseline in baselines:
                baseline.close()
    except SpecqError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    click.echo(format_table(report), err=True)
    if plot_dir:
        from specq.bench_plot import write_plots

        for path in write_plots(report.to_dict(), plot_dir):
            click.echo(f"wrote {path}", err=True)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))


def _bench_quality(input_path, model_path, limit, max_tokens, as_json, candidates) -> None:
    """`specq bench --quality`: the f32 model against the same weights at each of the
    candidate precisions (specq.quality), one prompt at a time, each continuation
    clipped to the context."""
    from specq.quality import QualityReport, compare, continuation_tokens
    from specq.specdec.loader import default_model_path, load_model_and_tokenizer

    try:
        specs = read_jsonl(input_path)
        if limit:
            specs = _first_per_category(specs, limit)
        f32, tokenizer = load_model_and_tokenizer(model_path or default_model_path(), "f32")
        # The same weights: only the arithmetic differs.
        models = {name: f32.at_precision(name) for name in candidates}
        reports = {name: QualityReport() for name in candidates}
        for i, spec in enumerate(specs, 1):
            prompt = to_request(spec, tokenizer, GenerationDefaults()).prompt_ids
            n = continuation_tokens(f32, spec, prompt, max_tokens)
            for name, model in models.items():
                compare(f32, model, [prompt], n, tokenizer.end_of_turn_ids, reports[name])
            click.echo(f"{i}/{len(specs)} prompts compared", err=True)
    except SpecqError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    for name, report in reports.items():
        click.echo(f"{name} against f32:\n{report.format(name)}", err=True)
    if as_json:
        click.echo(json.dumps({name: report.to_dict() for name, report in reports.items()}, indent=2))

"""Options shared by several commands, declared once."""

from __future__ import annotations

import click

from specq.errors import ParameterError
from specq.requests.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHECKPOINT_SECONDS,
    DEFAULT_CHECKPOINT_TOKENS,
    DEFAULT_KV_MEMORY,
    BatchConfig,
    parse_size,
    resolve_config,
)
from specq.requests.inputs import GenerationDefaults, OptionError, check_option
from specq.specdec.acceptance import ACCEPT_RULES
from specq.specdec.precision import AUTO, PRECISIONS, resolve
from specq.specdec.proposer_names import PROPOSERS


def option_check(name: str):
    """A click callback applying the same range checks as input lines."""

    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is None or value == ():
            return value
        try:
            return check_option(name, value)
        except OptionError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


def stack(*decorators):
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def _resolve_precision(ctx, param, value: str) -> str:
    return resolve(value)


precision_option = click.option(
    "--precision",
    type=click.Choice((AUTO, *PRECISIONS)),
    default=AUTO,
    show_default=True,
    callback=_resolve_precision,
    help="auto: int16 on CPUs with AVX2, else f32. f32: float32 arithmetic, HuggingFace parity. int16: 15-bit "
    "activations with integer dot products, KV caches of float16 keys (older ones read as 8 bits) and 8-bit "
    "values, f32's predictions at 99.5% of positions (the rest near ties) and faster on many rows. int8: "
    "8-bit activations and 8-bit KV caches (0.50x int16's memory a position), faster still; outputs differ "
    "from f32 near ties (docs/performance.md).",
)

model_options = stack(
    click.option(
        "--model", "model_path", type=click.Path(dir_okay=False), help="Target GGUF (default: SmolLM2-135M-Instruct)."
    ),
    click.option(
        "--proposer",
        type=click.Choice(PROPOSERS),
        default="auto",
        show_default=True,
        help="auto: heads with prompt lookup (hybrid) when heads fit the model (shipped for the default model), "
        "else ngram.",
    ),
    click.option(
        "--draft-model",
        "draft_model_path",
        type=click.Path(dir_okay=False),
        help="GGUF draft model for --proposer draft.",
    ),
    click.option(
        "--medusa-heads",
        "medusa_heads_path",
        type=click.Path(dir_okay=False),
        help="Heads file for medusa/hybrid (default: the shipped heads, when they fit the model).",
    ),
    precision_option,
)

generation_options = stack(
    click.option(
        "--k",
        "k",
        type=click.IntRange(min=1, max=16),
        default=4,
        show_default=True,
        help="Most draft tokens per round (4 measured best with the adaptive length; docs/performance.md).",
    ),
    click.option(
        "--adaptive/--fixed-k",
        default=True,
        show_default=True,
        help="Choose 0..k drafts per round from the measured acceptance, or always draft k.",
    ),
    click.option(
        "--accept",
        type=click.Choice(("auto",) + ACCEPT_RULES),
        default="auto",
        show_default=True,
        help="auto: greedy at temperature 0, race otherwise (sampled outputs then equal plain sampling's, "
        "whatever the proposer, k or batch). sample: rejection sampling. typical is faster but not "
        "distribution-preserving.",
    ),
    click.option("--max-tokens", type=int, default=256, show_default=True, callback=option_check("max_tokens")),
    click.option("--temperature", type=float, default=0.0, show_default=True, callback=option_check("temperature")),
    click.option("--top-p", type=float, default=1.0, show_default=True, callback=option_check("top_p")),
    click.option("--top-k", type=int, default=0, show_default=True, callback=option_check("top_k")),
    click.option("--seed", type=int, default=0, show_default=True, callback=option_check("seed")),
    click.option("--stop", "stop", multiple=True, callback=option_check("stop"), help="Stop string (repeatable)."),
    click.option("--raw-prompt", is_flag=True, help="Feed prompts verbatim, without the chat template."),
)


batch_options = stack(
    click.option(
        "--batch-size",
        type=click.IntRange(min=1, max=64),
        default=DEFAULT_BATCH_SIZE,
        show_default=True,
        help="Requests a worker process decodes together, sharing each target forward (its decode group).",
    ),
    click.option(
        "--checkpoint-tokens",
        type=click.IntRange(min=1),
        default=DEFAULT_CHECKPOINT_TOKENS,
        show_default=True,
        help="Checkpoint a request after this many new tokens...",
    ),
    click.option(
        "--checkpoint-seconds",
        type=click.FloatRange(min=0.1),
        default=DEFAULT_CHECKPOINT_SECONDS,
        show_default=True,
        help="...or this many seconds since its last checkpoint.",
    ),
)


def config_from(options: dict) -> tuple[BatchConfig, str]:
    """The configuration the command's model, generation and batch options make,
    resolved once (requests.config.resolve_config), and the model file's path."""
    defaults = GenerationDefaults(
        max_tokens=options["max_tokens"],
        temperature=options["temperature"],
        top_p=options["top_p"],
        top_k=options["top_k"],
        seed=options["seed"],
        stop=tuple(options["stop"]),
        accept=options["accept"],
        k=options["k"],
        adaptive=options["adaptive"],
        raw_prompt=options["raw_prompt"],
    )
    return resolve_config(
        model_path=options["model_path"],
        proposer=options["proposer"],
        draft_model_path=options["draft_model_path"],
        medusa_heads_path=options["medusa_heads_path"],
        defaults=defaults,
        precision=options["precision"],
        batch_size=options.get("batch_size") or DEFAULT_BATCH_SIZE,
        checkpoint_tokens=options.get("checkpoint_tokens", DEFAULT_CHECKPOINT_TOKENS),
        checkpoint_seconds=options.get("checkpoint_seconds", DEFAULT_CHECKPOINT_SECONDS),
    )


redis_option = click.option(
    "--redis-url",
    envvar="SPECQ_REDIS_URL",
    metavar="URL",
    help="redis:// or rediss:// (also $SPECQ_REDIS_URL); default: an embedded server on a local data directory.",
)


def memory_size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        return parse_size(value)
    except ParameterError as exc:
        raise click.BadParameter(str(exc)) from None


# One option for generate, worker and run; a worker's jobs read SPECQ_KV_MEMORY, which
# worker and run set from it for their processes.
kv_memory_option = click.option(
    "--kv-memory",
    "kv_memory",
    envvar="SPECQ_KV_MEMORY",
    default=DEFAULT_KV_MEMORY,
    show_default=True,
    callback=memory_size,
    help="The most memory the KV caches one process decodes together may take (4GiB, 512MiB, ...; also "
    "SPECQ_KV_MEMORY): fewer than --batch-size decode together when theirs would not fit.",
)


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"

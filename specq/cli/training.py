"""`specq train-heads`: heads for a model (recurrent or Medusa), trained by self-distillation."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import click

from specq.cli.options import precision_option
from specq.errors import SpecqError
from specq.training.configs import RecurrentConfig, TrainConfig


@click.command("train-heads")
@click.argument("prompts_path", metavar="PROMPTS.jsonl", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", "out_path", required=True, type=click.Path(dir_okay=False), help="Heads file to write (GGUF)."
)
@click.option(
    "--model", "model_path", type=click.Path(dir_okay=False), help="Target GGUF (default: SmolLM2-135M-Instruct)."
)
@click.option(
    "--kind",
    type=click.Choice(["recurrent", "medusa"]),
    default="recurrent",
    show_default=True,
    help="recurrent: one head fed each drafted token; medusa: one independent head per position.",
)
@click.option(
    "--heads",
    "n_heads",
    type=click.IntRange(1, 8),
    default=4,
    show_default=True,
    help="Medusa heads to train; for a recurrent head, the drafted positions measured.",
)
@click.option("--max-tokens", type=click.IntRange(min=2), help="Cap on each answer's length (default: the lines').")
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    help=f"Passes over the training rows (default: {RecurrentConfig.epochs} recurrent, {TrainConfig.epochs} medusa).",
)
@click.option(
    "--learning-rate", type=click.FloatRange(min=0, min_open=True), default=TrainConfig.learning_rate, show_default=True
)
@click.option("--seed", type=int, default=TrainConfig.seed, show_default=True)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Answers decoded together while distilling.",
)
@click.option(
    "--answers",
    "results_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Train on the answers in this results file (of `specq run` over PROMPTS.jsonl, greedy or sampled; "
    "scripts/distill_requests.py makes such a batch) instead of decoding greedy answers here.",
)
@precision_option
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    default=".specq-train",
    show_default=True,
    help="Answers and features kept between runs: an interrupted run continues.",
)
def train_heads(
    prompts_path,
    out_path,
    model_path,
    kind,
    n_heads,
    max_tokens,
    epochs,
    learning_rate,
    seed,
    batch_size,
    results_path,
    precision,
    work_dir,
) -> None:
    """Train heads on the model's own answers to PROMPTS.jsonl.

    \b
    specq train-heads examples/train_prompts.jsonl -o heads.gguf
    specq generate --proposer hybrid --medusa-heads heads.gguf --prompt "..."

    \b
    More answers, decoded by the queue (each prompt greedy and sampled):
    python scripts/distill_requests.py PROMPTS.jsonl --samples 3 > distill.jsonl
    specq run distill.jsonl -o distill.results.jsonl --batch-size 32 --proposer none
    specq train-heads PROMPTS.jsonl --answers distill.results.jsonl -o heads.gguf
    """
    from specq.specdec.loader import load_engine
    from specq.training.run import train_heads_file

    if results_path and click.get_current_context().get_parameter_source("batch_size").name != "DEFAULT":
        raise click.ClickException("--batch-size sets how many answers are decoded together; with --answers none are")
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise click.ClickException(f"cannot write {out_path}: no directory {out_dir}")
    started = time.perf_counter()

    def say(message: str) -> None:
        click.echo(f"[{time.perf_counter() - started:7.1f}s] {message}", err=True)

    try:
        # The features, their labels and the gate's figures come from this precision:
        # at the one the head will draft for, each label is exactly its verifier's choice.
        engine = load_engine(model_path=model_path, proposer="none", precision=precision)
        base = RecurrentConfig() if kind == "recurrent" else TrainConfig()
        config = replace(base, epochs=epochs or base.epochs, learning_rate=learning_rate, seed=seed)
        report = train_heads_file(
            engine,
            prompts_path,
            out_path,
            work_dir,
            kind=kind,
            n_heads=n_heads,
            max_tokens=max_tokens,
            batch_size=batch_size,
            config=config,
            results_path=results_path,
            say=say,
        )
    except SpecqError as exc:
        raise click.ClickException(str(exc)) from None
    top1 = ", ".join(f"{x:.3f}" for x in report.top1)
    what = f"{n_heads} heads" if kind == "medusa" else "a recurrent head"
    say(f"wrote {out_path}: {what}, held-out top-1 {top1}")

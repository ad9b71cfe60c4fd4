"""The command line: parse, call, print. Data goes to stdout, progress and
diagnostics to stderr; user faults end in one line and exit status 1 (2 for usage)."""

from __future__ import annotations

import click

from specq.cli.local import bench, generate
from specq.cli.ops import metrics
from specq.cli.queue import cancel, pause, results, resume, status, submit, worker
from specq.cli.run_command import run
from specq.cli.serve import serve
from specq.cli.training import train_heads


@click.group()
@click.version_option(package_name="specq")
def main() -> None:
    """specq: resumable batch text generation with speculative decoding.

    \b
    specq run prompts.jsonl -o results.jsonl     # everything, locally, resumable
    specq submit prompts.jsonl                   # or: enqueue, then run workers anywhere
    specq worker --processes 2
    specq status --watch
    specq serve                                  # the OpenAI Batch API over the queue
    """


for command in (
    generate,
    bench,
    submit,
    status,
    pause,
    resume,
    cancel,
    results,
    worker,
    run,
    serve,
    metrics,
    train_heads,
):
    main.add_command(command)

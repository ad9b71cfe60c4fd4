"""`specq run`: the one-command path, resumable by running it again."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import replace

import click

from specq.cli.options import (
    batch_options,
    config_from,
    generation_options,
    kv_memory_option,
    model_options,
    redis_option,
)
from specq.cli.queue import connect, submit_file, user_errors, write_results
from specq.errors import InputError
from specq.queue.keys import BatchKeys
from specq.requests.config import BatchConfig
from specq.specdec.precision import require_integer


def run_batch_id(input_path: str, config: BatchConfig) -> str:
    """The same file with the same options is the same batch: running again continues it."""
    digest = hashlib.sha256()
    try:
        with open(input_path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        raise InputError(f"input file not found: {input_path}") from None
    except OSError as exc:
        raise InputError(f"cannot read {input_path}: {exc.strerror}") from None
    options = config.to_dict()
    if options["precision"] == "f32":
        del options["precision"]  # every run before --precision existed was f32: those keep their id
    digest.update(json.dumps(options, sort_keys=True).encode())
    return "run-" + digest.hexdigest()[:16]


@click.command()
@click.argument("input_path", metavar="FILE.jsonl", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Results file [default: FILE.results.jsonl].")
@click.option(
    "--errors",
    "errors_path",
    type=click.Path(dir_okay=False),
    help="Errors file [default: FILE.errors.jsonl, written only if there are errors].",
)
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True)
@model_options
@generation_options
@batch_options
@click.option("--skip-invalid", is_flag=True)
@kv_memory_option
@redis_option
def run(input_path, output, errors_path, processes, skip_invalid, kv_memory, redis_url, **gen) -> None:
    """Submit, run local workers until the batch is done, write the results. Run it
    again after an interruption and it continues from the checkpoints.

    \b
    specq run examples/prompts.jsonl -o results.jsonl
    """
    from specq.queue.connection import resolve_url
    from specq.queue.control import checkpointed_unfinished, reap_all
    from specq.queue.control import resolve as resolve_target
    from specq.queue.control import resume as do_resume
    from specq.queue.status import batch_status
    from specq.worker.process import Supervisor, worker_argv

    stem = input_path[:-6] if input_path.endswith(".jsonl") else input_path
    output = output or f"{stem}.results.jsonl"
    errors_path = errors_path or f"{stem}.errors.jsonl"
    with user_errors():
        if not os.path.isfile(input_path):  # before the embedded Redis starts: a typo leaves nothing running
            raise InputError(f"input file not found: {input_path}")
        if gen["precision"] != "f32":
            require_integer()  # the workers are this machine's: refuse now, not in every worker
        config, model_file = config_from(gen)  # a missing model file, too, before Redis starts
        url = resolve_url(redis_url)
        client = connect(url)
        batch_id = run_batch_id(input_path, config)
        chosen = click.get_current_context().get_parameter_source("precision") != click.core.ParameterSource.DEFAULT
        if not chosen and config.precision != "f32":
            # A run interrupted before int16 became the default decoded at f32: running
            # the same command again continues it at f32 rather than starting over.
            earlier = run_batch_id(input_path, replace(config, precision="f32"))
            if client.exists(BatchKeys(earlier).meta):
                batch_id, config = earlier, replace(config, precision="f32")
                click.echo(f"continuing batch {batch_id} at the precision it was started with, f32", err=True)
        queue = f"specq-run-{batch_id}"
        outcome = submit_file(client, input_path, config, model_file, batch_id, queue, skip_invalid)
        if outcome.already_present:
            # A previous run was interrupted: its requests resume from their checkpoints
            # (those its workers handed back on Ctrl-C are queued with one already).
            target = resolve_target(client, batch_id)
            do_resume(target)
            done = batch_status(client, batch_id)["counts"]["completed"]
            click.echo(
                f"continuing batch {batch_id}: {done} requests already completed, "
                f"{checkpointed_unfinished(target.store)} resume from checkpoints",
                err=True,
            )
        supervisor = Supervisor(
            worker_argv([queue], burst=False),
            processes,
            restart=True,
            env={**os.environ, "SPECQ_REDIS_URL": url, "SPECQ_KV_MEMORY": str(kv_memory)},
        )
        if not batch_status(client, batch_id)["done"]:
            supervisor.start()
        try:
            st = _wait_for(client, batch_id, supervisor, batch_status, reap_all)
        except KeyboardInterrupt:
            click.echo("\ninterrupted: workers are checkpointing; run the same command again to continue", err=True)
            supervisor.stop()
            sys.exit(130)
        except BaseException:
            supervisor.stop()  # whatever ended the wait (an error too): no worker outlives the run
            raise
        supervisor.signal_stop()  # the workers exit while the results are written
        try:
            n_out, n_err = write_results(client, batch_id, output, errors_path if _has_errors(st) else None)
        finally:
            supervisor.stop()
    click.echo(
        f"batch {batch_id}: {n_out} results in {output}" + (f", {n_err} errors in {errors_path}" if n_err else ""),
        err=True,
    )


def _has_errors(st: dict) -> bool:
    return st["counts"]["failed"] + st["counts"]["cancelled"] > 0


PROGRESS_EVERY_S = 2.0


def _wait_for(client, batch_id, supervisor, batch_status, reap_all) -> dict:
    """Poll until nothing is left to decode (paused requests stay paused); progress on
    stderr when it changes, at most every PROGRESS_EVERY_S."""
    last_line = ""
    last_print = last_reap = 0.0
    while True:
        st = batch_status(client, batch_id)
        c = st["counts"]
        line = (
            f"{c['completed']}/{st['total']} completed, {c['running']} running, {c['failed']} failed, "
            f"{st['tokens_per_second']:.1f} tokens/s"
        )
        finished = st["done"] or (c["queued"] == c["running"] == 0)
        if line != last_line and (finished or time.monotonic() - last_print >= PROGRESS_EVERY_S):
            click.echo(line, err=True)
            last_line, last_print = line, time.monotonic()
        if finished:
            return st
        if time.monotonic() - last_reap > 5.0:
            reap_all(client)
            last_reap = time.monotonic()
        supervisor.poll()
        if not supervisor.running() and not supervisor.stopping:
            raise click.ClickException("every worker process exited; see the messages above")
        time.sleep(0.5)

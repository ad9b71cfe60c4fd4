"""Queue commands: submit, status, pause, resume, cancel, results, worker."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import click
import redis

from specq.cli.options import (
    batch_options,
    config_from,
    generation_options,
    kv_memory_option,
    model_options,
    redis_option,
)
from specq.errors import ParameterError, SpecqError
from specq.queue.timing import DEFAULT_QUEUE
from specq.requests.ids import check_batch_id


@contextlib.contextmanager
def user_errors():
    """specq's own faults and Redis outages end in one line, never a traceback."""
    from specq.queue.connection import redact

    try:
        yield
    except SpecqError as exc:
        raise click.ClickException(str(exc)) from None
    except redis.RedisError as exc:
        raise click.ClickException(f"Redis error: {redact(str(exc))}") from None


def connect(redis_url: str | None) -> redis.Redis:
    from specq.queue.connection import connect

    return connect(redis_url)


def submit_file(client, input_path, config, model_file, batch_id, queue, skip_invalid):
    """Submit with a resolved configuration; reports on stderr; returns the
    SubmitOutcome. Refuses a Redis that may evict keys before anything is written."""
    from specq.queue.server_checks import require_noeviction
    from specq.queue.submit import submit as do_submit

    require_noeviction(client)
    outcome = do_submit(
        client, input_path, config, model_file=model_file, batch_id=batch_id, queue=queue, skip_invalid=skip_invalid
    )
    for bad in outcome.invalid:
        click.echo(f"skipped: {bad.message}", err=True)
    click.echo(
        f"batch {outcome.batch_id}: {outcome.added} requests enqueued, {outcome.already_present} already present, "
        f"{len(outcome.invalid)} invalid; {outcome.jobs} jobs on queue {queue}",
        err=True,
    )
    return outcome


@click.command()
@click.argument("input_path", metavar="FILE.jsonl", type=click.Path(dir_okay=False))
@model_options
@generation_options
@batch_options
@click.option("--batch-id", help="Name the batch (default: generated). Resubmitting to it adds only new lines.")
@click.option("--queue", default=DEFAULT_QUEUE, show_default=True, help="RQ queue for the batch's jobs.")
@click.option("--skip-invalid", is_flag=True, help="Submit the valid lines; invalid ones go to the error output.")
@click.option("--json", "as_json", is_flag=True)
@redis_option
def submit(input_path, batch_id, queue, skip_invalid, as_json, redis_url, **gen) -> None:
    """Validate a JSONL file and enqueue it as a batch; prints the batch id.

    \b
    specq submit prompts.jsonl
    specq submit openai_batch.jsonl --batch-id nightly --max-tokens 512 --temperature 0.7 --seed 1
    """
    with user_errors():
        if batch_id:
            check_batch_id(batch_id)
        config, model_file = config_from(gen)
        client = connect(redis_url)
        outcome = submit_file(client, input_path, config, model_file, batch_id, queue, skip_invalid)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "batch_id": outcome.batch_id,
                    "added": outcome.added,
                    "already_present": outcome.already_present,
                    "invalid": len(outcome.invalid),
                    "jobs": outcome.jobs,
                }
            )
        )
    else:
        click.echo(outcome.batch_id)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def format_batch(st: dict) -> str:
    if "damaged" in st:
        return f"batch {st['batch_id']}  DAMAGED: {st['damaged']}"
    c = st["counts"]
    finished = c["completed"] + c["failed"] + c["cancelled"]
    width = 30
    filled = int(width * finished / st["total"]) if st["total"] else width
    flags = f"  [{', '.join(st['flags'])}]" if st["flags"] else ""
    tau = f"{st['tau']:.2f}" if st["tau"] is not None else "-"
    acc = f"{st['acceptance_rate']:.2f}" if st["acceptance_rate"] is not None else "-"
    if st.get("synchronous"):
        flags += "  (specq serve's synchronous completions; each leaves once answered)"
    return "\n".join(
        [
            f"batch {st['batch_id']}  queue {st['queue']}  proposer {st['proposer']}  "
            f"precision {st['precision']}{flags}",
            f"  [{'#' * filled}{'-' * (width - filled)}] {finished}/{st['total']} finished",
            "  " + "  ".join(f"{name} {c[name]}" for name in c),
            f"  {st['tokens']} tokens, {st['tokens_per_second']:.1f} tokens/s, tau {tau}, acceptance {acc}, "
            f"resumed after a crash {st['resumes']['crash']}, time left {_duration(st['eta_seconds'])}",
        ]
        + (
            [f"  {st['proposer_fallbacks']} requests went on without drafts (the proposer failed on a worker)"]
            if st["proposer_fallbacks"]
            else []
        )
        + (
            [
                f"  STALLED: {c['queued']} requests wait and no live job will run them: start a worker on queue "
                f"{st['queue']} (a running worker restores the job within seconds)"
            ]
            if st.get("stalled")
            else []
        )
    )


@click.command()
@click.argument("batch_id", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until the batch is done.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@redis_option
def status(batch_id, as_json, watch, interval, redis_url) -> None:
    """Show every batch, or one: requests by state, tokens/s, tau, workers, time left.
    A batch whose keys were lost or broken is shown as DAMAGED, with what is wrong.
    Reads only; never changes anything.

    \b
    specq status
    specq status nightly --watch
    """
    from specq.queue.status import batch_report, overview, workers_alive

    with user_errors():
        client = connect(redis_url)
        while True:
            if batch_id:
                report = {"workers_alive": workers_alive(client), "batches": [batch_report(client, batch_id)]}
            else:
                report = overview(client)
            if as_json:
                click.echo(
                    json.dumps(
                        report if not batch_id else {**report["batches"][0], "workers_alive": report["workers_alive"]}
                    )
                )
            else:
                if watch:
                    click.clear()
                for st in report["batches"]:
                    click.echo(format_batch(st))
                if not report["batches"]:
                    click.echo("no batches")
                click.echo(f"workers alive: {len(report['workers_alive'])}")
            # A damaged batch is reported, not waited for: it may never finish.
            if not watch or all(b.get("damaged") or b["done"] for b in report["batches"]):
                return
            time.sleep(interval)


def _control(action, target: str, as_json: bool, redis_url: str | None) -> None:
    from specq.queue.control import resolve

    with user_errors():
        client = connect(redis_url)
        outcome = action(resolve(client, target))
    if as_json:
        click.echo(json.dumps({"target": target, **outcome}))
    else:
        click.echo(f"{target}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in outcome.items()))


target_argument = click.argument("target", metavar="BATCH|BATCH:CUSTOM_ID")


@click.command()
@target_argument
@click.option("--json", "as_json", is_flag=True)
@redis_option
def pause(target, as_json, redis_url) -> None:
    """Pause a batch or one request; running ones stop after their current round,
    checkpointed."""
    from specq.queue.control import pause as do

    _control(do, target, as_json, redis_url)


@click.command()
@target_argument
@click.option("--json", "as_json", is_flag=True)
@redis_option
def resume(target, as_json, redis_url) -> None:
    """Resume paused requests, and re-enqueue transiently failed or abandoned ones,
    from their checkpoints."""
    from specq.queue.control import resume as do

    _control(do, target, as_json, redis_url)


@click.command()
@target_argument
@click.option("--json", "as_json", is_flag=True)
@redis_option
def cancel(target, as_json, redis_url) -> None:
    """Cancel a batch or one request; running ones stop after their current round."""
    from specq.queue.control import cancel as do

    _control(do, target, as_json, redis_url)


class _Echo:
    """stdout as a writable file, through click.echo (which copes with the terminal's encoding)."""

    def write(self, text: str) -> None:
        click.echo(text, nl=False)


def write_results(client, batch_id: str, output: str | None, errors_path: str | None) -> tuple[int, int]:
    from contextlib import ExitStack

    from specq.queue.results import atomic_writer, export
    from specq.queue.store import BatchStore

    store = BatchStore(client, batch_id)
    if not store.exists():
        raise ParameterError(f"no batch {batch_id!r}")
    try:
        with ExitStack() as files:
            to_file = output and output != "-"
            outputs = files.enter_context(atomic_writer(output)) if to_file else _Echo()
            errors = files.enter_context(atomic_writer(errors_path)) if errors_path else None
            return export(store, outputs, errors)
    except OSError as exc:
        raise ParameterError(f"cannot write {exc.filename or output or 'stdout'}: {exc.strerror}") from None


@click.command()
@click.argument("batch_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here (atomically) instead of stdout.")
@click.option("--errors", "errors_path", type=click.Path(dir_okay=False), help="Failed and cancelled requests.")
@redis_option
def results(batch_id, output, errors_path, redis_url) -> None:
    """Results in input order, for the requests completed so far (OpenAI Batch output
    lines for OpenAI Batch input lines).

    \b
    specq results nightly -o results.jsonl --errors errors.jsonl
    """
    with user_errors():
        client = connect(redis_url)
        n_out, n_err = write_results(client, batch_id, output, errors_path)
    click.echo(f"{n_out} results, {n_err} errors", err=True)


@click.command()
@click.option(
    "--queue",
    "queues",
    multiple=True,
    default=(DEFAULT_QUEUE,),
    show_default=True,
    help="Queue to take jobs from (repeatable); its synchronous queue, QUEUE-sync, comes first.",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes on this machine, each with its own copy of the model.",
)
@click.option("--burst", is_flag=True, help="Exit when the queues are empty.")
@click.option(
    "--check",
    is_flag=True,
    help="Health check: exit 0 if this machine's workers have fresh heartbeats and no open breaker.",
)
@kv_memory_option
@redis_option
def worker(queues, processes, burst, check, kv_memory, redis_url) -> None:
    """Run worker processes: any number, on any number of machines, against one Redis.

    \b
    specq worker --processes 2
    SPECQ_REDIS_URL=rediss://:secret@queue.example:6380/0 specq worker --queue nightly
    """
    from specq.queue.connection import client_for, resolve_url
    from specq.worker.process import Supervisor, check_health, run_worker, worker_argv

    with user_errors():
        os.environ["SPECQ_KV_MEMORY"] = str(kv_memory)  # read by each job, here and in the child processes
        url = resolve_url(redis_url)
        if check:
            healthy, message = check_health(connect(url))
            click.echo(message, err=not healthy)
            sys.exit(0 if healthy else 1)
        # No PING first: a worker started while Redis restarts (or before it, in a
        # compose file) waits for it, logging each retry, instead of exiting.
        client = client_for(url)
        if processes == 1:
            run_worker(client, list(queues), burst=burst)
            return
        supervisor = Supervisor(
            worker_argv(list(queues), burst=burst),
            processes,
            restart=not burst,
            env={**os.environ, "SPECQ_REDIS_URL": url},
        )
        supervisor.start()
        try:
            while supervisor.running():
                supervisor.poll()
                time.sleep(0.5)
        except KeyboardInterrupt:
            supervisor.stop()
            sys.exit(130)

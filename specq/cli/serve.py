"""`specq serve`: the OpenAI Batch API, synchronous completions and a status page on this machine's queue."""

from __future__ import annotations

import ipaddress
import os
import socket

import click

from specq.cli.options import batch_options, config_from, generation_options, model_options, redis_option
from specq.cli.queue import connect, user_errors
from specq.queue.timing import DEFAULT_QUEUE
from specq.server import MAX_SYNC_REQUESTS


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 for all).")
@click.option("--port", type=click.IntRange(min=1, max=65535), default=8000, show_default=True)
@click.option(
    "--api-key",
    envvar="SPECQ_API_KEY",
    metavar="KEY",
    help="Required as a Bearer token on every /v1 route (also $SPECQ_API_KEY); needed to listen beyond loopback.",
)
@click.option("--queue", default=DEFAULT_QUEUE, show_default=True, help="RQ queue for the batches' jobs.")
@click.option(
    "--max-file-bytes",
    type=click.IntRange(min=1),
    default=200 * 2**20,
    show_default=True,
    help="Largest file an upload may be (OpenAI's limit: 200 MiB).",
)
@click.option(
    "--max-sync-requests",
    type=click.IntRange(min=1),
    default=MAX_SYNC_REQUESTS,
    show_default=True,
    help="Synchronous completion requests followed at once; more get a 429.",
)
@model_options
@generation_options
@batch_options
@redis_option
def serve(host, port, api_key, queue, max_file_bytes, max_sync_requests, redis_url, **options) -> None:
    """Serve the OpenAI Batch API (files, batches), synchronous chat and text
    completions (streamed or whole) and a status page at / over the queue; `specq
    worker` processes do the decoding. Model and generation options are the defaults
    of the batches and requests made through it.

    \b
    specq serve --port 8000
    SPECQ_API_KEY=secret specq serve --host 0.0.0.0
    """
    import uvicorn

    from specq.queue.connection import data_dir
    from specq.queue.server_checks import require_noeviction
    from specq.server.app import Settings, create_app

    if not is_loopback(host) and not api_key:
        raise click.UsageError(f"--host {host} listens beyond this machine: give --api-key (or SPECQ_API_KEY)")
    if api_key is not None and not api_key.strip():
        raise click.UsageError("--api-key is empty")
    with user_errors():
        config, model_file = config_from(options)
        client = connect(redis_url)
        require_noeviction(client)
        settings = Settings(
            client=client,
            config=config,
            model_file=model_file,
            model_name=os.path.basename(model_file).removesuffix(".gguf"),
            queue=queue,
            files_dir=data_dir() / "files",
            api_key=api_key,
            max_file_bytes=max_file_bytes,
            max_sync_requests=max_sync_requests,
        )
        app = create_app(settings)
    _check_can_listen(host, port)
    click.echo(f"serving the Batch API on http://{host}:{port}/v1 (queue {queue})", err=True)
    # Streams may be long: on SIGTERM, open ones get this long to end, then are cut
    # (their requests cancelled), so that a stop never hangs on a client.
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=5)


def _check_can_listen(host: str, port: int) -> None:
    """A port in use or a host not of this machine is one line, said before the
    server announces itself (uvicorn would log it after, and exit)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None

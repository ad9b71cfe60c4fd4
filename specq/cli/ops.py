"""Operations commands: metrics."""

from __future__ import annotations

import time

import click

from specq.cli.options import redis_option
from specq.cli.queue import connect, user_errors


@click.command()
@click.option("--port", type=click.IntRange(min=1, max=65535), default=9464, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 for all).")
@click.option("--once", is_flag=True, help="Print the exposition on stdout and exit, instead of serving it.")
@redis_option
def metrics(port, address, once, redis_url) -> None:
    """Serve Prometheus metrics for the whole deployment (every batch and worker that
    uses this Redis), read without side effects at each scrape.

    \b
    specq metrics --port 9464 --address 0.0.0.0
    specq metrics --once | grep spec_decode
    """
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from specq.queue.metrics import SpecqCollector

    with user_errors():
        client = connect(redis_url)
        registry = CollectorRegistry()
        registry.register(SpecqCollector(client))
        if once:
            click.echo(generate_latest(registry).decode(), nl=False)
            return
        try:
            start_http_server(port, addr=address, registry=registry)
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {address}:{port}: {exc.strerror}") from None
        click.echo(f"serving metrics on http://{address}:{port}/metrics", err=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return

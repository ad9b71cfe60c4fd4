"""Load figures for `specq serve`: one batch of many small requests through the OpenAI
Batch API and, while the workers decode it, many concurrent synchronous (streamed)
chat requests, all with the official `openai` client.

    python scripts/bench_server.py                     # 1,000 in a batch + 50 concurrent, 2 workers
    python scripts/bench_server.py --requests 50 --concurrent 8 --workers 1

It starts a private Redis (the embedded server) in a temporary directory, writes a
toy model so that decoding takes a minute rather than hours, runs `specq serve` and
the workers as real processes, and prints a JSON report: the upload and create
times, the latency of `batches.retrieve` (status) calls made while the workers run,
the time to completion and whether every request came back, in input order; for the
synchronous requests, sent together once the batch is decoding, the time to the
first streamed token and to the whole answer, and whether each came back whole.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

from specq.queue.connection import EmbeddedRedis
from specq.testing import toy_gguf

KEY = "bench-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"specq serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit("specq serve did not answer /health")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrent", type=int, default=50, help="synchronous requests sent at once")
    parser.add_argument("--sync-max-tokens", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        redis_server = EmbeddedRedis(tmp_path / "redis")
        env = {
            **os.environ,
            "SPECQ_REDIS_URL": redis_server.ensure_running(),
            "SPECQ_HOME": str(tmp_path / "home"),
            "SPECQ_API_KEY": KEY,
            "SPECQ_LOG_LEVEL": "WARNING",
        }
        model = toy_gguf.write_toy_model(tmp_path / "toy.gguf", quiet_end=True)
        lines = tmp_path / "batch.jsonl"
        with open(lines, "w") as fh:
            for i in range(args.requests):
                body = {"model": "toy", "messages": [{"role": "user", "content": f"item {i}: " + "more " * (i % 7)}]}
                line = {"custom_id": f"q{i:05d}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                fh.write(json.dumps(line) + "\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve = subprocess.Popen(
            [sys.executable, "-m", "specq", "serve", "--port", str(port), "--model", model,
             "--max-tokens", str(args.max_tokens)],
            env=env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        workers = []
        try:
            wait_for(url, serve)
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
            report: dict[str, float | int | bool] = {"requests": args.requests, "workers": args.workers}
            t0 = time.perf_counter()
            with open(lines, "rb") as fh:
                uploaded = client.files.create(file=fh, purpose="batch")
            report["upload_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            batch = client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            report["create_s"] = time.perf_counter() - t0
            started = time.perf_counter()
            workers = [
                subprocess.Popen([sys.executable, "-m", "specq", "worker"], env=env) for _ in range(args.workers)
            ]
            latencies = []
            sync_results: list[dict] = []
            burst = threading.Thread(target=lambda: sync_results.extend(synchronous(client, args)))
            while True:
                t0 = time.perf_counter()
                batch = client.batches.retrieve(batch.id)
                latencies.append(time.perf_counter() - t0)
                if batch.status != "in_progress":
                    break
                if not burst.is_alive() and not sync_results and batch.model_extra["specq"]["tokens"] > 0:
                    burst.start()  # once the workers are busy with the batch
                time.sleep(0.1)
            report["decode_wall_s"] = time.perf_counter() - started
            if burst.ident is None:
                burst.start()  # the batch ended before it could
            burst.join()
            report["status"] = batch.status
            report["status_calls"] = len(latencies)
            report["status_p50_ms"] = 1000 * statistics.median(latencies)
            report["status_p95_ms"] = 1000 * percentile(latencies, 0.95)
            report["status_max_ms"] = 1000 * max(latencies)
            report.update(summarize(sync_results, args))
            t0 = time.perf_counter()
            out = client.files.content(batch.output_file_id).text.splitlines() if batch.output_file_id else []
            report["download_s"] = time.perf_counter() - t0
            ids = [json.loads(line)["custom_id"] for line in out]
            report["completed"] = batch.request_counts.completed
            report["failed"] = batch.request_counts.failed
            report["output_lines"] = len(out)
            report["in_input_order"] = ids == [f"q{i:05d}" for i in range(args.requests)]
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}, indent=2))
        finally:
            for proc in (*workers, serve):
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(30)
            redis_server.stop()


def synchronous(client: openai.OpenAI, args: argparse.Namespace) -> list[dict]:
    """args.concurrent streamed chat requests sent at once: per request, seconds to
    the first piece of text and to the end, and the completion's token count."""

    def one(i: int) -> dict:
        t0 = time.perf_counter()
        first, tokens = None, 0
        stream = client.chat.completions.create(
            model="toy",
            messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=args.sync_max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t0
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return {"first_s": first, "total_s": time.perf_counter() - t0, "tokens": tokens}

    if args.concurrent <= 0:
        return []
    with ThreadPoolExecutor(args.concurrent) as pool:
        return list(pool.map(one, range(args.concurrent)))


def summarize(results: list[dict], args: argparse.Namespace) -> dict:
    if not results:
        return {"sync_requests": 0}
    firsts = [r["first_s"] for r in results if r["first_s"] is not None]
    totals = [r["total_s"] for r in results]
    return {
        "sync_requests": len(results),
        "sync_whole": sum(r["tokens"] == args.sync_max_tokens for r in results),
        "sync_first_token_p50_s": statistics.median(firsts) if firsts else None,
        "sync_first_token_max_s": max(firsts) if firsts else None,
        "sync_total_p50_s": statistics.median(totals),
        "sync_total_p95_s": percentile(totals, 0.95),
        "sync_total_max_s": max(totals),
        "sync_tokens_per_s": sum(r["tokens"] for r in results) / max(totals),
    }


if __name__ == "__main__":
    main()

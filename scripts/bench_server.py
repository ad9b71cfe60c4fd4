"""Load figures for `specq serve`: one batch of many small requests through the OpenAI
Batch API, with the official `openai` client, while worker processes decode it.

    python scripts/bench_server.py                     # 1,000 requests, toy model, 2 workers
    python scripts/bench_server.py --requests 50 --workers 1

It starts a private Redis (the embedded server) in a temporary directory, writes a
toy model so that decoding takes a minute rather than hours, runs `specq serve` and
the workers as real processes, and prints a JSON report: the upload and create
times, the latency of `batches.retrieve` (status) calls made while the workers run,
the time to completion, and whether every request came back, in input order.
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
import time
import urllib.request
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
                subprocess.Popen([sys.executable, "-m", "specq", "worker", "--burst"], env=env)
                for _ in range(args.workers)
            ]
            latencies = []
            while True:
                t0 = time.perf_counter()
                batch = client.batches.retrieve(batch.id)
                latencies.append(time.perf_counter() - t0)
                if batch.status != "in_progress":
                    break
                time.sleep(0.1)
            report["decode_wall_s"] = time.perf_counter() - started
            report["status"] = batch.status
            report["status_calls"] = len(latencies)
            report["status_p50_ms"] = 1000 * statistics.median(latencies)
            report["status_p95_ms"] = 1000 * percentile(latencies, 0.95)
            report["status_max_ms"] = 1000 * max(latencies)
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


if __name__ == "__main__":
    main()

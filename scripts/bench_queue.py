"""Load figures for the queue on a 10,000-request batch: submit, status, results (wall
time and peak resident memory of each command), and the share of a worker's time
spent in Redis.

    python scripts/bench_queue.py                 # 10,000 requests, toy model, 2 workers
    python scripts/bench_queue.py --requests 2000 --workers 1

It starts a private Redis (the embedded server) in a temporary directory unless
SPECQ_REDIS_URL is set, writes a toy model (specq.testing.toy_gguf) so the decoding part
takes minutes rather than hours, and runs everything through the `specq` command as a
user would. Timings are whole commands (including Python start-up), one run each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from specq.queue.connection import EmbeddedRedis
from specq.queue.store import BatchStore
from specq.testing import toy_gguf


def timed(args: list[str], env: dict[str, str]) -> tuple[float, str, float]:
    """(wall seconds, stdout, peak resident MB) of one whole `specq` command; the peak
    is the largest of the command's processes (its worker children included)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "specq", *args], env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"specq {' '.join(args)} failed:\n{err.read()}")
        # ru_maxrss of a process counts the largest of its waited-for children too.
        return elapsed, out.read(), usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        server = None
        url = os.environ.get("SPECQ_REDIS_URL")
        if not url:
            server = EmbeddedRedis(tmp_path / "redis")
            url = server.ensure_running()
        env = {**os.environ, "SPECQ_REDIS_URL": url, "SPECQ_LOG_LEVEL": "WARNING"}
        model = toy_gguf.write_toy_model(tmp_path / "toy.gguf", quiet_end=True)
        prompts = tmp_path / "prompts.jsonl"
        with open(prompts, "w") as fh:
            for i in range(args.requests):
                fh.write(
                    json.dumps({"custom_id": f"q{i:05d}", "prompt": f"item {i}: " + "tell me more " * (i % 7 + 1)})
                    + "\n"
                )
        common = ["--model", model, "--max-tokens", str(args.max_tokens)]
        report: dict[str, float] = {}
        report["submit_s"], _, report["submit_peak_rss_mb"] = timed(
            ["submit", str(prompts), "--batch-id", "load", *common], env
        )
        report["resubmit_s"], _, _ = timed(["submit", str(prompts), "--batch-id", "load", *common], env)
        report["status_s"], _, _ = timed(["status", "load", "--json"], env)
        report["decode_wall_s"], _, report["worker_peak_rss_mb"] = timed(
            ["worker", "--burst", "--processes", str(args.workers)], env
        )
        report["status_done_s"], _, _ = timed(["status", "load", "--json"], env)
        report["results_s"], _, report["results_peak_rss_mb"] = timed(
            ["results", "load", "-o", str(tmp_path / "out.jsonl")], env
        )
        lines = (tmp_path / "out.jsonl").read_text().splitlines()
        client = redis.Redis.from_url(url)
        stats = BatchStore(client, "load").stats()
        report["requests"] = args.requests
        report["results_lines"] = len(lines)
        report["tokens"] = stats.get("tokens", 0)
        report["worker_seconds_summed"] = round(stats.get("worker_seconds", 0.0), 2)
        report["redis_seconds_summed"] = round(stats.get("store_seconds", 0.0), 2)
        if stats.get("worker_seconds"):
            report["redis_share_of_worker_time"] = round(stats.get("store_seconds", 0.0) / stats["worker_seconds"], 4)
        report["redis_used_memory_mb"] = round(client.info("memory")["used_memory"] / 1e6, 1)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in report.items()}, indent=2))
        if server:
            server.stop()


if __name__ == "__main__":
    main()

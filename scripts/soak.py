"""Soak test: thousands of toy-model requests for at least 15 minutes on several
worker processes, while SIGKILL, SIGSTOP/SIGCONT and Redis restarts land at random.
At the end: no request lost or duplicated, every output identical to an uninterrupted
local decode, and the resident memory of one worker that is never killed, sampled
over the whole run.

    python scripts/soak.py                        # 3000 requests, 3 workers, >= 15 min
    python scripts/soak.py --requests 300 --minutes 2 --workers 2    # a quick look

Not part of the test run. Prints a JSON report on stdout; its last results are in
docs/operations.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402

import toy_gguf  # noqa: E402
from specq.jobs.connection import EmbeddedRedis  # noqa: E402
from specq.jobs.store import BatchStore  # noqa: E402


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def specq(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "specq", *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"specq {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=15.0, help="Keep injecting faults at least this long.")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        server = EmbeddedRedis(tmp_path / "redis")
        url = server.ensure_running()
        env = {**os.environ, "SPECQ_REDIS_URL": url, "SPECQ_HOME": str(tmp_path / "home"), "SPECQ_LOG_LEVEL": "ERROR",
               "SPECQ_LEASE_TTL_MS": "5000", "SPECQ_HEARTBEAT_S": "1", "NUMBA_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        model = toy_gguf.write_toy_model(tmp_path / "toy.gguf", quiet_end=True)
        prompts = tmp_path / "prompts.jsonl"
        with open(prompts, "w") as fh:
            for i in range(args.requests):
                fh.write(json.dumps({"custom_id": f"s{i:05d}", "prompt": f"soak {i} " * (1 + i % 5),
                                     "seed": i, "temperature": 0.0 if i % 2 else 0.8}) + "\n")
        common = ["--model", model, "--max-tokens", str(args.max_tokens)]
        t0 = time.time()
        expected = {(r := json.loads(line))["custom_id"]: r["token_ids"]
                    for line in specq(["generate", "--input", str(prompts), "--json", *common], env).splitlines()}
        print(f"reference decode: {time.time() - t0:.0f}s", file=sys.stderr)
        batches = ["soak-1"]
        specq(["submit", str(prompts), "--batch-id", batches[-1], "--checkpoint-tokens", "8", *common], env)

        def spawn():
            return subprocess.Popen([sys.executable, "-m", "specq", "worker"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        steady = spawn()  # never faulted: its memory is the one reported
        workers = [spawn() for _ in range(args.workers - 1)]
        faults = {"sigkill": 0, "sigstop": 0, "redis_restart": 0}
        rss = []
        started = time.time()
        client = redis.Redis.from_url(url)

        def finished(batch_id: str) -> bool:
            c = BatchStore(client, batch_id).counts()
            return c["completed"] + c["failed"] == args.requests

        while True:
            time.sleep(rng.uniform(2, 8))
            rss.append((round(time.time() - started), round(rss_mb(steady.pid), 1)))
            try:
                if finished(batches[-1]):
                    if time.time() - started >= args.minutes * 60:
                        break
                    # Keep the workers under load and under fire until the time is up.
                    batches.append(f"soak-{len(batches) + 1}")
                    specq(["submit", str(prompts), "--batch-id", batches[-1], "--checkpoint-tokens", "8", *common],
                          env)
            except redis.RedisError:
                continue
            fault = rng.choice(["sigkill", "sigkill", "sigstop", "redis_restart"])
            if fault == "sigkill" and workers:
                i = rng.randrange(len(workers))
                workers[i].send_signal(signal.SIGKILL)
                workers[i].wait()
                workers[i] = spawn()
            elif fault == "sigstop" and workers:
                victim = rng.choice(workers)
                victim.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(1, 10))  # often past its lease
                victim.send_signal(signal.SIGCONT)
            elif fault == "redis_restart":
                server.stop()
                time.sleep(rng.uniform(0.5, 3))
                server.ensure_running()
                client = redis.Redis.from_url(url)
            faults[fault] += 1
            print(f"{time.time() - started:6.0f}s {faults} batch {batches[-1]}", file=sys.stderr)
        for w in [steady, *workers]:
            w.send_signal(signal.SIGTERM)
            w.wait(60)
        report = {"requests_per_batch": args.requests, "batches": len(batches), "workers": args.workers,
                  "minutes": round((time.time() - started) / 60, 1), "faults": faults}
        lost = mismatched = duplicated_tokens = 0
        for batch_id in batches:
            store = BatchStore(client, batch_id)
            ids = store.request_ids()
            results = {r: json.loads(raw) for r, raw in zip(ids, store.results(ids)) if raw}
            lost += len(ids) - len(results)
            mismatched += sum(results[r]["token_ids"] != expected[r] for r in results)
            # Tokens are counted only by accepted fenced writes: a duplicate would show.
            duplicated_tokens += int(store.stats().get("tokens", 0)) - sum(len(v["token_ids"]) for v in results.values())
            for k in ("resumes_crash", "resumes_preempt", "fenced_writes_refused", "recomputed_tokens"):
                report[k] = report.get(k, 0) + int(store.stats().get(k, 0))
        report.update({"lost": lost, "mismatched_outputs": mismatched, "tokens_counted_minus_results": duplicated_tokens,
                       "steady_worker_rss_mb": rss})
        print(json.dumps(report, indent=1))
        server.stop()


if __name__ == "__main__":
    main()

"""Memory of N worker processes on one machine, with and without the shared model
cache (specdec/model_cache): each process loads the model as a worker does, runs one
forward, and reports its resident memory from /proc (RSS, PSS: its share of pages
mapped by several processes, and private dirty pages: what is its alone).

    python scripts/bench_worker_memory.py                  # the default model, int16, 3 processes
    python scripts/bench_worker_memory.py --processes 2 --precision f32
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time


def memory() -> dict[str, int]:
    """MiB, from /proc/self/smaps_rollup."""
    wanted = {"Rss:": "rss", "Pss:": "pss", "Private_Dirty:": "private_dirty", "Shared_Clean:": "shared_clean"}
    out = {}
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            parts = line.split()
            if parts[0] in wanted:
                out[wanted[parts[0]]] = int(parts[1]) // 1024
    return out


def child(model_path: str, precision: str, cache_dir: str | None, ready, done, results) -> None:
    from specq.specdec.loader import load_model_and_tokenizer
    from specq.specdec.model import Segment

    t0 = time.perf_counter()
    model, _ = load_model_and_tokenizer(model_path, precision, cache_dir)
    load_s = time.perf_counter() - t0
    model.forward([Segment(model.new_cache(64), tuple(range(1, 33)), 0)])
    ready.wait()  # every process holds its model: the shared pages are shared now
    results.put({"load_s": round(load_s, 2), **memory()})
    done.wait()


def measure(model_path: str, precision: str, n: int, cache_dir: str | None) -> list[dict]:
    ctx = mp.get_context("spawn")
    ready, done, results = ctx.Barrier(n + 1), ctx.Barrier(n + 1), ctx.Queue()
    procs = []
    for _ in range(n):  # one after another, as a supervisor starts them
        procs.append(ctx.Process(target=child, args=(model_path, precision, cache_dir, ready, done, results)))
        procs[-1].start()
        time.sleep(0.5)
    ready.wait()
    got = [results.get(timeout=300) for _ in range(n)]
    done.wait()
    for p in procs:
        p.join()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file (default: the shipped SmolLM2-135M)")
    parser.add_argument("--precision", default="int16")
    parser.add_argument("--processes", type=int, default=3)
    args = parser.parse_args()
    from specq.specdec.loader import default_model_path, load_model_and_tokenizer

    model_path = args.model or default_model_path()
    with tempfile.TemporaryDirectory() as cache_dir:
        load_model_and_tokenizer(model_path, args.precision, cache_dir)  # the file, written once
        report = {
            "model": model_path,
            "precision": args.precision,
            "without_cache": measure(model_path, args.precision, args.processes, None),
            "with_cache": measure(model_path, args.precision, args.processes, cache_dir),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

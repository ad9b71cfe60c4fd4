"""The long chaos run (specq/testing/chaos.py): worker SIGKILLs at uniformly random times from
process start, SIGSTOPs past the lease, Redis SIGKILLed and restarted, over batches of
mixed greedy and seeded-sampling toy-model requests, for at least --minutes and
--requests. Prints a JSON report: lost, unfinished and mismatched requests (all must
be 0) and the recovery time per kind of fault (fault -> each request the faulted
party held running again under a new lease, or completed).

    python scripts/chaos.py                                   # 10 minutes, >= 2000 requests
    python scripts/chaos.py --minutes 1 --requests 200        # a quick look

The long run is not part of the test run (tests/queue/test_chaos.py is its short
version; tests/test_scripts.py runs this script for a few seconds); its last results
are in docs/operations.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from specq.testing.chaos import Chaos, ChaosConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="Keep injecting faults at least this long.")
    parser.add_argument("--requests", type=int, default=2000, help="At least this many requests in all.")
    parser.add_argument("--batch", type=int, default=250, help="Requests per submitted batch.")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    config = ChaosConfig(
        requests=args.batch,
        min_requests=args.requests,
        minutes=args.minutes,
        workers=args.workers,
        seed=args.seed,
        max_tokens=args.max_tokens,
        deadline_minutes=args.minutes * 3 + 10,
    )
    with tempfile.TemporaryDirectory() as tmp:
        report = Chaos(Path(tmp), config, log=lambda *a: print(*a, file=sys.stderr)).run()
    print(json.dumps(report, indent=1))
    bad = report["lost"] + report["not_completed"] + report["mismatched_outputs"] + report["held_never_recovered"]
    sys.exit(1 if bad or report["tokens_counted_minus_results"] else 0)


if __name__ == "__main__":
    main()

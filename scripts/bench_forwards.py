"""Whole forwards of this checkout against another commit's, interleaved in one process:
a 1-row step, a 5-row verification, decode rounds of 8 and 32 sequences (every
sequence at the same context) and a prompt's piece of 64 rows. The machine is
shared and its speed moves by a fifth within minutes, so two processes run one
after the other compare the machine's moments as much as the code; here each trial
times the two codes back to back and the ratio is the median of those pairs.

    python scripts/bench_forwards.py --against HEAD~1
    python scripts/bench_forwards.py --against 8344c64 --context 500 --trials 21
    python scripts/bench_forwards.py --model toy.gguf --context 8 --trials 1   # this code alone, a smoke run
    python scripts/bench_forwards.py --greedy      # greedy forwards (the screened head) beside the whole head
    python scripts/bench_forwards.py --precisions int16,int8   # this checkout at two precisions

The other commit's `specq` package is exported (git archive) into a directory of
the temporary folder as a package named `specq_against`, kept there so that numba's
cache of its compiled code serves the next run (the first compiles it, a few
minutes). Both codes load the same model file at int16 and must give the same
logits, bit for bit, in every case, unless --allow-different-bits (a change that
means to round differently).

With --greedy, this checkout's forwards are a greedy request's (Segment.argmax_only:
from 12 head rows the screened output head, specq/specdec/head_screen.py), and so
are the other commit's where its Segment has argmax_only; without --against, they
are timed beside this checkout's whole head. Greedy forwards must give each row the
same largest logit (argmax) as the others.

With --precisions, this checkout runs at each of two precisions, side by side; their
logits differ by design, and the script says at how many rows their argmax agrees.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from specq.errors import SpecqError
from specq.specdec import model as this_model
from specq.specdec.loader import default_model_path

# (rows of each sequence, sequences): a step, a verification, decode rounds, and a
# prompt's piece of 64 rows after the context (a chunked prefill's forward).
CASES = [(1, 1), (5, 1), (1, 8), (1, 32), (1, 64), (64, 1)]
PACKAGE = "specq_against"


def export(rev: str) -> Path:
    """A directory holding `rev`'s specq package as specq_against (made once a commit)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        found = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, capture_output=True)
    except OSError as exc:  # no git on this machine
        raise ValueError(f"git is needed to export {rev} ({exc.strerror})") from exc
    if found.returncode:
        raise ValueError(f"{rev} is not a commit of {repo}")
    sha = found.stdout.decode().strip()
    root = Path(tempfile.gettempdir()) / f"specq-against-{sha[:12]}"
    if not (root / PACKAGE / "__init__.py").exists():
        archive = subprocess.run(["git", "archive", sha, "specq"], cwd=repo, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(root / "export", filter="data")
        for path in (root / "export" / "specq").rglob("*.py"):
            text = path.read_text()
            path.write_text(re.sub(r"\bspecq(?=[.\s])", PACKAGE, text))
        (root / "export" / "specq").rename(root / PACKAGE)
        (root / "export").rmdir()
    return root


def exported(rev: str):
    """The model module of `rev`'s specq, imported as specq_against: the package from
    its folder (sys.path stays as it is), its modules then found under its name, as
    numba's cache finds them again."""
    folder = export(rev) / PACKAGE
    spec = importlib.util.spec_from_file_location(
        PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}.specdec.model")


def setups(module, path: str, context: int, greedy: bool = False, precision: str = "int16"):
    """The model at `precision` and, per case, a fresh copy of its prefilled caches'
    contents for each trial (caches_for) and the segments that time it (a greedy
    request's with `greedy`, where the module's Segment knows argmax_only)."""
    model = module.LlamaModel.load(path, precision)
    most = max(s for _, s in CASES)
    caches = [model.new_cache(context + max(r for r, _ in CASES)) for _ in range(most)]
    for cache in caches:
        model.forward([module.Segment(cache, [5 + i % 7 for i in range(context)], 0, all_logits=False)])

    flags = {"argmax_only": True} if greedy and "argmax_only" in module.Segment.__dataclass_fields__ else {}

    def segments(rows: int, seqs: int):
        if seqs == 1:
            return [module.Segment(caches[0], [7] * rows, context, **flags)]
        return [module.Segment(c, [7], context, **flags) for c in caches[:seqs]]

    return model, segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=None, help="a commit (or branch, tag) to time beside this checkout")
    parser.add_argument("--model", default=None)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--allow-different-bits", action="store_true")
    parser.add_argument(
        "--greedy", action="store_true", help="greedy forwards (the screened head); alone, beside the whole head"
    )
    parser.add_argument("--precisions", default=None, help="two precisions of this checkout, side by side: A,B")
    args = parser.parse_args()
    if args.context < 1 or args.trials < 1:
        parser.error("--context and --trials must be at least 1")
    precisions = args.precisions.split(",") if args.precisions else []
    if args.precisions and (len(precisions) != 2 or len(set(precisions)) != 2 or args.against or args.greedy):
        parser.error("--precisions takes two different precisions, A,B, and neither --against nor --greedy")
    path = args.model or default_model_path()
    modules = {"now": this_model}
    runs = {}
    try:
        if args.against:
            modules = {"against": exported(args.against), "now": this_model}
        elif args.greedy:
            modules = {"whole": this_model, "greedy": this_model}
        elif precisions:
            modules = {p: this_model for p in precisions}
        for name, module in modules.items():
            try:
                precision = name if precisions else "int16"
                runs[name] = setups(module, path, args.context, args.greedy and name != "whole", precision)
            except (AttributeError, TypeError) as exc:  # a commit whose model module has another API
                if name == "now":
                    raise
                parser.error(f"--against: {args.against}'s specq does not load a model as this script asks ({exc})")
    except (ValueError, subprocess.CalledProcessError) as exc:
        parser.error(f"--against: {exc}")
    except SpecqError as exc:  # a missing or unreadable model, a CPU without AVX2
        parser.error(str(exc))

    def timed(name: str, case: tuple[int, int]) -> tuple[float, np.ndarray]:
        model, segments = runs[name]
        segs = segments(*case)
        t0 = time.perf_counter()
        outputs = model.forward(segs)
        return time.perf_counter() - t0, np.concatenate([o.logits for o in outputs])

    for case in CASES:  # compile, warm up, and compare the bits (greedy: each row's argmax)
        logits = [timed(name, case)[1] for name in runs]
        if args.greedy or precisions:
            logits = [lg.argmax(axis=1) for lg in logits]
        if precisions:
            agree = int((logits[0] == logits[1]).sum())
            print(f"{case[0]} row(s) x {case[1]} sequence(s): argmax agrees at {agree} of {len(logits[0])} rows")
        elif not args.allow_different_bits and not all(np.array_equal(lg, logits[0]) for lg in logits):
            raise SystemExit(f"{case[0]} row(s) x {case[1]} sequence(s): the two codes' logits differ")
    times = {(name, case): [] for name in runs for case in CASES}
    for _ in range(args.trials):
        for case in CASES:
            for name in runs:
                times[(name, case)].append(timed(name, case)[0])
    for case in CASES:
        median = {name: statistics.median(times[(name, case)]) * 1e3 for name in runs}
        one = {name: statistics.median(times[(name, CASES[0])]) * 1e3 for name in runs}
        parts = [f"{name} {median[name]:.2f} ms ({median[name] / one[name]:.2f}x its 1 row)" for name in runs]
        if len(runs) == 2:
            first, second = runs
            pairs = zip(times[(first, case)], times[(second, case)])
            parts.append(f"{first} / {second} {statistics.median(a / b for a, b in pairs):.3f} (median of pairs)")
        print(f"context {args.context}, {case[0]} row(s) x {case[1]} sequence(s): " + ", ".join(parts))


if __name__ == "__main__":
    main()

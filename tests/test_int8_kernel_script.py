"""scripts/bench_int8_kernel.py (issue 14's int8 products, measured alone) kept alive:
its --check compiles the AVX2 kernels and asserts their error bound and bitwise row
invariance against the float reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_int8_kernel.py"


@pytest.mark.skipif(not llvm.get_host_cpu_features().get("avx2", False), reason="the int8 kernels need AVX2")
def test_the_int8_prototype_checks_error_and_row_invariance():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check", "--kinds", "q41,q8w"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = [line for line in proc.stdout.splitlines() if "bitwise identical" in line]
    assert verdicts and all("bitwise identical: True" in line for line in verdicts)

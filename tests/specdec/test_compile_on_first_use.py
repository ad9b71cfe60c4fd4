"""The heavy kernels compile at their first use, for the types they meet, not at
import for every type; Engine.warm_up is that first use, and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specq.specdec import precision
from specq.specdec.loader import load_engine
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import GenerationRequest

# A fresh process: this one has run other tests' kernels. What it prints is how many
# machine-code versions each function holds once imported, and once a model decoded.
COUNT_COMPILED = """
import json, sys
from specq.specdec import block_ops, int8_kernels, int8_stack, layer_stack
from specq.specdec.loader import load_engine

functions = {
    "attend": block_ops.attend,
    "attend_many": block_ops.attend_many,
    "write_kv": block_ops.write_kv,
    "int8_stack._run": int8_stack._run,
    "int8_stack._run_one": int8_stack._run_one,
    "layer_stack._run": layer_stack._run,
    "layer_stack._run_one": layer_stack._run_one,
    **{name: f for name, f in vars(int8_kernels).items() if hasattr(f, "signatures") and name[-2] == "x"},
}
def types():
    return {name: [str(s) for s in f.signatures] for name, f in functions.items()}
imported = types()
if len(sys.argv) > 1:
    load_engine(model_path=sys.argv[1], proposer="ngram", precision=sys.argv[2]).warm_up()
print(json.dumps({"imported": imported, "decoded": types()}))
"""


def compiled(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", COUNT_COMPILED, *args], capture_output=True, text=True, timeout=1800, check=True
    )
    return json.loads(done.stdout)


def test_importing_the_engine_compiles_none_of_the_heavy_kernels():
    imported = compiled()["imported"]
    assert len(imported) > 10  # the int8 drivers were found
    assert {name: sigs for name, sigs in imported.items() if sigs} == {}


@pytest.mark.skipif(not precision.integer_available(), reason="the integer precisions need AVX2")
def test_a_model_loads_its_layer_loop_for_its_own_cache_only(toy_model_file):
    decoded = compiled(toy_model_file(tensor_type="Q4_1", embedding_type="Q8_0"), "int16")["decoded"]
    # int16's cache: float16 keys (their bits) and 8-bit values; not the float32,
    # float16 or 8-bit caches of the other precisions. (What the loop calls, attention
    # and the int8 products, is linked into its machine code: a process that loads
    # the loop from numba's cache never asks their dispatchers.)
    for name in ("int8_stack._run", "int8_stack._run_one"):
        assert len(decoded[name]) == 1, decoded[name]
        assert "uint16, 4" in decoded[name][0] and "int8, 4" in decoded[name][0], decoded[name]
    assert decoded["layer_stack._run"] == decoded["layer_stack._run_one"] == []  # f32's loop


def test_a_warm_up_measures_nothing_and_changes_no_output(toy_model_path):
    engine = load_engine(model_path=toy_model_path, proposer="ngram", precision="f32")
    request = GenerationRequest((5, 9, 12, 5, 9, 12, 5, 9), max_tokens=12, sampling=SamplingParams(0.9, seed=3))
    before = engine.run(request)
    timed = engine.costs._timings  # the forwards and drafts it has timed
    assert timed > 0
    engine.warm_up()  # its rounds, timed, would be a compile's or a cold cache's times
    assert engine.costs._timings == timed
    assert engine.run(request).output_ids == before.output_ids

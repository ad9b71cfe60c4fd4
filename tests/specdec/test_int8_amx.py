"""The Q8_0 products on AMX tiles (int8_amx.py): the bits of the vector kernels they
stand in for, at every number of rows and output groups, and a model's rounds and
chains long enough to reach them (its output head) equal to their rows alone."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from block_helpers import quantized_activations as _activations
from block_helpers import quantized_matrix as _matrix
from model_helpers import TOY_TOKENS as TOKENS
from model_helpers import assert_rounds_and_chains_equal_rows_alone

from specq.specdec import int8
from specq.specdec.model import LlamaModel

pytestmark = pytest.mark.skipif(not int8.TILES, reason="this CPU has no AMX tiles (or Linux did not grant them)")

ROWS = [1, 15, 16, 17, 20, 31, 32, 33, 50, 64]


@pytest.mark.parametrize("n_out,n_in", [(80, 64), (13, 128), (400, 576)])
@pytest.mark.parametrize("slices", [1, 2, 3])
@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
def test_q8_0_tiles_give_the_vector_kernels_bits(n_out, n_in, slices, split):
    """80 outputs are 5 groups (a lone group at a slice's end), 13 one: every pairing
    of groups and of 16-row tiles (1, 15, 16, 17, ... rows) against the vector driver
    the same activations go to below TILE_ROWS. The tiles multiply them as they are;
    the vector kernels take them shifted by 128 and subtract the weights' sums."""
    w = int8.Int8Matrix.from_quantized(_matrix("Q8_0", n_out, n_in)[0], split=split)
    nb = n_in // 32
    for n in ROWS:
        q, low, xd, _ = int8.quantized(_activations(n, n_in, seed=n), split, 1)
        tiles, vectors = (np.full(n * w.n_padded, np.nan, np.float32) for _ in range(2))
        int8._tiles_q8_0(w.quants, w.d, q, low, xd, tiles, n, nb, n_in, w.n_padded, slices, split)
        shifted_q, shifted_low = ((a.view(np.uint8) ^ np.uint8(0x80)).view(np.int8) for a in (q, low))
        if split:
            int8._drive_q8_0vs(
                w.quants, w.d, w.sums, shifted_q, shifted_low, xd, vectors, n, nb, n_in, w.n_padded, slices
            )
        else:
            int8._drive_q8_0v(w.quants, w.d, w.sums, shifted_q, xd, vectors, n, nb, n_in, w.n_padded, slices)
        np.testing.assert_array_equal(tiles.view(np.uint32), vectors.view(np.uint32), err_msg=f"{n} rows")


@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
def test_products_from_tile_rows_up_equal_the_integer_reference(split):
    w = int8.Int8Matrix.from_quantized(_matrix("Q8_0", 64, 96)[0], split=split)
    x = _activations(int8.TILE_ROWS + 5, 96)
    got = int8.int8_matmul_t(x, w)
    np.testing.assert_array_equal(got.view(np.uint32), int8.int8_matmul_t_reference(x, w).view(np.uint32))


@pytest.fixture(scope="module")
def model(toy_model_file):
    return LlamaModel.load(toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0")).at_precision("int16")


def test_rounds_and_chains_on_tiles_equal_their_rows_alone(model):
    """A round of TILE_ROWS + 2 sequences and a chain of 24 tokens run the output head
    (Q8_0, the embeddings tied) on tiles; each row alone on vectors: the same logits."""
    n = int8.TILE_ROWS + 2
    assert len(TOKENS) >= int8.TILE_ROWS
    assert_rounds_and_chains_equal_rows_alone(model, [(TOKENS * 2)[i : i + 3 + i % 4] for i in range(n)], TOKENS)


def test_without_amx_in_the_cpu_features_no_tile_is_used():
    """NUMBA_CPU_FEATURES names what numba compiles for (a build for another CPU):
    without amx-int8 there, the tiles must stay off, whatever this CPU has."""
    import llvmlite.binding as llvm

    features = ",".join(
        f"{'+' if on else '-'}{name}"
        for name, on in llvm.get_host_cpu_features().items()
        if on and not name.startswith("amx")
    )
    env = {**os.environ, "NUMBA_CPU_FEATURES": features, "NUMBA_CPU_NAME": "generic"}
    code = "from specq.specdec import amx, int8; print(amx.AVAILABLE, int8.TILES, int8.TILE_ROWS > 10**9)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]

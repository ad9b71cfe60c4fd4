"""GGUF's block types unpacked into the int8 kernels' formats (gguf_blocks.py): the
values equal gguf's reference dequantization bit for bit, on random blocks of every
type, and so do the int8 layouts made from them. One exception: the sign of a zero
in a Q4_0 block whose d is 0 (gguf's d (q - 8) gives -0.0 for q < 8, which d q - 8d
cannot): equal values, and no product can tell them apart."""

from __future__ import annotations

import numpy as np
import pytest
from block_helpers import random_tensor
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from specq.specdec import gguf_blocks, int8
from specq.specdec.gguf_blocks import BlockMatrix

TYPES = sorted(gguf_blocks.FORMAT_OF)


def assert_same_values(got: np.ndarray, expected: np.ndarray) -> None:
    """Bit for bit, but for the sign of zeros (module docstring)."""
    np.testing.assert_array_equal(got, expected)
    nonzero = expected != 0
    np.testing.assert_array_equal(got[nonzero].view(np.uint32), expected[nonzero].view(np.uint32))


def reference(type_name: str, data: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    return dequantize(data, GGMLQuantizationType[type_name]).reshape(n_out, n_in).astype(np.float32)


@pytest.mark.parametrize("type_name", TYPES)
def test_unpacked_values_are_ggufs_bit_for_bit(type_name):
    n_out, n_in = 24, 512
    data = random_tensor(type_name, n_out, n_in)
    bm = gguf_blocks.unpack(type_name, data, (n_out, n_in))
    assert bm.type_name == gguf_blocks.FORMAT_OF[type_name]
    expected = reference(type_name, data, n_out, n_in)
    assert_same_values(bm.dequantize(), expected)
    ids = [n_out - 1, 0, 7, 7]
    assert_same_values(bm.rows(ids), expected[ids])


@pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 kernels need AVX2")
@pytest.mark.parametrize("type_name", TYPES)
def test_the_int8_layout_keeps_the_values(type_name):
    n_out, n_in = 40, 256  # 40 outputs: padded to the kernels' lanes
    data = random_tensor(type_name, n_out, n_in, seed=3)
    w = int8.Int8Matrix.from_blocks(**_fields(gguf_blocks.unpack(type_name, data, (n_out, n_in))))
    expected = reference(type_name, data, n_out, n_in)
    assert_same_values(w.dequantize(), expected)
    assert_same_values(w.select_rows([39, 2]).dequantize(), expected[[39, 2]])


def _fields(bm: BlockMatrix) -> dict:
    return {"type_name": bm.type_name, "shape": bm.shape, "ints": bm.ints, "d": bm.d, "m": bm.m}


def test_matrices_of_different_types_stack_in_a_format_holding_both():
    n_in = 256
    parts = {t: gguf_blocks.unpack(t, random_tensor(t, 8, n_in, seed=i), (8, n_in)) for i, t in enumerate(TYPES)}
    for a in TYPES:
        for b in TYPES:
            both = BlockMatrix.concat([parts[a], parts[b]])
            expected = np.concatenate([parts[a].dequantize(), parts[b].dequantize()])
            np.testing.assert_array_equal(both.dequantize().view(np.uint32), expected.view(np.uint32))
            if parts[a].type_name == parts[b].type_name:
                assert both.type_name == parts[a].type_name
    assert gguf_blocks.common_format(["Q4_1", "Q8_0"]) == "Q8_M"
    assert gguf_blocks.common_format(["Q8_0", "Q8_H"]) == "Q8_H"


def _activations(n: int, n_in: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    x[:, :3] *= 20  # outliers, as real activations have
    x[0, 32:64] = 0.0  # an all-zero block
    return x


@pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 kernels need AVX2")
@pytest.mark.parametrize("split", [False, True], ids=["int8", "int16"])
@pytest.mark.parametrize("type_name", TYPES)
def test_products_equal_the_integer_reference_and_ignore_companion_rows(type_name, split):
    n_out, n_in = 72, 256
    bm = gguf_blocks.unpack(type_name, random_tensor(type_name, n_out, n_in, seed=5), (n_out, n_in))
    w = int8.Int8Matrix.from_blocks(**_fields(bm), split=split)
    x = _activations(13, n_in)
    got = int8.int8_matmul_t(x, w)
    np.testing.assert_array_equal(got.view(np.uint32), int8.int8_matmul_t_reference(x, w).view(np.uint32))
    exact = x.astype(np.float64) @ bm.dequantize().T.astype(np.float64)
    bound = 4e-4 if split else 3e-2  # the rounding of the activations to 15 or 8 bits
    assert np.abs(got - exact).max() <= bound * np.abs(exact).max()
    for group in (1, 2, 3, 4, 5):
        parts = [int8.int8_matmul_t(x[i : i + group], w) for i in range(0, 13, group)]
        np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), got.view(np.uint32))

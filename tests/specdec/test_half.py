"""F16 and BF16 matrices kept in their 2 bytes (half.py): gguf's values, products
close to float64 and bitwise independent of the companion rows, and models of these
types keeping them so, in the compiled block loop at the integer precisions."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from model_helpers import assert_stack_equals_python_loop

from specq.specdec import half
from specq.specdec.half import HalfMatrix
from specq.specdec.model import LlamaModel, Segment

TOKENS = [1, 42, 267, 7, 300, 3, 150, 258, 259, 99, 2, 17, 64, 128, 200, 11, 5, 280, 33, 306, 0, 75, 76, 77]


def _matrix(type_name: str, n_out: int, n_in: int, seed: int = 0) -> tuple[HalfMatrix, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    w[0, :4] = [0.0, -0.0, 6e-8, 65000.0]  # zeros, a subnormal F16, a large value
    raw = np.asarray(quantize(w, GGMLQuantizationType[type_name])).view(np.uint8).reshape(n_out, -1)
    values = dequantize(raw, GGMLQuantizationType[type_name]).reshape(n_out, n_in).astype(np.float32)
    return HalfMatrix.from_gguf_bytes(raw, type_name, (n_out, n_in)), values


@pytest.mark.parametrize("type_name", half.TYPES)
def test_values_are_ggufs_and_products_are_row_invariant(type_name):
    w, values = _matrix(type_name, 70, 96)
    np.testing.assert_array_equal(w.dequantize().view(np.uint32), values.view(np.uint32))
    np.testing.assert_array_equal(w.rows([69, 0, 3]), values[[69, 0, 3]])
    x = np.random.default_rng(1).standard_normal((13, 96)).astype(np.float32)
    got = half.half_matmul_t(x, w)
    exact = x.astype(np.float64) @ values.T.astype(np.float64)
    assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max()
    for group in (1, 2, 3, 5):
        parts = [half.half_matmul_t(x[i : i + group], w) for i in range(0, 13, group)]
        np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("precision", ["f32", "int16"])
@pytest.mark.parametrize("type_name", half.TYPES)
def test_a_model_keeps_its_weights_in_two_bytes(toy_model_file, type_name, precision):
    path = toy_model_file(seed=4, tensor_type=type_name)
    model = LlamaModel.load(path, precision)
    for lw in model.weights.layers:
        for k in ("w_qkv", "w_out", "w_gate_up", "w_down"):
            assert isinstance(getattr(lw, k), HalfMatrix) and getattr(lw, k).type_name == type_name
    assert isinstance(model.weights.token_embedding, HalfMatrix)
    assert (model._stack is not None) == (precision == "int16")  # the compiled loop takes F16 at int16
    out = model.forward([Segment(model.new_cache(), TOKENS, 0)])[0]
    reference = model.dequantized().forward([Segment(model.new_cache(), TOKENS, 0)])[0]
    assert np.abs(out.logits - reference.logits).max() <= 1e-4 * np.abs(reference.logits).max()
    if model._stack is not None:
        assert_stack_equals_python_loop(model, TOKENS)

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from specq.specdec.qkernels import LANES, QuantizedMatrix, qmatmul_t


def gguf_bytes(type_name: str, n_out: int, n_in: int, seed: int = 0) -> np.ndarray:
    """A random matrix quantized by gguf itself: uint8 [n_out, bytes per row], as a
    GGUF reader hands it over. Blocks with a wide range of scales (and one constant
    row, whose Q4_1 d is 0) exercise the fp16 conversions."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_out, n_in), dtype=np.float32)
    w *= np.exp2(rng.integers(-8, 4, size=(n_out, n_in // 32, 1))).repeat(32, axis=2).reshape(n_out, n_in)
    w += rng.standard_normal((n_out, 1), dtype=np.float32)  # Q4_1's m away from -d * 8
    w[0] = 0.25
    raw = quantize(w, GGMLQuantizationType[type_name])
    assert raw.dtype == np.uint8 and raw.shape[0] == n_out
    return raw


def reference(raw: np.ndarray, type_name: str, n_out: int, n_in: int) -> np.ndarray:
    return dequantize(raw, GGMLQuantizationType[type_name]).reshape(n_out, n_in).astype(np.float32)


SHAPES = [(LANES, 32), (7, 64), (100, 96), (3 * LANES + 5, 160)]


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("n_out, n_in", SHAPES)
def test_dequantize_equals_gguf_bitwise(type_name, n_out, n_in):
    raw = gguf_bytes(type_name, n_out, n_in)
    w = QuantizedMatrix.from_gguf_bytes(raw, type_name, (n_out, n_in))
    assert w.shape == (n_out, n_in) and w.type_name == type_name
    got = w.dequantize()
    assert got.dtype == np.float32 and got.shape == (n_out, n_in)
    np.testing.assert_array_equal(got, reference(raw, type_name, n_out, n_in))


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("n_out, n_in", SHAPES)
def test_transposed_dequantization_has_the_same_bits(type_name, n_out, n_in):
    raw = gguf_bytes(type_name, n_out, n_in)
    w = QuantizedMatrix.from_gguf_bytes(raw, type_name, (n_out, n_in))
    got = w.dequantize_t()
    assert got.dtype == np.float32 and got.shape == (n_in, n_out) and got.strides[1] == 4
    np.testing.assert_array_equal(got, reference(raw, type_name, n_out, n_in).T)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("n_out, n_in", SHAPES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 16, 21])
def test_product_equals_float_reference(type_name, n_out, n_in, n):
    raw = gguf_bytes(type_name, n_out, n_in, seed=n)
    w = QuantizedMatrix.from_gguf_bytes(raw, type_name, (n_out, n_in))
    x = np.random.default_rng(n).standard_normal((n, n_in), dtype=np.float32)
    got = qmatmul_t(x, w)
    assert got.shape == (n, n_out) and got.dtype == np.float32
    want = x.astype(np.float64) @ reference(raw, type_name, n_out, n_in).T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_a_row_gets_the_same_bits_whatever_rows_come_with_it(type_name):
    """Plain decoding (one row) and verification (k+1 rows) then compute identical
    logits for the same context."""
    n_out, n_in = 2 * LANES + 3, 576
    w = QuantizedMatrix.from_gguf_bytes(gguf_bytes(type_name, n_out, n_in), type_name, (n_out, n_in))
    x = np.random.default_rng(1).standard_normal((19, n_in), dtype=np.float32)
    alone = np.concatenate([qmatmul_t(x[r : r + 1], w) for r in range(len(x))])
    for n in range(2, len(x) + 1):
        np.testing.assert_array_equal(qmatmul_t(x[:n], w), alone[:n])
    np.testing.assert_array_equal(qmatmul_t(x[5:12], w), alone[5:12])


def test_activations_of_any_layout_and_dtype_are_accepted():
    raw = gguf_bytes("Q4_1", 40, 64)
    w = QuantizedMatrix.from_gguf_bytes(raw, "Q4_1", (40, 64))
    x = np.random.default_rng(2).standard_normal((6, 128))[:, ::2]  # float64, strided
    want = qmatmul_t(np.ascontiguousarray(x, dtype=np.float32), w)
    np.testing.assert_array_equal(qmatmul_t(x, w), want)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_concat_stacks_rows(type_name):
    n_in = 96
    sizes = [LANES + 3, 5, 2 * LANES]  # padding inside the stack must not leak
    raws = [gguf_bytes(type_name, n, n_in, seed=i) for i, n in enumerate(sizes)]
    parts = [QuantizedMatrix.from_gguf_bytes(r, type_name, (n, n_in)) for r, n in zip(raws, sizes)]
    fused = QuantizedMatrix.concat(parts)
    assert fused.shape == (sum(sizes), n_in)
    want = np.concatenate([reference(r, type_name, n, n_in) for r, n in zip(raws, sizes)])
    np.testing.assert_array_equal(fused.dequantize(), want)
    x = np.random.default_rng(3).standard_normal((3, n_in), dtype=np.float32)
    np.testing.assert_array_equal(qmatmul_t(x, fused), np.concatenate([qmatmul_t(x, p) for p in parts], axis=1))


def test_concat_refuses_mismatched_parts():
    a = QuantizedMatrix.from_gguf_bytes(gguf_bytes("Q4_1", 8, 64), "Q4_1", (8, 64))
    b = QuantizedMatrix.from_gguf_bytes(gguf_bytes("Q8_0", 8, 64), "Q8_0", (8, 64))
    c = QuantizedMatrix.from_gguf_bytes(gguf_bytes("Q4_1", 8, 96), "Q4_1", (8, 96))
    for other in (b, c):
        with pytest.raises(ValueError):
            QuantizedMatrix.concat([a, other])
    with pytest.raises(ValueError):
        QuantizedMatrix.concat([])


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_rows_are_dequantized_rows(type_name):
    n_out, n_in = 2 * LANES + 9, 64
    raw = gguf_bytes(type_name, n_out, n_in)
    w = QuantizedMatrix.from_gguf_bytes(raw, type_name, (n_out, n_in))
    ids = [0, 5, n_out - 1, LANES, 5]
    got = w.rows(ids)
    assert got.shape == (len(ids), n_in) and got.dtype == np.float32
    np.testing.assert_array_equal(got, reference(raw, type_name, n_out, n_in)[ids])
    assert w.rows([]).shape == (0, n_in)
    with pytest.raises(IndexError):
        w.rows([n_out])


def test_unsupported_types_and_malformed_data_raise_value_error():
    raw = gguf_bytes("Q4_1", 8, 64)
    for type_name in ("Q4_0", "F32", "Q6_K", "q4_1"):
        with pytest.raises(ValueError, match=type_name):
            QuantizedMatrix.from_gguf_bytes(raw, type_name, (8, 64))
    with pytest.raises(ValueError):
        QuantizedMatrix.from_gguf_bytes(raw, "Q8_0", (8, 64))  # Q4_1-sized rows
    with pytest.raises(ValueError):
        QuantizedMatrix.from_gguf_bytes(raw, "Q4_1", (8, 48))  # not whole blocks
    with pytest.raises(ValueError):
        QuantizedMatrix.from_gguf_bytes(raw.astype(np.int16), "Q4_1", (8, 64))
    w = QuantizedMatrix.from_gguf_bytes(raw, "Q4_1", (8, 64))
    with pytest.raises(ValueError):
        qmatmul_t(np.zeros((2, 32), np.float32), w)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_selected_rows_give_the_whole_matrix_products_bits(type_name):
    """A draft vocabulary's rows of the output head: the same logits, bit for bit, as
    those rows of a product with the whole head."""
    n_out, n_in = 3 * LANES + 7, 96
    w = QuantizedMatrix.from_gguf_bytes(gguf_bytes(type_name, n_out, n_in), type_name, (n_out, n_in))
    ids = np.array([0, 3, LANES - 1, LANES, 2 * LANES + 1, n_out - 1])
    part = w.select_rows(ids)
    assert part.shape == (len(ids), n_in) and part.type_name == type_name
    np.testing.assert_array_equal(part.dequantize(), w.dequantize()[ids])
    x = np.random.default_rng(4).standard_normal((3, n_in), dtype=np.float32)
    np.testing.assert_array_equal(qmatmul_t(x, part), qmatmul_t(x, w)[:, ids])
    for bad in ([], [n_out], [-1]):
        with pytest.raises(IndexError):
            w.select_rows(bad)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_gguf_bytes_round_trip(type_name):
    n_out, n_in = LANES + 5, 64  # padded: the padding is not written back
    raw = gguf_bytes(type_name, n_out, n_in)
    back = QuantizedMatrix.from_gguf_bytes(raw, type_name, (n_out, n_in)).to_gguf_bytes()
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, raw)

"""Which kernel multiplies which rows (specq.specdec.matmul): a long segment (a
prompt) by BLAS on its own, every other row by the weight's kernel."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from specq.specdec.matmul import BULK_ROWS, RowPlan, dequantized, dequantized_t, linear
from specq.specdec.qkernels import QuantizedMatrix

LENGTHS = [5, BULK_ROWS + 12, 3, BULK_ROWS, 1]  # two prompts among verification rows


def weights(n_out: int = 200, n_in: int = 96) -> dict[str, object]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_out, n_in), dtype=np.float32)
    q = QuantizedMatrix.from_gguf_bytes(quantize(w, GGMLQuantizationType.Q4_1), "Q4_1", (n_out, n_in))
    return {"float32": w, "Q4_1": q}


def test_row_plan_splits_long_segments_from_the_rest():
    plan = RowPlan(LENGTHS)
    first, second = 5, 5 + BULK_ROWS + 12 + 3
    assert plan.bulk == [slice(first, first + BULK_ROWS + 12), slice(second, second + BULK_ROWS)]
    assert plan.few.tolist() == [0, 1, 2, 3, 4, second - 3, second - 2, second - 1, sum(LENGTHS) - 1]
    assert RowPlan([BULK_ROWS - 1, 16]).bulk == []


@pytest.mark.parametrize("kind", ["float32", "Q4_1"])
def test_each_row_goes_through_the_path_of_its_own_segment(kind):
    w = weights()[kind]
    x = np.random.default_rng(1).standard_normal((sum(LENGTHS), 96), dtype=np.float32)
    plan = RowPlan(LENGTHS)
    got = plan.linear(x, w)
    assert got.shape == (len(x), 200) and got.dtype == np.float32
    dense = dequantized(w)
    np.testing.assert_array_equal(dequantized_t(w), dense.T)
    for rows in plan.bulk:  # each prompt alone, by BLAS
        np.testing.assert_array_equal(got[rows], x[rows] @ dequantized_t(w))
    # The other rows as the kernel computes them, as if they were alone in the forward.
    np.testing.assert_array_equal(got[plan.few], linear(x[plan.few], w))
    np.testing.assert_array_equal(got[:5], linear(x[:5], w))
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_without_long_segments_the_kernel_does_everything():
    w = weights()["Q4_1"]
    x = np.random.default_rng(2).standard_normal((20, 96), dtype=np.float32)
    np.testing.assert_array_equal(RowPlan([4, 16]).linear(x, w), linear(x, w))


def test_dequantizing_for_blas_leaves_numba_threads_as_they_were():
    w = weights()["Q4_1"]
    before = numba.get_num_threads()
    np.testing.assert_array_equal(dequantized(w), w.dequantize())
    assert numba.get_num_threads() == before
    f = weights()["float32"]
    assert dequantized(f) is f  # float32 weights are used as they are, not copied

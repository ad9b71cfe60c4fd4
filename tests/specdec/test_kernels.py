from __future__ import annotations

import numpy as np
import pytest

from specq.specdec.kernels import KERNEL_MAX_ROWS, matmul_t


@pytest.mark.parametrize("n_out, n_in", [(7, 5), (96, 64), (300, 130)])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 40])
def test_matmul_t_equals_numpy(n, n_out, n_in):
    rng = np.random.default_rng(n * 1000 + n_out)
    w = rng.standard_normal((n_out, n_in), dtype=np.float32)
    x = rng.standard_normal((n, n_in), dtype=np.float32)
    got = matmul_t(x, w)
    assert got.shape == (n, n_out) and got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_a_row_gets_the_same_bits_whatever_rows_come_with_it():
    """Plain decoding (one row) and verification (k+1 rows) then compute identical
    logits for the same context: greedy speculative output cannot drift from plain
    decoding through rounding in these products."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1000, 576), dtype=np.float32)
    rows = 3 * KERNEL_MAX_ROWS + 5  # past the kernel's own width: batched rounds get there
    x = rng.standard_normal((rows, 576), dtype=np.float32)
    alone = np.stack([matmul_t(x[r : r + 1], w)[0] for r in range(rows)])
    for n in range(2, rows + 1):
        np.testing.assert_array_equal(matmul_t(x[:n], w), alone[:n])
    # Any company, in any order: a row's bits are its own.
    order = rng.permutation(rows)
    np.testing.assert_array_equal(matmul_t(x[order], w), alone[order])


def test_non_contiguous_rows_are_accepted():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((50, 32), dtype=np.float32)
    x = rng.standard_normal((6, 64), dtype=np.float32)[:, ::2]
    np.testing.assert_allclose(matmul_t(x, w), x @ w.T, rtol=1e-5, atol=1e-5)

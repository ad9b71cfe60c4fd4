"""The model's matrix products x @ w.T, and which kernel computes each row.

A weight is a qkernels.QuantizedMatrix (Q4_1 and Q8_0, the default model's types,
and Q4_0 and Q5_0 re-encoded as them, at the f32 precision), an int8.Int8Matrix (every
type with integer blocks, at int16 and int8), a gguf_blocks.BlockMatrix (such a
type's blocks unpacked: an embedding, only looked up by rows; a head tied to it gets
an Int8Matrix of its own), a half.HalfMatrix (F16 and
BF16, kept in their 2 bytes) or a float32 array (F32, Q2_K, and the K-quants and
Q5_1 at f32). `linear` computes the product
with the weight's kernel. Every kernel gives a row the same bits whatever rows come
with it (float32 up to kernels.KERNEL_MAX_ROWS rows, quantized at any count), so
plain decoding and verification compute identical logits.

Prompts are the exception at f32 (for every weight but F16/BF16's, whose kernel
outruns BLAS on prompts too). The quantized kernel is bound by arithmetic once the
weights are in cache, and on many rows BLAS is faster even after dequantizing the
weights for the product: a 200-token prefill took 1.24 s through the kernel and
0.57 s through BLAS (docs/performance.md). So a segment of BULK_ROWS rows
or more (only a prompt is that long: a verification has at most 17 rows) is
multiplied by BLAS on its own, with float32 values made for that product and
dropped after it: no float32 copy of the model stays in memory. Which path a row
takes depends only on the length of its own segment, never on the other segments
of a batched forward, so a row's bits still do not depend on its companions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from specq.specdec.gguf_blocks import BlockMatrix
from specq.specdec.half import HalfMatrix, half_matmul_t
from specq.specdec.int8 import Int8Matrix, int8_matmul_t
from specq.specdec.kernels import matmul_t
from specq.specdec.qkernels import QuantizedMatrix, qmatmul_t

# A weight matrix [n_out, n_in] in GGUF's layout: quantized blocks (for the float32
# kernel, or for the int8 one at the int8 precision), or float32.
Weight = QuantizedMatrix | Int8Matrix | BlockMatrix | HalfMatrix | np.ndarray

# Segments at least this long go through BLAS. Measured on the default model, prefills
# from position 0 (docs/performance.md): 52 rows take 197 ms through the kernel and
# 309 ms through BLAS, 53 rows 382 ms and 311 ms. At 53 rows attention's products
# (3n x 64 by 64 x n) become large enough for OpenBLAS to start its own threads,
# which from then on spin against numba's between every two kernel calls.
BULK_ROWS = 53


def linear(x: np.ndarray, w: Weight) -> np.ndarray:
    """x [n, n_in] -> x @ w.T [n, n_out], float32."""
    if isinstance(w, HalfMatrix):
        return half_matmul_t(x, w)
    if isinstance(w, QuantizedMatrix):
        return qmatmul_t(x, w)
    if isinstance(w, Int8Matrix):
        return int8_matmul_t(x, w)
    return matmul_t(x, w)


def embed(w: Weight, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of an embedding matrix, float32 [len(ids), d]."""
    return w.rows(ids) if isinstance(w, (QuantizedMatrix, Int8Matrix, BlockMatrix, HalfMatrix)) else w[ids]


def dequantized(w: Weight) -> np.ndarray:
    """The float32 values of a weight, [n_out, n_in]. A quantized one is dequantized
    on the calling thread alone: waking numba's threads between two BLAS products
    makes them and OpenBLAS's spin against each other on two cores (measured 2 to 3
    times slower for both)."""
    if isinstance(w, (Int8Matrix, BlockMatrix, HalfMatrix)):
        return w.dequantize()
    if not isinstance(w, QuantizedMatrix):
        return w
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return w.dequantize()
    finally:
        numba.set_num_threads(threads)


def dequantized_t(w: Weight) -> np.ndarray:
    """w's float32 values transposed, [n_in, n_out] (a view for a float32 weight)."""
    if isinstance(w, (Int8Matrix, BlockMatrix, HalfMatrix)):
        return w.dequantize().T
    return w.dequantize_t() if isinstance(w, QuantizedMatrix) else w.T


def n_values(w: Weight) -> int:
    return int(np.prod(w.shape))


class RowPlan:
    """How the rows of one forward are multiplied: each segment of BULK_ROWS rows or
    more by BLAS on its own, all the other rows together through `linear`."""

    def __init__(self, lengths: Sequence[int]) -> None:
        bounds = np.cumsum([0, *lengths])
        self.bulk = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b - a >= BULK_ROWS]
        few = np.ones(bounds[-1], dtype=bool)
        for rows in self.bulk:
            few[rows] = False
        self.few = np.flatnonzero(few)  # indices of the rows that go through `linear`

    def linear(self, x: np.ndarray, w: Weight) -> np.ndarray:
        """x [rows, n_in] -> x @ w.T [rows, n_out], float32. The int8 and the F16/BF16
        kernels take every row: they outrun BLAS on a prompt too, which needs the
        weights in float32 first (docs/performance.md; F16, 150-token prompts: 213
        tokens/s by BLAS)."""
        if not self.bulk or isinstance(w, (Int8Matrix, HalfMatrix)):
            return linear(x, w)
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)  # [rows, n_out]
        dense_t = dequantized_t(w)  # [n_in, n_out], for this product only
        for rows in self.bulk:
            out[rows] = x[rows] @ dense_t
        if self.few.size:
            out[self.few] = linear(x[self.few], w)
        return out

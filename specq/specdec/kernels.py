"""Products of a few activation rows with a weight matrix, for the verification pass.

OpenBLAS (the SkylakeX sgemm kernel numpy ships) handles 2 to 8 rows badly: it packs
the whole weight matrix for every product, so 2 rows cost 3 to 5 times one row
(measured: the 49152x576 output head 5 ms as a matrix-vector product, 27 ms as a
2-row product). A verification forward is exactly that shape. The kernel below reads
each weight row once and multiplies every activation row with it while it is in L1,
so the weights stream from memory once however many rows there are. Each row still
costs its own arithmetic: on the 2-core AMD EPYC (AVX2) the 49152x576 head took
3.6 ms for 1 row, 4.3 ms for 2 and 7.3 ms for 5 (the default model does not use this
kernel: its weights are Q4_1/Q8_0, see qkernels.py).

Weights are kept in GGUF's natural (n_out, n_in) layout: one row per output.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# Up to this many rows the kernels beat BLAS. One row also runs here rather than as a
# BLAS matrix-vector product: two thread pools (numba's and OpenBLAS's) taking turns
# on two cores spin against each other and made a decode step several times slower.
# Many rows (prefill) are a real matrix product, BLAS's strength.
KERNEL_MAX_ROWS = 16


def matmul_t(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [n, n_in] float32, w [n_out, n_in] float32 -> x @ w.T, [n, n_out] float32.

    Every row gets the same bits whatever rows come with it, at any n: past
    KERNEL_MAX_ROWS the kernel runs on chunks rather than handing the product to
    BLAS, whose rounding depends on the other rows. Otherwise a request's output
    would depend on which requests shared its forward (a batch refilled in another
    order, a resume on another worker) through near-ties. A long prefill that wants
    BLAS's speed must be multiplied alone (the model does that)."""
    n = x.shape[0]
    w = np.ascontiguousarray(w, dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((n, w.shape[0]), dtype=np.float32)  # [n, n_out]
    for start in range(0, n, KERNEL_MAX_ROWS):
        _rows_times_weights(x[start : start + KERNEL_MAX_ROWS], w, out[start : start + KERNEL_MAX_ROWS])
    return out


# Explicit signatures compile at import (once per install: the machine code is cached
# beside this file), not inside the first request's decode time.
_ROWS = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"


@njit(_ROWS, parallel=True, fastmath=True, cache=True, nogil=True)
def _rows_times_weights(x, w, out):  # pragma: no cover - compiled
    # Every row runs through this one reduction loop, so its bits cannot depend on
    # how many rows share the call. fastmath lets LLVM vectorize the reduction in an
    # order of its choosing, and that order differs between loop bodies: a body with
    # four accumulators (w[o, i] loaded once for four rows, as this kernel had) summed
    # a row differently from a body with one, on AVX2 (it happened not to on
    # AVX-512). The price is a second load per multiply-add, from L1: w[o] (n_in
    # floats) stays there while the rows pass over it, so the weights still stream
    # from memory once.
    n, n_in = x.shape
    for o in prange(w.shape[0]):
        for r in range(n):
            acc = np.float32(0.0)
            for i in range(n_in):
                acc += w[o, i] * x[r, i]
            out[r, o] = acc

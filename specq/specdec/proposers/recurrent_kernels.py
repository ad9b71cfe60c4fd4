"""The recurrent head's drafting in compiled code: its step, its confidence, and a
whole greedy chain of drafts in one call.

Why one call. A draft is proposed right after a target forward has streamed about
100 MB of weights through the caches, so everything the proposer touches is cold:
the head's weights, and also the Python interpreter's and numpy's own state. Measured
on the 2-core Intel Xeon (the shipped head, int16, caches flushed before each call):
a first head step through numpy and the kernels' Python wrappers took 0.68 to 0.73
ms, 0.14 ms of it a one-row embedding lookup (its 576 values in 576 cache lines of
the lanes layout), against 0.22 ms warm. The same arithmetic as one compiled call
takes 0.46 ms cold. In the bench mix's speculative decode the head's steps had cost
0.57 ms each where the engine charges 0.06 of a 4 ms step (docs/medusa.md).

Same bits, whichever path. The products are the ones `matmul.linear` runs for these
weights (`qkernels.q8_0_product` for the head's Q8_0 matrices and for the draft rows
at f32, `int8.product_q8_0` for the draft rows at int16 and int8), with the same
thread counts; SiLU and the confidence are the compiled functions below, which the
uncompiled path (`RecurrentHead.step`, other weight types) and the training code's
figures call too. So the chain drafts exactly what step-by-step drafting drafts, and
what `train-heads` measured its gates on.
"""

from __future__ import annotations

import numpy as np
from numba import config, njit

from specq.specdec import int8
from specq.specdec.block_ops import exp_inplace
from specq.specdec.qkernels import LANES, QuantizedMatrix, q8_0_product

ROWS_INT8 = 0  # the draft rows are an int8.Int8Matrix of Q8_0 blocks (int16, int8)
ROWS_Q8_0 = 1  # a qkernels.QuantizedMatrix of Q8_0 blocks (f32)

if int8.AVAILABLE:
    _int8_q8_0 = int8.product_q8_0
else:  # no Int8Matrix exists without AVX2; the chain only needs a function of that name

    @njit(nogil=True, cache=True)
    def _int8_q8_0(x, quants, d, sums, n_out, n_threads, split):  # pragma: no cover - compiled
        raise RuntimeError("the int8 kernels need AVX2")


@njit(nogil=True, cache=True)
def head_silu(z):  # pragma: no cover - compiled
    """z [n, h] float32 -> z / (1 + exp(-z)), exp as the layers' SwiGLU computes it
    (vectorized; libm's scalar exp took a tenth of a warm head step)."""
    n, h = z.shape
    out = np.empty((n, h), dtype=np.float32)
    e = np.empty(h, dtype=np.float32)
    pow2 = np.empty(h, dtype=np.int32)
    for r in range(n):
        for i in range(h):
            e[i] = -z[r, i]
        exp_inplace(e, h, pow2)
        for i in range(h):
            out[r, i] = z[r, i] / (np.float32(1.0) + e[i])
    return out


@njit(nogil=True, cache=True)
def draft_confidence(logits):  # pragma: no cover - compiled
    """logits [n] float32 over the draft vocabulary -> (the first largest's index, the
    head's probability for it at temperature 1: 1 / sum exp(logit - largest)), the
    sum in float64 in index order."""
    n = logits.shape[0]
    best = 0
    for j in range(1, n):
        if logits[j] > logits[best]:
            best = j
    e = np.empty(n, dtype=np.float32)
    for j in range(n):
        e[j] = logits[j] - logits[best]
    exp_inplace(e, n, np.empty(n, dtype=np.int32))
    total = 0.0
    for j in range(n):
        total += e[j]
    return best, 1.0 / total


@njit(nogil=True, cache=True)
def draft_confidences(logits):  # pragma: no cover - compiled
    """draft_confidence of each row of logits [r, n]: (indices [r], confidences [r])."""
    r = logits.shape[0]
    best = np.empty(r, dtype=np.int64)
    confidence = np.empty(r, dtype=np.float64)
    for i in range(r):
        best[i], confidence[i] = draft_confidence(logits[i])
    return best, confidence


@njit(nogil=True, cache=True)
def _q8_0_linear(x, quants, scales, n_out, n_slices):  # pragma: no cover - compiled
    """x [n, n_in] @ w.T for a Q8_0 QuantizedMatrix's arrays, as qkernels.qmatmul_t."""
    out = np.empty((x.shape[0], quants.shape[0] * LANES), dtype=np.float32)
    q8_0_product(x, quants, scales, out, n_slices)
    return out[:, :n_out]


@njit(nogil=True, cache=True)
def head_step_q8_0(state, embedded, head, n_slices):  # pragma: no cover - compiled
    """RecurrentHead.step for Q8_0 matrices: state [n, d] and the embeddings of the
    tokens they continue [n, d] -> next states [n, d]. head = (w_in's quants and
    scales, b_in, w_out's quants and scales)."""
    w_in_q, w_in_s, b_in, w_out_q, w_out_s = head
    n, d = state.shape
    h = b_in.shape[0]
    x = np.empty((n, 2 * d), dtype=np.float32)
    x[:, :d] = state
    x[:, d:] = embedded
    z = _q8_0_linear(x, w_in_q, w_in_s, h, n_slices)
    biased = np.empty((n, h), dtype=np.float32)
    for r in range(n):
        for i in range(h):
            biased[r, i] = z[r, i] + b_in[i]
    out = _q8_0_linear(head_silu(biased), w_out_q, w_out_s, d, n_slices)
    for r in range(n):
        for i in range(d):
            out[r, i] = state[r, i] + out[r, i]
    return np.ascontiguousarray(out)


@njit(nogil=True, cache=True)
def _draft_logits(state, rows, n_threads):  # pragma: no cover - compiled
    """[1, d] -> logits [n] over the draft vocabulary, as matmul.linear gives them.
    rows = (kind, n_out, the Int8Matrix's quants, d, sums, padded outputs and split,
    the QuantizedMatrix's quants and scales): the arrays of the other kind are empty."""
    kind, n_out, quants, d, sums, n_padded, split, q_quants, q_scales = rows
    if kind == ROWS_INT8:
        return _int8_q8_0(state, quants, d, sums, n_padded, n_threads, split)[0, :n_out]
    return _q8_0_linear(state, q_quants, q_scales, n_out, n_threads)[0]


@njit(nogil=True, cache=True)
def step_logits(state, embedded, head, rows, n_threads):  # pragma: no cover - compiled
    """One draft: (the next state [1, d], its logits [n] over the draft vocabulary)."""
    state = head_step_q8_0(state, embedded, head, n_threads)
    return state, _draft_logits(state, rows, n_threads)


@njit(nogil=True, cache=True)
def greedy_chain(state, embedded, k, gate, head, rows, table, vocab, n_threads):  # pragma: no cover - compiled
    """Up to k greedy drafts from state [1, d] and the embedding [1, d] of the token it
    continues, each drafted while the head's confidence in it reaches gate[depth] (the
    last figure for deeper ones): the drafted tokens' ids. table [len(vocab), d] holds
    the draft vocabulary's embeddings, which every drafted token is in."""
    drafted = np.empty(k, dtype=np.int64)
    n = 0
    for i in range(k):
        state, logits = step_logits(state, embedded, head, rows, n_threads)
        best, confidence = draft_confidence(logits)
        if confidence < gate[min(i, gate.shape[0] - 1)]:
            break
        drafted[n] = vocab[best]
        n += 1
        embedded = table[best : best + 1]
    return drafted[:n]


def q8_0_arrays(w: object) -> tuple | None:
    """A head matrix's (quants, scales) where it is a Q8_0 QuantizedMatrix, else None."""
    if isinstance(w, QuantizedMatrix) and w.type_name == "Q8_0":
        return w.quants, w.scales
    return None


def rows_arrays(rows: object) -> tuple | None:
    """The draft rows as _draft_logits takes them, or None for a kind it lacks."""
    empty_i8, empty_u16 = np.empty(0, np.int8), np.empty((0, 0, 0, 0), np.uint16)
    if isinstance(rows, int8.Int8Matrix) and rows.type_name == "Q8_0":
        no_quants = np.empty((0, 0, 0, 0), np.int8)
        n_padded, split = int(rows.n_padded), bool(rows.split)
        return (ROWS_INT8, rows.shape[0], rows.quants, rows.d, rows.sums, n_padded, split, no_quants, empty_u16)
    if isinstance(rows, QuantizedMatrix) and rows.type_name == "Q8_0":
        no_d = np.empty(0, np.float32)
        no_sums = np.empty(0, np.int32)
        return (ROWS_Q8_0, rows.shape[0], empty_i8, no_d, no_sums, 0, False, rows.quants, rows.scales)
    return None


def threads() -> int:
    """The thread count matmul.linear's kernels split their work by."""
    return config.NUMBA_NUM_THREADS

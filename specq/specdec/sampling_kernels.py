"""Sampled decoding's per-token arithmetic, compiled: the warp of a row of logits into
a distribution (temperature, top-k, top-p) and the inverse-CDF draw.

Why compiled. A sampled token warps a row of 49,152 logits, and a speculative round
one row per verified position and one per draft. Through numpy a row took about
0.5 ms (exp, a partition to find the likely tokens, the kept set's sort, masks and
sums, each a pass over the row) and the draw 0.14 ms more, against a 4 ms decode
step: measured on the 2-core Intel Xeon, sampled decoding at temperature 0.7 spent
12% of its time there, and speculative sampling 20% (and ran at 0.86x to 0.90x plain
sampling). Here a row is a few passes in one call.

Every row is warped alone, in a fixed order of operations: a row's distribution
does not depend on the rows beside it, so a verification's rows give the bits
plain decoding gives, and acceptance may warp only the rows it reaches.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# exp for float64 softmax arguments (x <= 0): Cody-Waite range reduction, x = k ln2 +
# f with |f| <= ln2 / 2, then Taylor's series of e^f to degree 12 (its remainder is
# below 2e-16 of the result) and 2^k built in the exponent's bits. numpy's exp is
# vectorized and libm's, which numba calls one value at a time, is not: a row of
# 49,152 took 0.3 ms that way. Below -708 (e^-708 = 3e-308, where float64 turns
# subnormal) the result is 0, as is a token's whose logit is -inf.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_FLUSHED = -708.0
_INV_FACTORIALS = tuple(1.0 / float(np.prod(np.arange(1, n + 1, dtype=np.float64))) for n in range(13))
# Far above the rounding of a cumulative sum of probabilities (about 1e-16 a term).
TOP_P_MARGIN = 1e-9
# Each pass of the kept set's search lowers its probability threshold this much.
_THRESHOLD_STEP = 1.0 / 16.0


@njit(nogil=True, cache=True)
def exp_nonpositive(x, out, pow2):  # pragma: no cover - compiled
    """out[i] = exp(x[i]) for x[i] <= 0; pow2 is int64 scratch of x's length."""
    c = _INV_FACTORIALS
    pow2_f = pow2.view(np.float64)
    for i in range(x.shape[0]):
        v = max(x[i], _FLUSHED)
        k = np.floor(v * _LOG2E + 0.5)
        f = (v - k * _LN2_HI) - k * _LN2_LO
        p = c[12]
        for j in range(11, -1, -1):  # Horner's rule
            p = p * f + c[j]
        pow2[i] = (np.int64(k) + np.int64(1023)) << np.int64(52)
        out[i] = p * pow2_f[i] if x[i] >= _FLUSHED else 0.0


@njit(nogil=True, cache=True)
def total(x):  # pragma: no cover - compiled
    """The sum of x in eight interleaved partial sums, then those in order: a fixed
    order (the same bits for the same row), eight times fewer dependent additions."""
    s = np.zeros(8)
    n8 = x.shape[0] // 8 * 8
    for i in range(0, n8, 8):
        for j in range(8):
            s[j] += x[i + j]
    t = 0.0
    for j in range(8):
        t += s[j]
    for i in range(n8, x.shape[0]):
        t += x[i]
    return t


@njit(nogil=True, cache=True)
def _keep_top_p(p, top_p, ids):  # pragma: no cover - compiled
    """Zero every token outside the smallest set of most likely ones (lower id first
    on ties) whose mass before it is below top_p, and renormalize the rest (ids:
    int64 scratch of p's length). The
    candidates are every token at least as likely as a threshold, lowered until
    their mass passes top_p: their order and cumulative sums are then the full sort's
    first ones, term for term, and a token outside them has at least their whole
    mass before it (less a rounding the margin covers)."""
    threshold = p.max() * _THRESHOLD_STEP
    while True:
        m = 0
        for i in range(p.shape[0]):
            if p[i] >= threshold:
                ids[m] = i
                m += 1
        candidates = ids[:m]  # ascending ids: the stable sort keeps ties so
        order = candidates[np.argsort(-p[candidates], kind="mergesort")]
        cumulative = np.cumsum(p[order])
        if cumulative[-1] >= top_p + TOP_P_MARGIN or threshold == 0.0:
            break
        threshold = threshold * _THRESHOLD_STEP if threshold > 1e-300 else 0.0
    kept = 0
    while kept < order.shape[0] and cumulative[kept] - p[order[kept]] < top_p:
        kept += 1
    scale = 1.0 / cumulative[kept - 1]
    kept_values = np.empty(kept)
    for j in range(kept):
        kept_values[j] = p[order[j]] * scale
    p[:] = 0.0
    for j in range(kept):
        p[order[j]] = kept_values[j]


# Up to this top_k, its k-th largest logit is found with a heap of the k largest so
# far: one pass of comparisons (0.04 ms a row of 49,152), where numba's partition took
# 0.6 ms. Past it, the partition.
HEAP_TOP_K = 1024


@njit(nogil=True, cache=True)
def kth_largest(z, k):  # pragma: no cover - compiled
    """The k-th largest of z counting repeats, as np.partition(z, len(z) - k)[len(z) - k]."""
    if k > HEAP_TOP_K:
        return np.partition(z, z.shape[0] - k)[z.shape[0] - k]  # of a copy: z keeps its order
    heap = z[:k].copy()  # a min-heap of the k largest so far: heap[0] is the k-th
    for start in range(k // 2 - 1, -1, -1):
        _sift_down(heap, start, k)
    for i in range(k, z.shape[0]):
        if z[i] > heap[0]:
            heap[0] = z[i]
            _sift_down(heap, 0, k)
    return heap[0]


@njit(nogil=True, cache=True)
def _sift_down(heap, i, n):  # pragma: no cover - compiled
    while True:
        smallest, left, right = i, 2 * i + 1, 2 * i + 2
        if left < n and heap[left] < heap[smallest]:
            smallest = left
        if right < n and heap[right] < heap[smallest]:
            smallest = right
        if smallest == i:
            return
        heap[i], heap[smallest] = heap[smallest], heap[i]
        i = smallest


@njit(nogil=True, cache=True)
def warp_rows(logits, temperature, top_k, top_p, out, z, pow2):  # pragma: no cover - compiled
    """logits [n, V] float32 or float64 -> out [n, V] float64 distributions: logits times
    1 / temperature, those below the top_k-th largest dropped (top_k > 0), softmax,
    then top_p. z (float64) and pow2 (int64) are scratch of V values: a fresh
    array of a row's size costs its page faults at every call (measured: 0.14 ms
    of 0.30 for the three a row needs)."""
    n, vocab = logits.shape
    inverse = 1.0 / temperature
    for r in range(n):
        for i in range(vocab):
            z[i] = np.float64(logits[r, i]) * inverse
        if 0 < top_k < vocab:
            kth = kth_largest(z, top_k)
            for i in range(vocab):
                if z[i] < kth:
                    z[i] = -np.inf
        largest = z.max()
        for i in range(vocab):
            z[i] -= largest
        row = out[r]
        exp_nonpositive(z, row, pow2)
        scale = 1.0 / total(row)
        for i in range(vocab):
            row[i] *= scale
        if top_p < 1.0:
            _keep_top_p(row, top_p, pow2)  # pow2's values are spent: its room holds ids


@njit(nogil=True, cache=True)
def draw(p, u):  # pragma: no cover - compiled
    """The inverse-CDF draw of sampling.sample: the first token whose cumulative sum
    (summed in order, as np.cumsum does) passes u times the whole, never one of zero
    probability."""
    whole = 0.0
    for i in range(p.shape[0]):
        whole += p[i]
    target = u * whole
    idx = p.shape[0] - 1
    cumulative = 0.0
    for i in range(p.shape[0]):
        cumulative += p[i]
        if cumulative > target:
            idx = i
            break
    while p[idx] == 0 and idx > 0:
        idx -= 1
    return idx

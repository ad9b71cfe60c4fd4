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
from numba import njit, prange

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
def largest(x):  # pragma: no cover - compiled
    """x's largest value, in eight interleaved running maxima: numba's max and argmax
    are compiled one value at a time (0.06 ms a row of 49,152, this 0.012 ms). NaNs
    are passed over."""
    s = np.full(8, -np.inf)
    n8 = x.shape[0] // 8 * 8
    for i in range(0, n8, 8):
        for j in range(8):
            v = x[i + j]
            s[j] = v if v > s[j] else s[j]
    m = -np.inf
    for j in range(8):
        m = s[j] if s[j] > m else m
    for i in range(n8, x.shape[0]):
        m = x[i] if x[i] > m else m
    return m


@njit(nogil=True, cache=True)
def first_largest(x):  # pragma: no cover - compiled
    """The lowest index of x's largest value."""
    m = largest(x)
    for i in range(x.shape[0]):
        if x[i] == m:
            return i
    return 0


@njit(nogil=True, cache=True)
def _keep_top_p(p, top_p, ids):  # pragma: no cover - compiled
    """Zero every token outside the smallest set of most likely ones (lower id first
    on ties) whose mass before it is below top_p, and renormalize the rest (ids:
    int64 scratch of p's length, left holding the kept tokens; returns their count). The
    candidates are every token at least as likely as a threshold, lowered until
    their mass passes top_p: their order and cumulative sums are then the full sort's
    first ones, term for term, and a token outside them has at least their whole
    mass before it (less a rounding the margin covers)."""
    threshold = largest(p) * _THRESHOLD_STEP
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
    ids[:kept] = order[:kept]  # order is a fresh array (fancy indexing): no overlap
    return kept


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
    """logits [n, V] float32 or float64 -> out [n, V] float64 distributions (warp_row)."""
    for r in range(logits.shape[0]):
        warp_row(logits[r], temperature, top_k, top_p, out[r], z, pow2)


@njit(nogil=True, cache=True)
def warp_row(logits, temperature, top_k, top_p, row, z, pow2):  # pragma: no cover - compiled
    """logits [V] -> row [V], a distribution: logits times 1 / temperature, those below
    the top_k-th largest dropped (top_k > 0), softmax, then top_p. z (float64) and
    pow2 (int64) are scratch of V values: a fresh array of a row's size costs its
    page faults at every call (measured: 0.14 ms of 0.30 for the three a row needs).
    Returns how many tokens top_p or top_k kept, their ids in pow2[:kept] (0 when
    neither applies: then every token may have weight)."""
    vocab = logits.shape[0]
    inverse = 1.0 / temperature
    for i in range(vocab):
        z[i] = np.float64(logits[i]) * inverse
    if 0 < top_k < vocab:
        kth = kth_largest(z, top_k)
        for i in range(vocab):
            if z[i] < kth:
                z[i] = -np.inf
    top = largest(z)
    for i in range(vocab):
        z[i] -= top
    exp_nonpositive(z, row, pow2)
    scale = 1.0 / total(row)
    for i in range(vocab):
        row[i] *= scale
    if top_p < 1.0:
        return _keep_top_p(row, top_p, pow2)  # pow2's values are spent: its room holds ids
    if 0 < top_k < vocab:
        kept = 0
        for i in range(vocab):
            if row[i] > 0.0:
                pow2[kept] = i
                kept += 1
        return kept
    return 0


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


# The exponential race (the Gumbel-max trick in another form): token v of a row with
# weights w gets an exponential clock E(v) = -log U(v), and the token whose clock
# E(v) / w(v) stops first wins. The winner is distributed as w / sum(w) exactly, and
# U(v) is a pure function of (the position's key, v): the token at a position is
# decided by the row and the key alone, so whoever computes the row and the key,
# lone or batched, plain or speculative, before or after a resume, picks the same one.
# U(v) = (c + 1/2) / 2^52 for the top 52 bits c of SplitMix64's output at stream
# position v + 1 (Steele et al., "Fast splittable pseudorandom number generators",
# OOPSLA 2014), from a start scattered from the key: keys close together, as tests
# and hand-made keys are, then start far apart (measured: without it, keys 7,919
# apart gave chi-square statistics of 12 to 17 on 7 degrees of freedom). U is exact
# in float64 and strictly inside (0, 1), and so is 1 - U.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SCALE52 = 2.0**-52
# A clock is read (a log) only when 1 - U(v), a lower bound of E(v), is below this
# many times the best ratio so far times w(v): the margin keeps rounding in the bound
# from skipping a token that would have won.
_RACE_MARGIN = 1.0 + 1e-9
_RACE_CHUNK = 512  # tokens whose bounds are compared before the exact reads


@njit(nogil=True, cache=True, inline="always")
def _mix(z):  # pragma: no cover - compiled
    """SplitMix64's output function: a bijection of 64-bit words that scatters every bit."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(nogil=True, cache=True, inline="always")
def _race_uniform(start, v):  # pragma: no cover - compiled
    z = _mix(start + (np.uint64(v) + np.uint64(1)) * _GOLDEN)
    return (np.float64(z >> np.uint64(12)) + 0.5) * _SCALE52


@njit(nogil=True, cache=True)
def race_uniforms(key, ids):  # pragma: no cover - compiled
    """U(v) for each token id in ids: for the tests' statistics."""
    out = np.empty(ids.shape[0])
    start = _mix(np.uint64(key))
    for j in range(ids.shape[0]):
        out[j] = _race_uniform(start, ids[j])
    return out


@njit(nogil=True, cache=True)
def race(w, key, ids, kept):  # pragma: no cover - compiled
    """The index j of w (weights >= 0, not all zero) whose token ids[j] wins the race
    keyed by `key` (uint64): the least E(ids[j]) / w[j], the lower index on ties. An
    empty ids means ids[j] = j. `kept` lists every j of nonzero weight, or is empty:
    then the whole row is raced, and most tokens are settled by one hash and a
    compare: a token can beat the likeliest token's ratio m only if 1 - U < E < m w."""
    start = _mix(np.uint64(key))
    identity = ids.shape[0] == 0
    if kept.shape[0] > 0:
        best = kept[0]
        m = np.inf
        for j in kept:
            ratio = -np.log(_race_uniform(start, j if identity else ids[j])) / w[j]
            if ratio < m or (ratio == m and j < best):
                m, best = ratio, j
        return best
    best = first_largest(w)
    m = -np.log(_race_uniform(start, best if identity else ids[best])) / w[best]
    bound = m * _RACE_MARGIN
    flags = np.empty(_RACE_CHUNK, dtype=np.bool_)
    for c in range(0, w.shape[0], _RACE_CHUNK):
        n = min(_RACE_CHUNK, w.shape[0] - c)
        # Branch-free, so that it vectorizes: the likeliest token's ratio bounds the
        # winner's, and the few tokens that might beat it are read exactly below.
        if identity:
            for t in range(n):
                flags[t] = 1.0 - _race_uniform(start, c + t) < bound * w[c + t]
        else:
            for t in range(n):
                flags[t] = 1.0 - _race_uniform(start, ids[c + t]) < bound * w[c + t]
        for t in range(n):
            if flags[t]:
                j = c + t
                ratio = -np.log(_race_uniform(start, j if identity else ids[j])) / w[j]
                if ratio < m or (ratio == m and j < best):
                    m, best = ratio, j
    return best


@njit(nogil=True, cache=True)
def warp_race(logits, temperature, top_k, top_p, key, ids, row, z, pow2):  # pragma: no cover - compiled
    """The race winner's index over one row of logits [V] warped as warp_row does
    (into row), keyed by `key`; ids as race's."""
    kept = warp_row(logits, temperature, top_k, top_p, row, z, pow2)
    return race(row, key, ids, pow2[:kept])


@njit(parallel=True, nogil=True, cache=True)
def warp_races(rows, temperatures, top_ks, top_ps, keys, winners, n_chunks):  # pragma: no cover - compiled
    """winners[i] = warp_race of rows[i] (a list of rows [V]) with its own warp and
    key, the rows split into n_chunks chunks on numba's threads, each chunk with
    scratch of its own: a row's winner is warp_race's whichever thread computes it."""
    n = len(rows)
    for c in prange(n_chunks):
        lo, hi = c * n // n_chunks, (c + 1) * n // n_chunks
        if hi > lo:
            vocab = rows[lo].shape[0]
            z, pow2, row = np.empty(vocab), np.empty(vocab, dtype=np.int64), np.empty(vocab)
            identity = np.empty(0, dtype=np.int64)
            for i in range(lo, hi):
                winners[i] = warp_race(rows[i], temperatures[i], top_ks[i], top_ps[i], keys[i], identity, row, z, pow2)

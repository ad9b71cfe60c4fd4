"""The output head of greedy rows at 8-bit activations first, exact only where it
matters.

A greedy row needs one thing from the head: its largest logit. At int16 the head's
products (49,152 outputs of a Q8_0 matrix) do two vpdpbusd per 64 multiply-adds, one
per 8-bit half of the 15-bit activations; from a few rows up they run at the
integer units' peak (5.3 ms of a 34 ms round of 32 requests on a Zen 4). Here the
head runs first at 8-bit activations (one vpdpbusd: 3.5 ms at 32 rows), and each
row's exact int16 logits are computed only for the outputs that could still be its
largest, which a bound on the two products' difference says:

    |int16 logit_o - 8-bit logit_o| <= sum_b A[o, b] * e_b

where A[o, b] = |d_ob| * sum_j |w_obj| (the head's block scale and integers) and e_b
is half the two activation steps of block b (each activation is within half a step
of its value) plus a margin for the float roundings of both sums. Output o cannot be
the largest where its upper bound falls below another output's lower bound. With the
default model the candidates are a median of 1 to 2 and at most 31 of 49,152 a row
(the bench mix's rows), and each gets the very bits the full product gives it (the
same exact integer sums, then the same fused multiply-adds block by block), so
argmax, ties included, is the full head's: greedy outputs do not change. The other
outputs' logits come back as -inf; nothing reads them for a greedy row (its
acceptance takes the argmax).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
from numba import njit, prange

from specq.specdec import int8, vec
from specq.specdec.int8 import BLOCK, LEVELS, SPLIT_LEVELS, Int8Matrix, int8_matmul_t

# From this many rows the screen pays. Below it the head streams its 28 MB from
# memory at either precision (1.1 ms at 1 and at 5 rows); the head alone, whole
# against screened, on a Zen 4: 8 rows the same, 12 rows 1.12x, 16 1.19x, 32 1.22x.
SCREEN_ROWS = 12
# A row with more candidates than this (near ties everywhere: 3 rows of 1,713 in a
# batch of 32 over the bench mix) takes the whole head, alone.
MOST_CANDIDATES = 1024
# One call in this many takes the path HeadChoice did not choose, so that the cost it
# compares stays current as the text changes.
EXPLORE_EVERY = 16
# A path's cost is the median of its last this many timings a row: a call stalled by
# the machine (a preemption) does not turn the choice, and a round with an unsure row
# is one among several. Replayed over 200 calls timed both ways on two texts, this
# came within 0.968x to 0.993x of the better path in hindsight; running averages
# (half or a quarter weight to the latest) came within 0.937x to 0.995x.
TIMINGS = 5
# Relative margin for the float roundings of the two sums (at most ~nb * 2**-24 of
# the sum of the terms' magnitudes, which sum_b A[o, b] * max|x_b| bounds).
ROUNDING = 1e-5


@dataclass(frozen=True)
class ScreenedHead:
    head: Int8Matrix  # the model's head: Q8_0 at 15-bit activations (split)
    coarse: Int8Matrix  # the same arrays at 8-bit activations
    bound: np.ndarray  # A [n_out, nb] float32, rounded up
    bound_max: np.ndarray  # [nb] float32: A's largest per block

    @classmethod
    def of(cls, head) -> ScreenedHead | None:
        """For a Q8_0 head at int16 (the default model's); None for any other."""
        if not (isinstance(head, Int8Matrix) and head.type_name == "Q8_0" and head.split):
            return None
        n_out, n_in = head.shape
        lanes, nb = head.lanes, n_in // BLOCK
        groups = head.n_padded // lanes
        # The integers as laid out (int8.Int8Matrix): [groups, nb, 8 vectors, lanes, 4].
        quants = head.quants.reshape(groups, nb, 8, lanes, 4)
        magnitudes = np.empty((groups, nb, lanes), dtype=np.float64)
        for g in range(0, groups, 256):  # int16 copies of a slice at a time (|-128| fits)
            magnitudes[g : g + 256] = np.abs(quants[g : g + 256].astype(np.int16)).sum(axis=(2, 4))
        magnitudes = magnitudes.transpose(0, 2, 1).reshape(groups * lanes, nb)[:n_out]
        exact = np.abs(head.block_scales("d").astype(np.float64)) * magnitudes
        # Rounded up: float32's nearest, then the next float32 above it.
        bound = np.nextafter(exact.astype(np.float32), np.float32(np.inf))
        return cls(head, replace(head, split=False), bound, bound.max(axis=0))

    def argmax_logits(self, h: np.ndarray) -> np.ndarray:
        """h [rows, d] final-normed -> [rows, n_out] float32: at every output that could
        be a row's largest logit, the full head's bits; -inf elsewhere. A row whose
        screen is inconclusive (non-finite values, or too many candidates) gets the
        whole head's logits, computed for it alone: a row's bits never depend on the
        rows beside it (int8.py), and the round's other rows keep their screen, where
        one such row used to send every row of the round through the whole head."""
        h = np.ascontiguousarray(h, dtype=np.float32)
        coarse = int8_matmul_t(h, self.coarse)
        nb = h.shape[1] // BLOCK
        largest = np.abs(h).reshape(len(h), nb, BLOCK).max(axis=2).astype(np.float64)
        # Half of each activation step, both precisions, plus the roundings' margin.
        slack = largest / SPLIT_LEVELS / 2 + largest / LEVELS / 2 + ROUNDING * (largest + largest / LEVELS)
        slack = slack.astype(np.float32) * np.float32(1.0 + 1e-4)
        picked = np.empty((len(h), MOST_CANDIDATES), dtype=np.int64)
        counts = _candidates(coarse, slack, self.bound, self.bound_max, picked)
        out = coarse  # now -inf in every settled row (_candidates)
        q, low, xd, _ = int8.quantized(h, True, 1)  # defined where int8.AVAILABLE, as Int8Matrix heads are
        head = self.head
        _exact(q, low, xd, head.quants, head.d, head.lanes, nb, h.shape[1], picked, np.maximum(counts, 0), out)
        unsure = np.flatnonzero(counts < 0)
        if unsure.size:
            out[unsure] = int8_matmul_t(h[unsure], head)
        return out


@njit(inline="always")
def _top(row):  # pragma: no cover - compiled
    """(the row's largest value, whether every value is finite), eight lanes at a time:
    a multiply-add by zero turns an infinity or a NaN into NaN in `bad`."""
    n = row.shape[0]
    largest, bad, zero = vec.splat_f32(np.float32(-np.inf)), vec.zeros_f32(), vec.zeros_f32()
    i = 0
    while i + 8 <= n:
        v = vec.load_f32(row, i)
        largest = vec.max_f32(largest, v)
        bad = vec.fma(v, zero, bad)
        i += 8
    lanes = np.empty(8, dtype=np.float32)
    vec.store_f32(lanes, 0, bad)
    finite = True
    for k in range(8):
        finite = finite and lanes[k] == 0.0
    top = vec.largest_lane(largest)
    for i in range(i, n):
        finite = finite and np.isfinite(row[i])
        top = max(top, row[i])
    return top, finite


@njit(parallel=True, cache=True, nogil=True)
def _candidates(coarse, slack, bound, bound_max, picked):  # pragma: no cover - compiled
    """Per row, into picked[r, :count]: the outputs whose upper bound reaches the best
    lower bound (the per-output bound A @ slack, after a first cut by its largest
    per block), and then a settled row of `coarse` overwritten with -inf. count -1:
    non-finite values, or more than picked holds (such a row is left as it is). The
    cut skips 64 values at a time whose largest falls below it (nearly all).

    The -inf makes `coarse` the output that _exact fills in at the candidates: the
    row was just read whole here, so it is in this core's cache, where a fresh array
    of -inf for the round (np.full, 6.3 MB at 32 rows) cost a pass over memory of its
    own (0.23 ms alone, more inside a round)."""
    rows, n_out = coarse.shape
    nb = slack.shape[1]
    counts = np.empty(rows, dtype=np.int64)
    for r in prange(rows):
        row = coarse[r]
        wide = np.float32(0.0)
        for b in range(nb):
            wide += bound_max[b] * slack[r, b]
        top, finite = _top(row)
        if not finite:
            counts[r] = -1
            continue
        cut = top - np.float32(2.0) * wide
        count = 0
        o0 = 0
        while o0 < n_out and count >= 0:
            span = min(64, n_out - o0)
            if span == 64:
                m = vec.load_f32(row, o0)
                for k in range(8, 64, 8):
                    m = vec.max_f32(m, vec.load_f32(row, o0 + k))
                if vec.largest_lane(m) < cut:
                    o0 += 64
                    continue
            for o in range(o0, o0 + span):
                if row[o] >= cut:
                    if count == picked.shape[1]:
                        count = -1
                        break
                    picked[r, count] = o
                    count += 1
            o0 += span
        if count < 0:
            counts[r] = -1
            continue
        margins = np.empty(count, dtype=np.float32)
        best_low = np.float32(-np.inf)
        for i in range(count):
            o = picked[r, i]
            m = np.float32(0.0)
            for b in range(nb):
                m += bound[o, b] * slack[r, b]
            margins[i] = m
            best_low = max(best_low, row[o] - m)
        kept = 0
        for i in range(count):
            o = picked[r, i]
            if row[o] + margins[i] >= best_low:
                picked[r, kept] = o
                kept += 1
        counts[r] = kept
        row[:] = np.float32(-np.inf)
    return counts


@njit(cache=True, nogil=True)
def _exact(q, low, xd, quants, d, lanes, nb, n_in, picked, counts, out):  # pragma: no cover - compiled
    """out[r, o] for the picked outputs: the split Q8_0 product's bits (int8_codegen's
    epilogue: per block, acc = fma(float(isum), d_w * d_x, acc), from 0), the integer
    sum of weights by the whole activations 128 high + low (exact in any order)."""
    for r in range(counts.shape[0]):
        for i in range(counts[r]):
            o = picked[r, i]
            group, lane = o // lanes, o % lanes
            acc = np.float32(0.0)
            for b in range(nb):
                base = (group * nb + b) * 8 * lanes * 4 + lane * 4
                x0 = r * n_in + b * BLOCK
                total = 0
                for v in range(8):
                    for p in range(4):
                        w = np.int32(quants[base + v * lanes * 4 + p])
                        x = np.int32(q[x0 + 4 * v + p]) * 128 + np.int32(low[x0 + 4 * v + p])
                        total += w * x
                scale = vec.as_f32(d[(group * nb + b) * lanes + lane]) * xd[r * nb + b]
                acc = vec.fma1(np.float32(total), scale, acc)
            out[r, o] = acc


class HeadChoice:
    """Whether a forward's greedy rows go through the screen or the whole head, by
    what each has cost a row lately at about that many rows. Both give every row the
    same argmax, so the choice moves time, never an output.

    Which is cheaper depends on the text and the CPU's moment (docs/performance.md).
    On the bench mix's rows, where 1.4% of rows are unsure (too many candidates, so
    a pass of the whole head of their own), the screen ran at 1.08x to 1.14x the
    whole head's speed at 8 to 32 rows on the Xeon one morning and at 0.94x to 1.08x
    the same evening. On markdown 12% of rows were unsure, and the screen ran at
    0.71x to 0.83x. So the two are measured here as they run, not assumed. A
    worker's model keeps its choice's timings from batch to batch."""

    def __init__(self) -> None:
        # (row bucket, screened) -> the last TIMINGS timings, seconds a row
        self._timings: dict[tuple[int, bool], deque[float]] = {}
        self._timed: set[tuple[int, bool]] = set()  # paths whose first call has passed
        self._calls: dict[int, int] = {}

    def __reduce__(self) -> tuple:
        """Pickled (model_cache) without its timings: they are one process's moments on
        one machine, not the model's, and a deque is not among the classes the cache's
        unpickler allows. A model read back times both paths afresh."""
        return (HeadChoice, ())

    @staticmethod
    def _bucket(rows: int) -> int:
        # 12 to 15 rows, 16 to 31, 32 to 63, ...: a head's cost a row falls with its
        # rows (the weights' stream is shared), so only like sizes are compared.
        return rows.bit_length()

    def screen(self, rows: int) -> bool:
        """Whether the next forward of `rows` greedy rows takes the screen."""
        bucket = self._bucket(rows)
        calls = self._calls[bucket] = self._calls.get(bucket, 0) + 1
        screened, whole = self.cost(rows, True), self.cost(rows, False)
        if screened is None or whole is None:
            return screened is None  # each path timed before any comparison
        better = screened <= whole
        return better if calls % EXPLORE_EVERY else not better

    def record(self, rows: int, screened: bool, seconds: float) -> None:
        """A forward's head took `seconds` for `rows` rows, screened or whole. A path's
        first call at a size is not counted: it loads its compiled code and finds its
        arrays cold. Counted in a running average, the screen's first call at 12 rows
        kept the whole head chosen for 92% of 96 calls where the screen was 1.08x
        cheaper (scripts/bench_head_screen.py, the bench mix, 2026-12-07)."""
        key = (self._bucket(rows), screened)
        if key not in self._timed:
            self._timed.add(key)
            return
        self._timings.setdefault(key, deque(maxlen=TIMINGS)).append(seconds / rows)

    def cost(self, rows: int, screened: bool) -> float | None:
        """Seconds a row that the path has taken lately at about `rows` rows."""
        timings = self._timings.get((self._bucket(rows), screened))
        return statistics.median(timings) if timings else None

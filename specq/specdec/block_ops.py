"""The per-layer work between the matrix products, fused into numba loops: RMSNorm,
RoPE, attention over the cache (with Gemma's sliding windows and soft caps), and
SwiGLU's gate (Gemma's GeGLU in numpy).

With the products computed from quantized blocks, a decode step's numpy calls
between them (about 50 a layer, 1,500 a step, each a few microseconds of dispatch
and temporaries for arrays of a few hundred floats) were a large part of a step.
Each function here is one call.

Bitwise row invariance, as in kernels.py: every row runs through the same loop
bodies with the same trip counts whatever rows share the call, so plain decoding,
chain verification, tree verification and batched rounds give a row the same bits.
Attention visits a row's visible keys in position order (the cache before the
segment, then its own ancestors), so a tree row computes exactly what the same row
of a chain does. The loops are compiled serially (waking numba's thread pool for
work this small costs more than it saves), except attention's.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from specq.specdec import vec

# 'reassoc' lets LLVM vectorize the reductions; one loop body per reduction keeps
# their order the same for every row (see the module docstring).
_FAST = {"nnan", "ninf", "contract", "reassoc", "nsz", "arcp"}

# Attention (below, with its exp) computes every score and weighted sum as a sequence
# of multiply-adds in a fixed order, with positions (not the head dimension) as the vector lanes, so it
# needs no 'reassoc'; without it, a position's score has the same bits in the
# vectorized body and in the loop's scalar remainder (both fuse each step into one
# fma under 'contract').
_ORDERED = {"nnan", "ninf", "contract"}


# Explicit signatures, as in kernels.py: compiled at import (and cached beside this
# file), not inside the first request's decode time, where lazy compilation cost
# about 3 s.
@njit("float32[:, ::1](float32[:, ::1], float32[::1], float64)", fastmath=_FAST, cache=True, nogil=True)
def rms_norm(x, weight, eps):  # pragma: no cover - compiled
    """x [n, d] float32 -> x / rms(x) * weight, [n, d] float32."""
    n, d = x.shape
    out = np.empty((n, d), dtype=np.float32)
    for r in range(n):
        total = 0.0  # float64: d squares, and this scale multiplies every value of the row
        for i in range(d):
            total += np.float64(x[r, i]) * x[r, i]
        scale = np.float32(1.0 / np.sqrt(total / d + eps))
        for i in range(d):
            out[r, i] = x[r, i] * scale * weight[i]
    return out


# The rotation's roundings, in the order the scalar loop's fast-math contraction
# gave them and the vector body repeats (a test pins both to this formula):
#     even = fma(x0, c, -(x1 s)),  odd = fma(x0, s, x1 c)
# Compiled without reassociation, so that LLVM cannot choose another order.
@njit(
    "float32[:, :, ::1](float32[:, :, :], float32[:, ::1], float32[:, ::1], int64[::1])",
    fastmath=_ORDERED,
    cache=True,
    nogil=True,
)
def rope(x, cos, sin, positions):  # pragma: no cover - compiled
    """x [n, heads, hd] -> x with adjacent pairs (x[2i], x[2i+1]) rotated by the
    angles of each row's position (cos, sin [context, hd/2]); a new array. x may be
    a strided view (q, k and v are column slices of one product): one whose rows of
    hd are contiguous (the compiled stacks' copies) goes 8 values at a time."""
    n, heads, hd = x.shape
    out = np.empty((n, heads, hd), dtype=np.float32)
    vectors = hd % 8 == 0 and x.strides[2] == 4
    c2 = np.empty(hd, dtype=np.float32)  # per row: (c0, c0, c1, c1, ...)
    s2 = np.empty(hd, dtype=np.float32)  # (-s0, s0, -s1, s1, ...)
    for r in range(n):
        p = positions[r]
        if vectors:
            for i in range(hd // 2):
                c2[2 * i] = c2[2 * i + 1] = cos[p, i]
                s2[2 * i], s2[2 * i + 1] = -sin[p, i], sin[p, i]
            for h in range(heads):
                row, target = x[r, h], out[r, h]
                for i in range(0, hd, 8):
                    v, c, s = vec.load_f32(row, i), vec.load_f32(c2, i), vec.load_f32(s2, i)
                    w = vec.swap_pairs(v)
                    # Lane 2i of the first is fma(x0, c, -(x1 s)); lane 2i+1 of the second fma(x0, s, x1 c).
                    evens = vec.fma(v, c, vec.mul(w, s))
                    odds = vec.fma(w, s, vec.mul(v, c))
                    vec.store_f32(target, i, vec.evens_odds(evens, odds))
            continue
        for h in range(heads):
            for i in range(hd // 2):
                x0, x1 = x[r, h, 2 * i], x[r, h, 2 * i + 1]
                c, s = cos[p, i], sin[p, i]
                out[r, h, 2 * i] = vec.fma1(x0, c, -(x1 * s))
                out[r, h, 2 * i + 1] = vec.fma1(x0, s, x1 * c)
    return out


# exp as Cody-Waite range reduction and a degree-7 polynomial (Cephes' expf
# constants): relative error below 1e-7, and unlike numba's scalar call to libm's exp
# it vectorizes. Arguments are clamped to [-87, 88], where 2^k stays a normal float,
# and below -64 the result is 0: a softmax weight under exp(-64) = 1.6e-28 adds
# nothing next to its largest, exp(0), while multiplied by a value or a scale it
# would make subnormal floats, each of which costs an x86 core a microcode assist
# (about 100 cycles): attention over peaked scores ran up to 3x slower (17x with an
# 8-bit cache's small scales), measured on an Intel Xeon.
_FLUSHED = np.float32(-64.0)
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)


@njit("void(float32[::1], int64, int32[::1])", fastmath=_ORDERED, cache=True, nogil=True)
def exp_inplace(x, n, pow2):  # pragma: no cover - compiled
    """x[:n] = exp(x[:n]); pow2 is int32 scratch of at least n."""
    pow2_f = pow2.view(np.float32)
    for t in range(n):
        v = min(max(x[t], np.float32(-87.0)), np.float32(88.0))
        k = np.floor(v * _LOG2E + np.float32(0.5))
        f = v - k * _LN2_HI - k * _LN2_LO
        p = np.float32(1.0 / 5040.0) * f + np.float32(1.0 / 720.0)
        p = p * f + np.float32(1.0 / 120.0)
        p = p * f + np.float32(1.0 / 24.0)
        p = p * f + np.float32(1.0 / 6.0)
        p = p * f + np.float32(0.5)
        p = p * f + np.float32(1.0)
        p = p * f + np.float32(1.0)
        pow2[t] = (np.int32(k) + np.int32(127)) << np.int32(23)
        x[t] = p * pow2_f[t] if v >= _FLUSHED else np.float32(0.0)


# Without reassociation: the gate's product is written in the order the fast-math
# flags used to choose, (gate up) / (1 + e), so the vector body and the scalar
# remainder keep the bits the loop had; under 'reassoc' LLVM may choose again.
@njit("float32[:, ::1](float32[:, ::1], int64)", fastmath=_ORDERED, cache=True, nogil=True)
def silu_gate(gate_up, d_ffn):  # pragma: no cover - compiled
    """gate_up [n, 2 d_ffn] -> silu(gate) * up, [n, d_ffn] (SwiGLU)."""
    n = gate_up.shape[0]
    out = np.empty((n, d_ffn), dtype=np.float32)
    e = np.empty(d_ffn, dtype=np.float32)
    pow2 = np.empty(d_ffn, dtype=np.int32)
    for r in range(n):
        for i in range(d_ffn):
            e[i] = -gate_up[r, i]
        exp_inplace(e, d_ffn, pow2)
        row, target = gate_up[r], out[r]
        i = 0
        while i + 8 <= d_ffn:
            gate, up = vec.load_f32(row, i), vec.load_f32(row, d_ffn + i)
            vec.store_f32(target, i, vec.silu_gated(gate, vec.load_f32(e, i), up))
            i += 8
        for i in range(i, d_ffn):
            out[r, i] = (gate_up[r, i] * gate_up[r, d_ffn + i]) / (np.float32(1.0) + e[i])
    return out


def gelu_gate(gate_up: np.ndarray, d_ffn: int) -> np.ndarray:
    """gate_up [n, 2 d_ffn] -> gelu(gate) * up, [n, d_ffn] (GeGLU, gemma3), with GELU's
    tanh form: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), in float32, row by
    row the same operations (numpy's elementwise ones)."""
    g, up = gate_up[:, :d_ffn], gate_up[:, d_ffn:]
    c = np.float32(np.sqrt(2.0 / np.pi))
    inner = c * (g + np.float32(0.044715) * g * g * g)
    return np.ascontiguousarray(np.float32(0.5) * g * (np.float32(1.0) + np.tanh(inner)) * up, dtype=np.float32)


@njit(inline="always")
def _scores(q, r, h, keys, begin, end, raw, g, ahead, at, last):  # pragma: no cover - compiled
    """raw[g, t] = sum_i q[r, h, i] key_t[i] for begin <= t < end (begin a whole
    block's first position), keys one kv head's
    [capacity / KEY_BLOCK, rows * KEY_BLOCK] (model.KVCache: a block holds eight
    positions, dimension-major): per position one fused multiply-add per i, in i
    order, from 0. Eight blocks at a time keep their sums in registers over all of i
    (the plain loop loaded and stored raw once per multiply-add); the remainder, a
    block at a time, does the same operations, so every position gets the same bits
    wherever it falls. An 8-bit cache's sums are multiplied by each position's key
    scale as they are stored, one operation per position wherever it falls. raw
    [group, longest rounded up to a whole block]. Asks for the next task's keys
    (`ahead`, from `at` up to `last`) at the pace it reads its own (_ask); returns
    where it stopped."""
    hd, stride = q.shape[2], keys.shape[1]
    flat = keys.reshape(-1)
    scales = _scale_offset(flat, hd, KEY_SCALES)  # in a block, 8-bit keys' scales
    query = q[r, h]  # read through broadcast_f32: numba's own indexing adds checks to every read
    t0 = begin
    while t0 + 8 * KEY_BLOCK <= end:
        # Eight sums in flight: a fused multiply-add takes 4 cycles and the core
        # starts two a cycle, so four chains left it waiting half the time.
        a0, a1, a2, a3 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a4, a5, a6, a7 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        block = (t0 // KEY_BLOCK) * stride
        for i in range(hd):
            qi = vec.broadcast_f32(query, i)
            row = block + i * KEY_BLOCK
            a0 = vec.fma(qi, vec.load_f32(flat, row), a0)
            a1 = vec.fma(qi, vec.load_f32(flat, row + stride), a1)
            a2 = vec.fma(qi, vec.load_f32(flat, row + 2 * stride), a2)
            a3 = vec.fma(qi, vec.load_f32(flat, row + 3 * stride), a3)
            a4 = vec.fma(qi, vec.load_f32(flat, row + 4 * stride), a4)
            a5 = vec.fma(qi, vec.load_f32(flat, row + 5 * stride), a5)
            a6 = vec.fma(qi, vec.load_f32(flat, row + 6 * stride), a6)
            a7 = vec.fma(qi, vec.load_f32(flat, row + 7 * stride), a7)
        at = _ask(ahead, at, last, 8 * stride)
        out = raw[g]
        vec.store_f32(out, t0, _key_scaled(a0, flat, block + scales))
        vec.store_f32(out, t0 + 8, _key_scaled(a1, flat, block + stride + scales))
        vec.store_f32(out, t0 + 16, _key_scaled(a2, flat, block + 2 * stride + scales))
        vec.store_f32(out, t0 + 24, _key_scaled(a3, flat, block + 3 * stride + scales))
        vec.store_f32(out, t0 + 32, _key_scaled(a4, flat, block + 4 * stride + scales))
        vec.store_f32(out, t0 + 40, _key_scaled(a5, flat, block + 5 * stride + scales))
        vec.store_f32(out, t0 + 48, _key_scaled(a6, flat, block + 6 * stride + scales))
        vec.store_f32(out, t0 + 56, _key_scaled(a7, flat, block + 7 * stride + scales))
        t0 += 8 * KEY_BLOCK
    # Then a block at a time, the last one too where `end` cuts it: its lanes past
    # `end` (zeros, or a rejected draft's key) are sums of their own that no other
    # lane reads, stored into raw's room for a whole block (_scratch) and never read.
    # One position at a time, the tail's 64 dependent multiply-adds a head were a
    # third of a short task's time: at context 8 a round of 32 sequences took 2.6 ms
    # of attention, 0.4 ms of it outside the tasks.
    while t0 < end:
        a0 = vec.zeros_f32()
        block = (t0 // KEY_BLOCK) * stride
        for i in range(hd):
            a0 = vec.fma(vec.broadcast_f32(query, i), vec.load_f32(flat, block + i * KEY_BLOCK), a0)
        at = _ask(ahead, at, last, stride)
        vec.store_f32(raw[g], t0, _key_scaled(a0, flat, block + scales))
        t0 += KEY_BLOCK
    return at


@njit(inline="always")
def _scores3(q, r, h, keys, begin, end, raw, g, ahead, at, last):  # pragma: no cover - compiled
    """_scores for query heads h, h + 1 and h + 2 (raw[g], raw[g + 1], raw[g + 2]) at
    once: each vector of keys is read (a float16 cache: widened) once for the three,
    where each head read it again; every head's sums are _scores' fused multiply-adds
    in the same order, so the same bits. Four blocks at a time: twelve sums, which
    AVX2's sixteen registers hold (eight blocks were no faster with AVX-512's 32).
    Asks for the next task's keys as _scores does."""
    hd, stride = q.shape[2], keys.shape[1]
    flat = keys.reshape(-1)
    scales = _scale_offset(flat, hd, KEY_SCALES)
    q0, q1, q2 = q[r, h], q[r, h + 1], q[r, h + 2]
    t0 = begin
    while t0 + 4 * KEY_BLOCK <= end:
        a00, a01, a02, a03 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a10, a11, a12, a13 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a20, a21, a22, a23 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        block = (t0 // KEY_BLOCK) * stride
        for i in range(hd):
            row = block + i * KEY_BLOCK
            k0, k1 = vec.load_f32(flat, row), vec.load_f32(flat, row + stride)
            k2, k3 = vec.load_f32(flat, row + 2 * stride), vec.load_f32(flat, row + 3 * stride)
            w = vec.broadcast_f32(q0, i)
            a00, a01, a02, a03 = vec.fma(w, k0, a00), vec.fma(w, k1, a01), vec.fma(w, k2, a02), vec.fma(w, k3, a03)
            w = vec.broadcast_f32(q1, i)
            a10, a11, a12, a13 = vec.fma(w, k0, a10), vec.fma(w, k1, a11), vec.fma(w, k2, a12), vec.fma(w, k3, a13)
            w = vec.broadcast_f32(q2, i)
            a20, a21, a22, a23 = vec.fma(w, k0, a20), vec.fma(w, k1, a21), vec.fma(w, k2, a22), vec.fma(w, k3, a23)
        at = _ask(ahead, at, last, 4 * stride)
        for k, (s0, s1, s2, s3) in enumerate(((a00, a01, a02, a03), (a10, a11, a12, a13), (a20, a21, a22, a23))):
            out = raw[g + k]
            vec.store_f32(out, t0, _key_scaled(s0, flat, block + scales))
            vec.store_f32(out, t0 + 8, _key_scaled(s1, flat, block + stride + scales))
            vec.store_f32(out, t0 + 16, _key_scaled(s2, flat, block + 2 * stride + scales))
            vec.store_f32(out, t0 + 24, _key_scaled(s3, flat, block + 3 * stride + scales))
        t0 += 4 * KEY_BLOCK
    while t0 < end:  # a block at a time, as in _scores
        a0, a1, a2 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        block = (t0 // KEY_BLOCK) * stride
        for i in range(hd):
            k0 = vec.load_f32(flat, block + i * KEY_BLOCK)
            a0 = vec.fma(vec.broadcast_f32(q0, i), k0, a0)
            a1 = vec.fma(vec.broadcast_f32(q1, i), k0, a1)
            a2 = vec.fma(vec.broadcast_f32(q2, i), k0, a2)
        at = _ask(ahead, at, last, stride)
        vec.store_f32(raw[g], t0, _key_scaled(a0, flat, block + scales))
        vec.store_f32(raw[g + 1], t0, _key_scaled(a1, flat, block + scales))
        vec.store_f32(raw[g + 2], t0, _key_scaled(a2, flat, block + scales))
        t0 += KEY_BLOCK
    return at


@njit(inline="always")
def _ask(ahead, at, last, elements):  # pragma: no cover - compiled
    """Asks for the cache lines of ahead[at:at + elements] (vec.prefetch, into L2,
    never waiting) and returns where the next ask starts, never past `last`, where
    the asks stay (a line already asked for is asked again, at the cost of a hit).
    A task's loops ask for the next task's keys and values at the pace they read
    their own, so that its lines arrive while this task multiplies: attention read
    the cache from memory, then multiplied, one after the other (32 sequences at
    context 200: 4.3 ms with every task's lines in cache, 8.7 ms from memory). They
    ask between their multiply-add loops, a block of keys after each block they
    read and the values of eight positions before each eight they weigh: asked
    inside those loops, a 5- or 64-row segment's attention, whose rows find their
    lines in cache, took 1.09x to 1.12x longer. The loop's bound is a constant once
    compiled (the array's item size)."""
    line = 64 // ahead.itemsize
    for e in range(0, elements, line):
        vec.prefetch(ahead, min(at + e, last))
    return min(at + elements, last)


@njit(inline="always")
def _key_scaled(sums, flat, at):  # pragma: no cover - compiled
    """The score sums of a block's eight positions, times their key scales (the eight
    float32 at byte `at`) in an 8-bit cache; a float cache's come back as they are
    (a constant branch)."""
    if vec.scaled(flat):
        return vec.mul(sums, vec.load_scales(flat, at))
    return sums


@njit(inline="always")
def _value_scaled(kept, group, slots, first, start, m, keys, hd, area, frozen):  # pragma: no cover - compiled
    """8-bit values' weights kept[g, t] times the value scale of slot slots[t] (the
    scales sit in the blocks of keys, _scale_offset, and below position `frozen` in
    the frozen blocks of `area` too). Over the cache before the segment (slots
    first + t there): below `frozen` from the frozen blocks' copies, eight at a time
    from a multiple of KEY_BLOCK; then from the blocks of keys, eight at a time when
    `first` starts a block. The segment's own slots (a tree's are not consecutive)
    one at a time from the blocks of keys. One multiply a weight either way."""
    stride = keys.shape[1]
    flat = keys.reshape(-1)
    scales = _scale_offset(flat, hd, VALUE_SCALES)
    per_scale = 4 // flat.itemsize  # elements of the keys' type a float32 scale takes
    copies = (FROZEN_BLOCK + FROZEN_PARAMS) * hd  # bytes into a frozen block
    for g in range(group):
        weights = kept[g]
        t = 0
        below = min(frozen, start) - first
        while t < below:
            p = first + t
            at = _block_at(hd, p) + copies + 4 * (p % FROZEN_BLOCK)
            if p % KEY_BLOCK == 0 and t + KEY_BLOCK <= below:
                vec.store_f32(weights, t, vec.mul(vec.load_f32(weights, t), vec.load_scales(area, at)))
                t += KEY_BLOCK
            else:
                weights[t] *= vec.load_scale(area, at)
                t += 1
        while first % KEY_BLOCK == 0 and t + KEY_BLOCK <= start - first:
            block = ((first + t) // KEY_BLOCK) * stride
            vec.store_f32(weights, t, vec.mul(vec.load_f32(weights, t), vec.load_scales(flat, block + scales)))
            t += KEY_BLOCK
        for t in range(t, m):
            slot = slots[t]
            weights[t] *= vec.load_scale(flat, (slot // KEY_BLOCK) * stride + scales + per_scale * (slot % KEY_BLOCK))


@njit(inline="always")
def _weighted_values(kept, g, slots, m, values, out, r, h, ahead, at, last):  # pragma: no cover - compiled
    """out[r, h * hd + i] = sum_t kept[g, t] values[slots[t], i] for t < m: one fused
    multiply-add per t, in t order, from 0; eight vectors of i in registers at a time
    (the same operations in the remainder, as in _scores). Asks for the next task's
    values as _scores asks for its keys."""
    hd = values.shape[1]
    flat = values.reshape(-1)
    weights = kept[g]
    base = h * hd
    i0 = 0
    while i0 + 64 <= hd:  # eight sums in flight, as in _scores
        a0, a1, a2, a3 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a4, a5, a6, a7 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        for t in range(m):
            if t % 8 == 0:
                at = _ask(ahead, at, last, 8 * 64)
            w = vec.broadcast_f32(weights, t)
            row = slots[t] * hd + i0
            a0 = vec.fma(w, vec.load_f32(flat, row), a0)
            a1 = vec.fma(w, vec.load_f32(flat, row + 8), a1)
            a2 = vec.fma(w, vec.load_f32(flat, row + 16), a2)
            a3 = vec.fma(w, vec.load_f32(flat, row + 24), a3)
            a4 = vec.fma(w, vec.load_f32(flat, row + 32), a4)
            a5 = vec.fma(w, vec.load_f32(flat, row + 40), a5)
            a6 = vec.fma(w, vec.load_f32(flat, row + 48), a6)
            a7 = vec.fma(w, vec.load_f32(flat, row + 56), a7)
        target = out[r]
        vec.store_f32(target, base + i0, a0)
        vec.store_f32(target, base + i0 + 8, a1)
        vec.store_f32(target, base + i0 + 16, a2)
        vec.store_f32(target, base + i0 + 24, a3)
        vec.store_f32(target, base + i0 + 32, a4)
        vec.store_f32(target, base + i0 + 40, a5)
        vec.store_f32(target, base + i0 + 48, a6)
        vec.store_f32(target, base + i0 + 56, a7)
        i0 += 64
    while i0 + 8 <= hd:
        a0 = vec.zeros_f32()
        for t in range(m):
            if t % 8 == 0:
                at = _ask(ahead, at, last, 8 * 8)
            a0 = vec.fma(vec.broadcast_f32(weights, t), vec.load_f32(flat, slots[t] * hd + i0), a0)
        vec.store_f32(out[r], base + i0, a0)
        i0 += 8
    for i in range(i0, hd):
        total = np.float32(0.0)
        for t in range(m):
            total = vec.fma1(weights[t], vec.as_f32(values[slots[t], i]), total)
        out[r, base + i] = total
    return at


@njit(inline="always")
def _weighted_values3(kept, g, slots, m, values, out, r, h, ahead, at, last):  # pragma: no cover - compiled
    """_weighted_values for heads h, h + 1 and h + 2 (weights kept[g], kept[g + 1],
    kept[g + 2]) at once, hd a multiple of 32: each vector of values is widened once
    for the three, where each head widened it again (a float16 cache: one conversion
    an FMA), and each head's sums are the same fused multiply-adds in the same order,
    so the same bits. Four vectors of i at a time: twelve sums in registers. Asks for
    the next task's values as _weighted_values does."""
    hd = values.shape[1]
    flat = values.reshape(-1)
    w0, w1, w2 = kept[g], kept[g + 1], kept[g + 2]
    for i0 in range(0, hd, 32):
        a00, a01, a02, a03 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a10, a11, a12, a13 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        a20, a21, a22, a23 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
        for t in range(m):
            if t % 8 == 0:
                at = _ask(ahead, at, last, 8 * 32)
            row = slots[t] * hd + i0
            v0, v1 = vec.load_f32(flat, row), vec.load_f32(flat, row + 8)
            v2, v3 = vec.load_f32(flat, row + 16), vec.load_f32(flat, row + 24)
            w = vec.broadcast_f32(w0, t)
            a00, a01, a02, a03 = vec.fma(w, v0, a00), vec.fma(w, v1, a01), vec.fma(w, v2, a02), vec.fma(w, v3, a03)
            w = vec.broadcast_f32(w1, t)
            a10, a11, a12, a13 = vec.fma(w, v0, a10), vec.fma(w, v1, a11), vec.fma(w, v2, a12), vec.fma(w, v3, a13)
            w = vec.broadcast_f32(w2, t)
            a20, a21, a22, a23 = vec.fma(w, v0, a20), vec.fma(w, v1, a21), vec.fma(w, v2, a22), vec.fma(w, v3, a23)
        target = out[r]
        for k, (s0, s1, s2, s3) in enumerate(((a00, a01, a02, a03), (a10, a11, a12, a13), (a20, a21, a22, a23))):
            o = (h + k) * hd + i0
            vec.store_f32(target, o, s0)
            vec.store_f32(target, o + 8, s1)
            vec.store_f32(target, o + 16, s2)
            vec.store_f32(target, o + 24, s3)
    return at


@njit(inline="always")
def _weighted_values3_w(kept, g, slots, m, values, out, r, h, ahead, at, last):  # pragma: no cover - compiled
    """_weighted_values3 on 512-bit vectors (_WIDE), hd a multiple of 64: sixteen lanes
    of i a vector, so one pass over t covers 64 of them with the same twelve sums in
    registers (AVX-512's 32 registers hold them and the four vectors of values). Each
    output is still one fused multiply-add per t, in t order, from 0: the same bits
    as the 256-bit loop, for half its instructions. The pass hardly waits on reading
    the values (read from L1 instead it took 0.4 of its 3.0 ms less over 32 sequences
    at context 500), yet half the instructions made attention only 1.02x to 1.09x
    faster: what bounds it was not found (docs/performance.md, nineteenth session)."""
    hd = values.shape[1]
    flat = values.reshape(-1)
    w0, w1, w2 = kept[g], kept[g + 1], kept[g + 2]
    for i0 in range(0, hd, 64):
        a00, a01, a02, a03 = vec.zeros_f32_w(), vec.zeros_f32_w(), vec.zeros_f32_w(), vec.zeros_f32_w()
        a10, a11, a12, a13 = vec.zeros_f32_w(), vec.zeros_f32_w(), vec.zeros_f32_w(), vec.zeros_f32_w()
        a20, a21, a22, a23 = vec.zeros_f32_w(), vec.zeros_f32_w(), vec.zeros_f32_w(), vec.zeros_f32_w()
        for t in range(m):
            if t % 8 == 0:
                at = _ask(ahead, at, last, 8 * 64)
            row = slots[t] * hd + i0
            v0, v1 = vec.load_f32_w(flat, row), vec.load_f32_w(flat, row + 16)
            v2, v3 = vec.load_f32_w(flat, row + 32), vec.load_f32_w(flat, row + 48)
            w = vec.broadcast_f32_w(w0, t)
            a00, a01 = vec.fma_w(w, v0, a00), vec.fma_w(w, v1, a01)
            a02, a03 = vec.fma_w(w, v2, a02), vec.fma_w(w, v3, a03)
            w = vec.broadcast_f32_w(w1, t)
            a10, a11 = vec.fma_w(w, v0, a10), vec.fma_w(w, v1, a11)
            a12, a13 = vec.fma_w(w, v2, a12), vec.fma_w(w, v3, a13)
            w = vec.broadcast_f32_w(w2, t)
            a20, a21 = vec.fma_w(w, v0, a20), vec.fma_w(w, v1, a21)
            a22, a23 = vec.fma_w(w, v2, a22), vec.fma_w(w, v3, a23)
        target = out[r]
        for k, (s0, s1, s2, s3) in enumerate(((a00, a01, a02, a03), (a10, a11, a12, a13), (a20, a21, a22, a23))):
            o = (h + k) * hd + i0
            vec.store_f32_w(target, o, s0)
            vec.store_f32_w(target, o + 16, s1)
            vec.store_f32_w(target, o + 32, s2)
            vec.store_f32_w(target, o + 48, s3)
    return at


@njit(fastmath=_ORDERED, inline="always")
def _softmax_weights(raw, kept, slots, first, start, m, scale, cap, pow2):  # pragma: no cover - compiled
    """kept[t] = exp(raw[slots[t]] * scale - their largest) for t < m, and their sum
    (float64). Slot t is position first + t below `start` (the cache before the
    segment, from the first position the row sees, read eight at a time), then the
    segment's visible rows. With cap > 0 (gemma2) each score is soft-capped first,
    cap * tanh(score / cap), one slot at a time. The largest is the same in any
    order; the sum is kept in eight float64 lanes, position t in lane t % 8, added up
    by vec.total_f64, then the positions past the last whole eight one at a time: a
    fixed order, whatever rows share the call."""
    sc = vec.splat_f32(scale)
    largest = vec.splat_f32(np.float32(-np.inf))
    t = 0
    while t + 8 <= start - first and cap == 0:
        v = vec.mul(vec.load_f32(raw, first + t), sc)
        vec.store_f32(kept, t, v)
        largest = vec.max_f32(largest, v)
        t += 8
    best = vec.largest_lane(largest)
    for t in range(t, m):
        kept[t] = raw[slots[t]] * scale
        if cap > 0:
            kept[t] = np.float32(np.tanh(kept[t] / cap)) * cap
        best = max(best, kept[t])
    for t in range(m):
        kept[t] -= best
    exp_inplace(kept, m, pow2)
    low, high = vec.zeros_f64(), vec.zeros_f64()
    t = 0
    while t + 8 <= m:
        v = vec.load_f32(kept, t)
        low = vec.add_low(low, v)
        high = vec.add_high(high, v)
        t += 8
    total = vec.total_f64(low, high)
    for t in range(t, m):
        total += kept[t]
    return total


@njit(inline="always")
def _scratch(group, longest, hd):  # pragma: no cover - compiled
    """Work arrays for _attend_task, made once per chunk of tasks (allocating them per
    task was a large part of a short task's time)."""
    padded = -(-longest // KEY_BLOCK) * KEY_BLOCK  # _scores stores whole blocks
    raw = np.empty((group, padded), dtype=np.float32)  # every slot's score, before masking
    kept = np.empty((group, longest), dtype=np.float32)  # the visible scores, then weights
    totals = np.empty(group, dtype=np.float64)  # sequential sums of up to thousands of weights
    pow2 = np.empty(longest, dtype=np.int32)
    slots = np.empty(longest, dtype=np.int64)
    folded = np.empty((3, hd), dtype=np.float32)  # frozen keys: queries times steps (_fold)
    lanes = np.empty(8, dtype=np.float32)
    halves = np.empty((6, hd), dtype=np.int8)  # and their integers' halves
    whole = np.empty((3, hd), dtype=np.int16)  # or, without VNNI, the integers (_PAIRED)
    return raw, kept, totals, pow2, slots, folded, lanes, halves, whole


@njit(inline="always")
def _chunks(n_tasks):  # pragma: no cover - compiled
    """Chunks of tasks for a parallel loop. A constant, not numba's thread count,
    which a cached function cannot read; which chunk a task falls in never changes
    its bits. numba's parallel loops hand each thread one evenly sized, contiguous run
    of iterations (its scheduler's default), so chunks of unequal work leave a thread
    idle: attend_many makes its chunks' work equal (_task_edges)."""
    return max(1, min(n_tasks, 32))


# A task's own cost (its set-up, its scratch, its normalization) in positions of
# context: its set-up took 0.3 to 1.5 us, where 32 x 500 spent about 0.025 us a
# position (18 ms on two threads for 1.44 M; docs/performance.md, 2026-12-07).
TASK_OVERHEAD = 32


@njit(inline="always")
def _task_edges(starts, bounds, n_kv, n_chunks):  # pragma: no cover - compiled
    """attend_many's chunk c takes tasks edges[c] to edges[c + 1] (task = row * n_kv +
    kv head): runs of tasks whose work, the positions each row attends over plus
    TASK_OVERHEAD, comes as near n_chunks equal shares as whole tasks allow (each edge
    the nearer of the two tasks around its share). Chunks of equal task counts gave
    one thread the long sequences of a round and the other the short ones: 16
    sequences of 150 positions then 16 of 850 took 1.48x as long as the same
    sequences alternated (docs/performance.md). bounds runs from 0 to q's rows, as
    attend_many's callers give it."""
    rows = bounds[bounds.shape[0] - 1]
    done = np.empty(rows * n_kv + 1, dtype=np.int64)  # work of the tasks before each
    done[0] = 0
    for s in range(starts.shape[0]):
        for row in range(bounds[s], bounds[s + 1]):
            work = starts[s] + row - bounds[s] + 1 + TASK_OVERHEAD
            for kv in range(n_kv):
                task = row * n_kv + kv
                done[task + 1] = done[task] + work
    edges = np.empty(n_chunks + 1, dtype=np.int64)
    task = 0
    for c in range(n_chunks):
        share = done[rows * n_kv] * c // n_chunks
        while done[task] < share:
            task += 1
        nearer = task > 0 and share - done[task - 1] < done[task] - share
        edges[c] = task - 1 if nearer and (c == 0 or task - 1 >= edges[c - 1]) else task
    edges[n_chunks] = rows * n_kv
    return edges


# Keys are stored in blocks of KEY_BLOCK positions, dimension-major (model.KVCache):
# one layer's [Hkv, capacity / KEY_BLOCK, rows * KEY_BLOCK], rows = hd, plus the rows
# of SCALE_BYTES where the values (or keys and values) are 8-bit: a block's last 64
# bytes hold its eight key scales and then its eight value scales (float32; with
# float16 keys and 8-bit values the key scales' room is unused, which keeps blocks
# whole cache lines). Storing a position's key touches hd * KEY_BLOCK * itemsize / 64
# cache lines (16 for float16), where keys with positions last touched hd (64): on
# an Intel Xeon those writes cost a decode round of 32 sequences at context 200 a
# fifth of its time.
KEY_BLOCK = 8
SCALE_BYTES = 64
KEY_SCALES, VALUE_SCALES = 0, 4 * KEY_BLOCK  # bytes after a block's hd rows


@njit(inline="always")
def _scale_offset(flat, hd, which):  # pragma: no cover - compiled
    """Where, in a block of keys (`flat`'s elements), the scales at byte `which` of
    the block's scale bytes start (KEY_SCALES or VALUE_SCALES)."""
    return hd * KEY_BLOCK + which // flat.itemsize


@njit(inline="always")
def _int8_scale(x):  # pragma: no cover - compiled
    """(scale, 1 / scale) for x's values as int8: the largest magnitude maps to 127,
    as in llama.cpp's Q8_0 blocks (one block of head_dim values here). Magnitudes
    below 1e-30 are scaled as if the largest were 1e-30: no division by zero, and
    values that small still round to what they are, about nothing."""
    largest = np.float32(1e-30)
    for i in range(x.shape[0]):
        largest = max(largest, abs(x[i]))
    return largest / np.float32(127.0), np.float32(127.0) / largest


@njit(inline="always")
def store_position(cache_k, cache_v, kv, slot, key, value):  # pragma: no cover - compiled
    """One position's key and value [hd] (float32) of kv head kv into a layer's cache
    (keys [Hkv, capacity / KEY_BLOCK, rows * KEY_BLOCK], values [Hkv, capacity,
    hd]). The Python loop (write_kv) and the compiled layer stacks both store through
    here, compiled without fastmath in both, so a position's stored bits never
    depend on the path that computed it."""
    hd = key.shape[0]
    block, lane = slot // KEY_BLOCK, slot % KEY_BLOCK
    # The block's first element, and its lane's float32 scale past it, in the keys' elements.
    at = (kv * cache_k.shape[1] + block) * cache_k.shape[2] + lane * (4 // cache_k.itemsize)
    if vec.scaled(cache_k):
        key_scale, key_inv = _int8_scale(key)
        for i in range(hd):
            cache_k[kv, block, i * KEY_BLOCK + lane] = vec.as_element(cache_k, key[i] * key_inv)
        vec.store_scale(cache_k, at + _scale_offset(cache_k, hd, KEY_SCALES), key_scale)
    else:
        for i in range(hd):
            cache_k[kv, block, i * KEY_BLOCK + lane] = vec.as_element(cache_k, key[i])
    if vec.scaled(cache_v):
        value_scale, value_inv = _int8_scale(value)
        for i in range(hd):
            cache_v[kv, slot, i] = vec.as_element(cache_v, value[i] * value_inv)
        vec.store_scale(cache_k, at + _scale_offset(cache_k, hd, VALUE_SCALES), value_scale)
    else:
        for i in range(hd):
            cache_v[kv, slot, i] = vec.as_element(cache_v, value[i])


# Frozen keys (int16's cache: float16 keys, 8-bit values, a head width a multiple of
# FROZEN_WIDTH). Attention over many long sequences waits on reading their caches,
# and float16 keys are two thirds of the bytes (docs/performance.md). 8-bit keys with
# a scale per position cost the model's predictions (98.2% top-1 agreement with f32);
# per channel over a block of positions, with a minimum (KIVI's keys), they cost
# nothing measurable (scripts/probe_key_scales.py: 99.59% at int16, as float16 keys).
# So once a block of FROZEN_BLOCK positions is whole, each channel's FROZEN_BLOCK keys
# are stored again as 0..255 steps above a float16 minimum, in float16 steps
# (freeze_block), and a row at position p reads a block frozen when the block ended
# FROZEN_DELAY positions before p or earlier, its float16 keys otherwise. The rule
# depends on p alone, so a row has the same bits alone, in a verification, in a tree
# or in a prefill of any split. The delay keeps every frozen block a row reads before
# its segment: a tree's rows (up to FROZEN_DELAY deep) never read a block holding the
# tree's slots, and a block holding drafts that were then rejected is frozen again
# when its last position is stored again, before any row reads it frozen.
#
# A kv head's frozen blocks lie one after another after its rows of values (the
# values array has frozen_block_rows(hd) rows of hd bytes more per FROZEN_BLOCK
# positions of capacity: frozen_area), each block's bytes in one piece: the units of
# each group of 4 channels, position by position (a 32-bit lane of vpdpbusd each),
# then the channels' float16 steps, then their float16 minima, then a copy of the
# block's value scales (float32, by position). The scales' own place, a line in each
# block of 8 float16 keys, is otherwise untouched once keys are read frozen: one read
# of it for every 8 positions cost attention over 32 sequences at context 500 about
# 7% of its time (docs/performance.md, nineteenth session). A block's size in rows of
# hd bytes is frozen_block_rows(hd) (72 at hd 64). Scores over a frozen block are
# integer sums against the query folded with the block's steps (_fold): blocks of 64
# positions, as one fold a block of 32 cost what the integer sums saved
# (docs/performance.md, fifteenth session).
# Frozen blocks spread among the blocks of keys, or in rows of values widened for
# them, made attention slower than float16 keys: the float16 reads then skip bytes
# that the CPU fetched anyway (docs/performance.md).
FROZEN_BLOCK = 64
FROZEN_PASS = 32  # positions one pass of the integer sums covers (four vectors of 8)
FROZEN_DELAY = 32
FROZEN_PARAMS = 4  # rows of hd bytes after the units: the float16 steps, then the minima
FROZEN_SCALES = 4 * FROZEN_BLOCK  # bytes after them: the block's value scales
FROZEN_WIDTH = 8  # the parameters are read eight at a time (_fold)
FOLD_LEVELS = 16256  # a folded query's largest magnitude in integers: two 7-bit halves (int8.SPLIT_LEVELS)
# Without VNNI (plain AVX2) vpdpbusd's sums of the halves cost each half's bytes
# widened and each pair added to its neighbour (vec.dot4_wide): then the folded
# query's integers stay whole, int16, against the units widened to int16 once for
# all heads (vpmaddwd, _paired_sums). 128 high + low is the whole integer, so the
# sums, and the bits, are the VNNI path's. A constant once compiled.
_PAIRED = not vec.has_vnni()
# With AVX-512 VNNI, the frozen scores and the weighted values of three heads run on
# 512-bit vectors: neither waits much on the caches (docs/performance.md, nineteenth
# session), and the lanes are positions or channels, each computed as on 256 bits, so
# the bits are the same on every CPU. A constant once compiled.
_WIDE = vec.has_avx512_vnni()


@njit(inline="always")
def frozen_blocks(position):  # pragma: no cover - compiled
    """How many frozen blocks a row at `position` reads frozen (from position 0)."""
    return max(0, (position + 1 - FROZEN_DELAY) // FROZEN_BLOCK)


def frozen_block_rows(hd: int) -> int:
    """The rows of hd bytes one frozen block takes: units, parameters, value scales."""
    return FROZEN_BLOCK + FROZEN_PARAMS + -(-FROZEN_SCALES // hd)


_block_rows = njit(inline="always")(frozen_block_rows)


def frozen_rows(capacity: int, hd: int) -> int:
    """The rows of hd bytes the frozen blocks of a cache of `capacity` positions take
    after its values (model.KVCache)."""
    return capacity // FROZEN_BLOCK * frozen_block_rows(hd)


@njit(inline="always")
def has_frozen_keys(keys, values):  # pragma: no cover - compiled
    """Whether a layer's cache keeps frozen keys: float16 keys and 8-bit values (a
    constant once compiled) with rows of values beyond its positions (KVCache makes
    them so)."""
    return vec.is_half(keys) and vec.scaled(values) and values.shape[1] > keys.shape[1] * KEY_BLOCK


@njit(inline="always")
def frozen_area(keys, values, kv):  # pragma: no cover - compiled
    """Kv head kv's frozen blocks as bytes, from a layer's keys [Hkv, blocks, row] and
    values [Hkv, rows, hd]: its values' rows after the cache's positions (empty in a
    cache without)."""
    hd = values.shape[2]
    return values[kv].reshape(-1).view(np.uint8)[keys.shape[1] * KEY_BLOCK * hd :]


@njit(inline="always")
def _block_at(hd, b0):  # pragma: no cover - compiled
    """Where the frozen block starting at position b0 begins in a frozen_area."""
    return b0 // FROZEN_BLOCK * _block_rows(hd) * hd


@njit(inline="always")
def freeze_block(cache_k, cache_v, kv, b0, hd):  # pragma: no cover - compiled
    """Freezes the keys of positions b0 .. b0 + FROZEN_BLOCK - 1 of kv head kv (a
    layer's cache): per channel, the smallest key rounded to float16 is the minimum,
    (largest - minimum) / 255 rounded to float16 the step (1 where that is 0), and
    each key the nearest whole number of steps above the minimum, 0..255; and copies
    the positions' value scales. Every path freezes through here, compiled without
    fastmath, so the bits never depend on the path."""
    keys = cache_k[kv]
    target = frozen_area(cache_k, cache_v, kv)
    at = _block_at(hd, b0)
    flat, stride = keys.reshape(-1), keys.shape[1]
    scales, per_scale = _scale_offset(flat, hd, VALUE_SCALES), 4 // flat.itemsize
    copies = at + (FROZEN_BLOCK + FROZEN_PARAMS) * hd
    for t in range(FROZEN_BLOCK):
        p = b0 + t
        scale = vec.load_scale(flat, (p // KEY_BLOCK) * stride + scales + per_scale * (p % KEY_BLOCK))
        vec.store_scale(target, copies + 4 * t, scale)
    for c in range(hd):
        step_at, low_at = at + FROZEN_BLOCK * hd + 2 * c, at + (FROZEN_BLOCK + 2) * hd + 2 * c
        low, high = np.float32(np.inf), np.float32(-np.inf)
        for t in range(FROZEN_BLOCK):
            p = b0 + t
            key = vec.as_f32(keys[p // KEY_BLOCK, c * KEY_BLOCK + p % KEY_BLOCK])
            low, high = min(low, key), max(high, key)
        vec.store_half(target, low_at, low)
        low = vec.load_half(target, low_at)
        vec.store_half(target, step_at, max(high - low, np.float32(0.0)) / np.float32(255.0))
        step = vec.load_half(target, step_at)
        if step == 0:
            step = np.float32(1.0)
            vec.store_half(target, step_at, step)
        for t in range(FROZEN_BLOCK):
            p = b0 + t
            key = vec.as_f32(keys[p // KEY_BLOCK, c * KEY_BLOCK + p % KEY_BLOCK])
            u = min(max(np.rint((key - low) / step), np.float32(0.0)), np.float32(255.0))
            target[at + (c // 4) * 4 * FROZEN_BLOCK + 4 * t + c % 4] = np.uint8(u)


@njit(inline="always")
def freeze_stored(cache_k, cache_v, start, n, hd):  # pragma: no cover - compiled
    """After slots start .. start + n - 1 were stored: freezes each block whose last
    slot was among them (its earlier slots were stored before it)."""
    if has_frozen_keys(cache_k, cache_v):
        for slot in range(start, start + n):
            if slot % FROZEN_BLOCK == FROZEN_BLOCK - 1:
                for kv in range(cache_k.shape[0]):
                    freeze_block(cache_k, cache_v, kv, slot - (FROZEN_BLOCK - 1), hd)


@njit(inline="always")
def _ask_frozen(area, hd, b0):  # pragma: no cover - compiled
    """Asks for the lines of the frozen block at b0 of a frozen_area (vec.prefetch,
    never waiting), as _ask does for float16 keys."""
    at = _block_at(hd, b0)
    for e in range(0, _block_rows(hd) * hd, 64):
        vec.prefetch(area, at + e)


@njit(inline="always")
def _fold(q, r, h, heads, area, b0, folded, lanes, halves, whole):  # pragma: no cover - compiled
    """For query heads h .. h + heads - 1 and the frozen block at b0 (area: one kv
    head's frozen_area): f_i = q_i step_i (one rounding) in integers, q'_i = rint(f_i
    FOLD_LEVELS / max|f|), its high and low 7-bit halves into halves[2k] and
    halves[2k + 1] (without VNNI q' itself into whole[k]); returns per head the
    constant sum_i q_i minimum_i (lane l one fused multiply-add per i = l mod 8, in i
    order, from 0; then the eight lanes added in lane order) and the step max|f| /
    FOLD_LEVELS of the integers. Once a block,
    not once a position: the scores' inner loop is then integer dot products of units
    and halves alone."""
    hd = q.shape[2]
    steps = _block_at(hd, b0) + FROZEN_BLOCK * hd
    c0, c1, c2 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
    m0, m1, m2 = vec.zeros_f32(), vec.zeros_f32(), vec.zeros_f32()
    for i in range(0, hd, 8):
        step, low = vec.load_halves(area, steps + 2 * i), vec.load_halves(area, steps + 2 * hd + 2 * i)
        query = vec.load_f32(q[r, h], i)
        f = vec.mul(query, step)
        vec.store_f32(folded[0], i, f)
        m0 = vec.max_abs(m0, f)
        c0 = vec.fma(query, low, c0)
        if heads > 1:
            query = vec.load_f32(q[r, h + 1], i)
            f = vec.mul(query, step)
            vec.store_f32(folded[1], i, f)
            m1 = vec.max_abs(m1, f)
            c1 = vec.fma(query, low, c1)
            query = vec.load_f32(q[r, h + 2], i)
            f = vec.mul(query, step)
            vec.store_f32(folded[2], i, f)
            m2 = vec.max_abs(m2, f)
            c2 = vec.fma(query, low, c2)
    d0 = _split_folded(folded[0], vec.largest_lane(m0), halves[0], halves[1], whole[0], hd)
    d1 = d2 = np.float32(0.0)
    if heads > 1:
        d1 = _split_folded(folded[1], vec.largest_lane(m1), halves[2], halves[3], whole[1], hd)
        d2 = _split_folded(folded[2], vec.largest_lane(m2), halves[4], halves[5], whole[2], hd)
    return _lane_total(c0, lanes), _lane_total(c1, lanes), _lane_total(c2, lanes), d0, d1, d2


@njit(inline="always")
def _split_folded(f, largest, high, low, whole, hd):  # pragma: no cover - compiled
    """rint(f * FOLD_LEVELS / largest) split into 7-bit halves (high * 128 + low), or
    whole without VNNI (_PAIRED); returns the integers' step, largest / FOLD_LEVELS
    (0 for a zero query)."""
    levels = np.float32(FOLD_LEVELS)
    scale = vec.splat_f32(levels / largest if largest > 0 else np.float32(0.0))
    for i in range(0, hd, 8):
        v = vec.round_scaled(vec.load_f32(f, i), scale)
        if _PAIRED:
            vec.store_i16(whole, i, v)
            continue
        top = vec.high7(v)
        vec.store_i8(high, i, top)
        vec.store_i8(low, i, vec.low7(v, top))
    return largest / levels


@njit(inline="always")
def _lane_total(v, lanes):  # pragma: no cover - compiled
    """((v_0 + v_1) + v_2) + ... + v_7: one fixed order."""
    vec.store_f32(lanes, 0, v)
    total = lanes[0]
    for lane in range(1, 8):
        total += lanes[lane]
    return total


@njit(inline="always")
def _frozen_sums3(area, data, hd, w0, w1, w2, a):  # pragma: no cover - compiled
    """The twelve sums a (three heads by four vectors of 8 positions) plus the dot
    products of a frozen block's units (from `data`) with halves w0, w1, w2."""
    a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23 = a
    for j in range(hd // 4):
        d = data + j * 4 * FROZEN_BLOCK
        u0, u1 = vec.load_bytes(area, d), vec.load_bytes(area, d + 32)
        u2, u3 = vec.load_bytes(area, d + 64), vec.load_bytes(area, d + 96)
        w = vec.broadcast4(w0, 4 * j)
        a00, a01 = vec.dot4_wide(a00, u0, w), vec.dot4_wide(a01, u1, w)
        a02, a03 = vec.dot4_wide(a02, u2, w), vec.dot4_wide(a03, u3, w)
        w = vec.broadcast4(w1, 4 * j)
        a10, a11 = vec.dot4_wide(a10, u0, w), vec.dot4_wide(a11, u1, w)
        a12, a13 = vec.dot4_wide(a12, u2, w), vec.dot4_wide(a13, u3, w)
        w = vec.broadcast4(w2, 4 * j)
        a20, a21 = vec.dot4_wide(a20, u0, w), vec.dot4_wide(a21, u1, w)
        a22, a23 = vec.dot4_wide(a22, u2, w), vec.dot4_wide(a23, u3, w)
    return a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23


@njit(inline="always")
def _frozen_sums3_w(area, data, hd, w0, w1, w2, a):  # pragma: no cover - compiled
    """_frozen_sums3 on 512-bit vectors (_WIDE): sixteen positions a vector, so the
    twelve sums cover a whole frozen block (4 x 16 positions) in one pass."""
    a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23 = a
    for j in range(hd // 4):
        d = data + j * 4 * FROZEN_BLOCK
        u0, u1 = vec.load_bytes_w(area, d), vec.load_bytes_w(area, d + 64)
        u2, u3 = vec.load_bytes_w(area, d + 128), vec.load_bytes_w(area, d + 192)
        w = vec.broadcast4_w(w0, 4 * j)
        a00, a01 = vec.dot4_w(a00, u0, w), vec.dot4_w(a01, u1, w)
        a02, a03 = vec.dot4_w(a02, u2, w), vec.dot4_w(a03, u3, w)
        w = vec.broadcast4_w(w1, 4 * j)
        a10, a11 = vec.dot4_w(a10, u0, w), vec.dot4_w(a11, u1, w)
        a12, a13 = vec.dot4_w(a12, u2, w), vec.dot4_w(a13, u3, w)
        w = vec.broadcast4_w(w2, 4 * j)
        a20, a21 = vec.dot4_w(a20, u0, w), vec.dot4_w(a21, u1, w)
        a22, a23 = vec.dot4_w(a22, u2, w), vec.dot4_w(a23, u3, w)
    return a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23


@njit(inline="always")
def _frozen_scores3_w(area, data, c0, c1, c2, d0, d1, d2, halves, hd, raw, g, b0):  # pragma: no cover - compiled
    """_frozen_scores3's scores of one frozen block (at `data`) on 512-bit vectors
    (_WIDE): the same exact integer sums, and per position the same fma(d, sum, c)."""
    zero = vec.zeros_i32_w()
    a = (zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero)
    a = _frozen_sums3_w(area, data, hd, halves[0], halves[2], halves[4], a)
    a = (
        vec.combine7_w(a[0], zero),
        vec.combine7_w(a[1], zero),
        vec.combine7_w(a[2], zero),
        vec.combine7_w(a[3], zero),
        vec.combine7_w(a[4], zero),
        vec.combine7_w(a[5], zero),
        vec.combine7_w(a[6], zero),
        vec.combine7_w(a[7], zero),
        vec.combine7_w(a[8], zero),
        vec.combine7_w(a[9], zero),
        vec.combine7_w(a[10], zero),
        vec.combine7_w(a[11], zero),
    )
    a = _frozen_sums3_w(area, data, hd, halves[1], halves[3], halves[5], a)
    for k, c, d in ((0, c0, d0), (1, c1, d1), (2, c2, d2)):
        out, constant, step = raw[g + k], vec.splat_f32_w(c), vec.splat_f32_w(d)
        vec.store_f32_w(out, b0, vec.fma_w(step, vec.to_float_w(a[4 * k]), constant))
        vec.store_f32_w(out, b0 + 16, vec.fma_w(step, vec.to_float_w(a[4 * k + 1]), constant))
        vec.store_f32_w(out, b0 + 32, vec.fma_w(step, vec.to_float_w(a[4 * k + 2]), constant))
        vec.store_f32_w(out, b0 + 48, vec.fma_w(step, vec.to_float_w(a[4 * k + 3]), constant))


@njit(inline="always")
def _paired_sums(area, data, hd, whole, heads):  # pragma: no cover - compiled
    """Without VNNI: the integer sums sum_i q'_i u_i of the 8 positions of a frozen
    block at `data` for the folded queries whole[0 .. heads - 1] (heads 1 or 3), one
    int32 lane a position: the units widened once (4 positions of 4 channels a
    vector), vpmaddwd's exact pair sums against q' as int16, each position's two
    pairs added once at the end (vec.pair_totals). Integer sums in any order are
    the same integers (at most 255 x 16256 x hd: int32 holds them)."""
    zero = vec.zeros_i32()
    e0, o0, e1, o1, e2, o2 = zero, zero, zero, zero, zero, zero  # positions 0-3 and 4-7 of each head
    for j in range(hd // 4):
        d = data + j * 4 * FROZEN_BLOCK
        first, second = vec.widen_units(area, d), vec.widen_units(area, d + 16)
        w = vec.broadcast_pairs(whole[0], 4 * j)
        e0, o0 = vec.madd16(e0, first, w), vec.madd16(o0, second, w)
        if heads == 3:
            w = vec.broadcast_pairs(whole[1], 4 * j)
            e1, o1 = vec.madd16(e1, first, w), vec.madd16(o1, second, w)
            w = vec.broadcast_pairs(whole[2], 4 * j)
            e2, o2 = vec.madd16(e2, first, w), vec.madd16(o2, second, w)
    return vec.pair_totals(e0, o0), vec.pair_totals(e1, o1), vec.pair_totals(e2, o2)


@njit(inline="always")
def _frozen_scores3(
    q, r, h, area, begin, end, raw, g, folded, lanes, halves, whole, ahead, ahead_end
):  # pragma: no cover - compiled
    """raw[g + k, t] for query heads h + k (k = 0, 1, 2) over the frozen blocks from
    position `begin` to `end` (whole blocks), area one kv head's frozen_area: per
    block and head the folded query's halves, its step d and the constant c (_fold),
    then per position the integer sum_i q'_i u_i (the high halves' products, times
    128, plus the low halves'; without VNNI q' whole, _paired_sums), exact, and the
    score fma(d, sum, c). Asks for the next task's frozen blocks below ahead_end
    (ahead: its frozen_area), one a block, as _scores asks for its float16 keys."""
    hd = q.shape[2]
    zero = vec.zeros_i32()
    for b0 in range(begin, end, FROZEN_BLOCK):
        if b0 < ahead_end:
            _ask_frozen(ahead, hd, b0)
        c0, c1, c2, d0, d1, d2 = _fold(q, r, h, 3, area, b0, folded, lanes, halves, whole)
        if _PAIRED:
            for part in range(0, FROZEN_BLOCK, 8):
                s0, s1, s2 = _paired_sums(area, _block_at(hd, b0) + 4 * part, hd, whole, 3)
                for k, c, d, s in ((0, c0, d0, s0), (1, c1, d1, s1), (2, c2, d2, s2)):
                    vec.store_f32(raw[g + k], b0 + part, vec.fma(vec.splat_f32(d), vec.to_float(s), vec.splat_f32(c)))
            continue
        if _WIDE:
            _frozen_scores3_w(area, _block_at(hd, b0), c0, c1, c2, d0, d1, d2, halves, hd, raw, g, b0)
            continue
        for part in range(0, FROZEN_BLOCK, FROZEN_PASS):
            data = _block_at(hd, b0) + 4 * part
            a = (zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero)
            a = _frozen_sums3(area, data, hd, halves[0], halves[2], halves[4], a)
            a = (
                vec.combine7(a[0], zero),
                vec.combine7(a[1], zero),
                vec.combine7(a[2], zero),
                vec.combine7(a[3], zero),
                vec.combine7(a[4], zero),
                vec.combine7(a[5], zero),
                vec.combine7(a[6], zero),
                vec.combine7(a[7], zero),
                vec.combine7(a[8], zero),
                vec.combine7(a[9], zero),
                vec.combine7(a[10], zero),
                vec.combine7(a[11], zero),
            )
            a = _frozen_sums3(area, data, hd, halves[1], halves[3], halves[5], a)
            for k, c, d in ((0, c0, d0), (1, c1, d1), (2, c2, d2)):
                out, constant, step = raw[g + k], vec.splat_f32(c), vec.splat_f32(d)
                vec.store_f32(out, b0 + part, vec.fma(step, vec.to_float(a[4 * k]), constant))
                vec.store_f32(out, b0 + part + 8, vec.fma(step, vec.to_float(a[4 * k + 1]), constant))
                vec.store_f32(out, b0 + part + 16, vec.fma(step, vec.to_float(a[4 * k + 2]), constant))
                vec.store_f32(out, b0 + part + 24, vec.fma(step, vec.to_float(a[4 * k + 3]), constant))
    for b0 in range(max(begin, end), ahead_end, FROZEN_BLOCK):  # the next task's blocks beyond this one's
        _ask_frozen(ahead, hd, b0)


@njit(inline="always")
def _frozen_scores(
    q, r, h, area, begin, end, raw, g, folded, lanes, halves, whole, ahead, ahead_end
):  # pragma: no cover - compiled
    """_frozen_scores3 for query head h alone (raw[g])."""
    hd = q.shape[2]
    zero = vec.zeros_i32()
    for b0 in range(begin, end, FROZEN_BLOCK):
        if b0 < ahead_end:
            _ask_frozen(ahead, hd, b0)
        c, _, _, d, _, _ = _fold(q, r, h, 1, area, b0, folded, lanes, halves, whole)
        if _PAIRED:
            for part in range(0, FROZEN_BLOCK, 8):
                sums = _paired_sums(area, _block_at(hd, b0) + 4 * part, hd, whole, 1)
                vec.store_f32(raw[g], b0 + part, vec.fma(vec.splat_f32(d), vec.to_float(sums[0]), vec.splat_f32(c)))
            continue
        for part in range(0, FROZEN_BLOCK, FROZEN_PASS):
            data = _block_at(hd, b0) + 4 * part
            a0, a1, a2, a3 = zero, zero, zero, zero
            for half in range(2):
                w = halves[half]
                if half == 1:
                    a0, a1, a2, a3 = (
                        vec.combine7(a0, zero),
                        vec.combine7(a1, zero),
                        vec.combine7(a2, zero),
                        vec.combine7(a3, zero),
                    )
                for j in range(hd // 4):
                    at = data + j * 4 * FROZEN_BLOCK
                    b = vec.broadcast4(w, 4 * j)
                    a0 = vec.dot4_wide(a0, vec.load_bytes(area, at), b)
                    a1 = vec.dot4_wide(a1, vec.load_bytes(area, at + 32), b)
                    a2 = vec.dot4_wide(a2, vec.load_bytes(area, at + 64), b)
                    a3 = vec.dot4_wide(a3, vec.load_bytes(area, at + 96), b)
            out, constant, step = raw[g], vec.splat_f32(c), vec.splat_f32(d)
            vec.store_f32(out, b0 + part, vec.fma(step, vec.to_float(a0), constant))
            vec.store_f32(out, b0 + part + 8, vec.fma(step, vec.to_float(a1), constant))
            vec.store_f32(out, b0 + part + 16, vec.fma(step, vec.to_float(a2), constant))
            vec.store_f32(out, b0 + part + 24, vec.fma(step, vec.to_float(a3), constant))
    for b0 in range(max(begin, end), ahead_end, FROZEN_BLOCK):
        _ask_frozen(ahead, hd, b0)


@njit(inline="always")
def frozen_end(keys, values, position):  # pragma: no cover - compiled
    """Where a row at `position` stops reading frozen keys (0 in a cache without)."""
    if has_frozen_keys(keys, values):
        return frozen_blocks(position) * FROZEN_BLOCK
    return 0


@njit(inline="always")
def _warm(flat, begin, end):  # pragma: no cover - compiled
    """Loads one element of each cache line of flat[begin:end], all at once, before a
    loop reads them (vec.touch). Attention's loops took longer over a cache in
    memory than reading it and then computing from cache one after the other: their
    loads sit among chains of multiply-adds that wait on each other, too few in
    flight. Read this way first, attention over 32 sequences took 1.2x less time at
    context 200 and 1.33x at 500 (docs/performance.md); the bits are the loops' own."""
    step = max(1, 64 // flat.itemsize)
    for e in range(begin - begin % step, end, step):
        vec.touch(flat, e)


@njit(fastmath=_ORDERED, inline="always")
def _attend_task(
    q,
    r,
    kv,
    keys_t,
    values,
    start,
    first,
    visible,
    scale,
    cap,
    out,
    r_seg,
    scratch,
    warm,
    ahead_k,
    k_last,
    ahead_v,
    v_last,
    ahead_f,
    f_end,
):  # pragma: no cover - compiled
    """Row r of q (row r_seg of its segment), kv head kv, seeing the cache from
    position `first` (0, or a sliding window's start): attend's arithmetic. With
    `warm`, the task first loads the lines of keys and values it will read (a chunk's
    first task, if its row is its segment's first: the task before it, in the
    previous chunk, may have run on the other thread or not yet; the tasks after it
    find their lines asked for by the task before, _ask, and a segment's later rows
    find them read by its first). Its loops ask for the next task's keys (ahead_k, elements 0
    to k_last), values (ahead_v, 0 to v_last) and frozen blocks (ahead_f: its
    frozen_area, below position f_end)."""
    n_q, hd = q.shape[1], q.shape[2]
    n_kv = keys_t.shape[0]
    group = n_q // n_kv
    n = visible.shape[0]
    end = start + n
    raw, kept, totals, pow2, slots, folded, lanes, halves, whole = scratch
    for t in range(start - first):
        slots[t] = first + t
    m = start - first
    for j in range(n):
        if visible[r_seg, j]:
            slots[m] = start + j
            m += 1
    # The row's position: its segment's start plus its depth (a chain's index), from
    # the segment rows it sees. A sliding window never hides one of them here: models
    # with windows (512 positions and more) send `attend` segments of fewer than
    # matmul.BULK_ROWS rows, and longer ones to BLAS (model._attend).
    frozen = frozen_end(keys_t, values, start + m - (start - first) - 1)
    below = (first // FROZEN_BLOCK) * FROZEN_BLOCK  # frozen blocks a window hides are not read
    area = frozen_area(keys_t, values, kv)
    if warm:
        row_len = keys_t.shape[2]
        tail = max(first, frozen)
        _warm(keys_t[kv].reshape(-1), (tail // KEY_BLOCK) * row_len, -(-end // KEY_BLOCK) * row_len)
        for b0 in range(below, frozen, FROZEN_BLOCK):
            _ask_frozen(area, hd, b0)
    g = 0
    while g + 3 <= group:
        if frozen > below:
            f_asked = f_end if g == 0 else 0
            _frozen_scores3(
                q, r, kv * group + g, area, below, frozen, raw, g, folded, lanes, halves, whole, ahead_f, f_asked
            )
        _scores3(q, r, kv * group + g, keys_t[kv], frozen, end, raw, g, ahead_k, 0, k_last)
        g += 3
    for g in range(g, group):
        if frozen > below:
            f_asked = f_end if g == 0 else 0
            _frozen_scores(
                q, r, kv * group + g, area, below, frozen, raw, g, folded, lanes, halves, whole, ahead_f, f_asked
            )
        _scores(q, r, kv * group + g, keys_t[kv], frozen, end, raw, g, ahead_k, 0, k_last)
    for g in range(group):
        totals[g] = _softmax_weights(raw[g], kept[g], slots, first, start, m, scale, cap, pow2)
    if vec.scaled(values):  # a value is its int8 values times its scale: so is its weight
        _value_scaled(kept, group, slots, first, start, m, keys_t[kv], hd, area, frozen)
    values_kv = values[kv]
    if warm:
        _warm(values_kv.reshape(-1), first * hd, end * hd)
    g = 0
    if _WIDE:  # a constant: the branch is gone where AVX-512 is missing
        while hd % 64 == 0 and g + 3 <= group:
            _weighted_values3_w(kept, g, slots, m, values_kv, out, r, kv * group + g, ahead_v, 0, v_last)
            g += 3
    while hd % 32 == 0 and g + 3 <= group:
        _weighted_values3(kept, g, slots, m, values_kv, out, r, kv * group + g, ahead_v, 0, v_last)
        g += 3
    for g in range(g, group):
        _weighted_values(kept, g, slots, m, values_kv, out, r, kv * group + g, ahead_v, 0, v_last)
    for g in range(group):
        h = kv * group + g
        inv_total = np.float32(1.0 / totals[g])  # normalized once, not once per weight
        for i in range(hd):
            out[r, h * hd + i] = out[r, h * hd + i] * inv_total


# A KV cache's keys and values (model.KVCache): float32; float16 as its uint16 bits;
# float16 keys with int8 values; or int8 keys and values, each position's key and
# value of each kv head with a float32 scale. Bytes read bound attention over many
# long sequences, and the keys are what 8 bits cost quality (docs/performance.md).
#
# The functions below compile at their first call, for its cache's types, not at
# import for all four: a precision uses one pair, and attend and attend_many took
# about 48 s each to compile for one pair on a Zen 4 (docs/operations.md). Not
# inlining _attend_task cut that to 18 s and 8 s, but made attention 1.02x to 1.09x
# slower (a call per task); LLVM's inlining (numba's forceinline), 20 s and 10 s,
# still about 1.02x slower.


@njit(cache=True, nogil=True)
def freeze_blocks(all_keys, all_values, firsts, hd):  # pragma: no cover - compiled
    """Freezes the blocks starting at `firsts` in every layer (a whole cache,
    KVCache.all_keys and all_values: after a tree's accepted path moved)."""
    for layer in range(all_keys.shape[0]):
        for b0 in firsts:
            for kv in range(all_keys.shape[1]):
                freeze_block(all_keys[layer], all_values[layer], kv, b0, hd)


@njit(fastmath=_ORDERED, parallel=True, cache=True, nogil=True)
def attend(q, keys_t, values, start, visible, scale, firsts, cap):  # pragma: no cover - compiled
    """Attention of a segment's rows over its cache.

    q [n, Hq, hd]; keys_t [Hkv, capacity / KEY_BLOCK, rows * KEY_BLOCK] (blocks of
    positions, each dimension-major: a block's positions are the vector lanes) and
    values [Hkv, rows, hd] (capacity rows, then any frozen blocks'; KVCache), the
    segment's own keys and values already written at
    slots start..start+n-1; visible [n, n] bool: may row i see row j of the
    segment; firsts [n]: the first cache position row i sees (0, or the start of a
    sliding window, which must not reach into the segment); cap: gemma2's soft cap
    of the scores, 0 for none. Query head h reads kv head h // (Hq / Hkv). Returns
    [n, Hq * hd].

    A row sees its visible slots in position order: the cache before the segment,
    then its own ancestors (a chain's earlier rows, or a tree's path). Its result
    depends only on those slots, so a tree row, the same row in a chain and the same
    token decoded alone get the same bits. Each (kv head, row) pair is a task of its
    own on numba's threads, the one loop here that is worth waking them for: at
    context 200 a 5-row verification's attention took 1.56x less time than in one
    thread, a 1-row step's 1.14x (measured in one process, alternating)."""
    n, n_q, hd = q.shape
    n_kv = keys_t.shape[0]
    out = np.empty((n, n_q * hd), dtype=np.float32)
    n_tasks = n_kv * n
    n_chunks = _chunks(n_tasks)
    for c in prange(n_chunks):
        scratch = _scratch(n_q // n_kv, start + n, hd)
        begin = c * n_tasks // n_chunks
        for task in range(begin, (c + 1) * n_tasks // n_chunks):
            r = task % n
            # The next task: its kv head, read from its row's first position. Only a kv
            # head's first row finds its lines not yet read (the rest ask for element 0).
            after = min(task + 1, n_tasks - 1)
            fresh = after > task and after % n == 0
            row_len, first_a = keys_t.shape[2], firsts[after % n]
            # Its float16 keys from where it stops reading frozen ones (a chain's row;
            # an ask is a hint, and a tree's deeper rows read their own).
            tail_a = max(first_a, frozen_end(keys_t, values, start + after % n))
            keys_a = keys_t[after // n].reshape(-1)[(tail_a // KEY_BLOCK) * row_len :]
            values_a = values[after // n].reshape(-1)[first_a * hd :]
            k_last = (-(-(start + n) // KEY_BLOCK) - tail_a // KEY_BLOCK) * row_len - 1 if fresh else 0
            v_last = (start + n - first_a) * hd - 1 if fresh else 0
            f_end = frozen_end(keys_t, values, start + after % n) if fresh else 0
            _attend_task(
                q,
                r,
                task // n,
                keys_t,
                values,
                start,
                firsts[r],
                visible,
                scale,
                cap,
                out,
                r,
                scratch,
                r == 0 and task == begin,
                keys_a,
                k_last,
                values_a,
                v_last,
                frozen_area(keys_t, values, after // n),
                f_end,
            )
    return out


@njit(cache=True, nogil=True)
def write_kv(cache_k, cache_v, start, k, v):  # pragma: no cover - compiled
    """k and v [n, Hkv, hd] into a layer's cache at positions start..start+n-1, then
    the blocks they end frozen (freeze_stored)."""
    for r in range(k.shape[0]):
        for kv in range(k.shape[1]):
            store_position(cache_k, cache_v, kv, start + r, k[r, kv], v[r, kv])
    freeze_stored(cache_k, cache_v, start, k.shape[0], k.shape[2])


@njit(fastmath=_ORDERED, parallel=True, cache=True, nogil=True)
def attend_many(q, starts, bounds, visible, keys, values, layer, scale):  # pragma: no cover - compiled
    """`attend` for every segment of a forward at once: q [rows, Hq, hd] holds the
    segments' rows one after the other (segment s: rows bounds[s]..bounds[s+1]),
    keys[s][layer] and values[s][layer] its cache (KVCache.all_keys / all_values).
    Every (segment, kv head, row) is one task of one parallel loop: a decode round of
    32 sequences wakes the threads once a layer, not 32 times for 3 tasks each (3
    tasks on 2 threads leave one idle half the time). Each task runs attend's body,
    so every row gets attend's bits."""
    rows, n_q, hd = q.shape
    n_kv = keys[0].shape[1]
    out = np.empty((rows, n_q * hd), dtype=np.float32)
    longest = 0
    for s in range(starts.shape[0]):
        longest = max(longest, starts[s] + bounds[s + 1] - bounds[s])
    n_tasks = n_kv * rows
    n_chunks = _chunks(n_tasks)
    edges = _task_edges(starts, bounds, n_kv, n_chunks)
    for c in prange(n_chunks):
        scratch = _scratch(n_q // n_kv, longest, hd)
        begin = edges[c]
        for task in range(begin, edges[c + 1]):
            # A row's kv heads one after the other: their caches lie end to end, where
            # each kv head's rows in turn jumped from sequence to sequence (attention
            # over 32 sequences 1.03x to 1.07x faster).
            row, kv = task // n_kv, task % n_kv
            s = np.searchsorted(bounds, row, side="right") - 1
            lo = bounds[s]
            first, cap = 0, np.float32(0.0)  # no window, no soft cap: the compiled loops' models
            keys_t, values_s = keys[s][layer], values[s][layer]
            # The next task: its row, sequence and kv head. Only a segment's first row
            # finds its lines not yet read (the other rows ask for element 0).
            after = min(task + 1, n_tasks - 1)
            row_a = after // n_kv
            s_a = np.searchsorted(bounds, row_a, side="right") - 1
            fresh = after > task and row_a == bounds[s_a]
            end_a = starts[s_a] + bounds[s_a + 1] - bounds[s_a]
            keys_next, values_next = keys[s_a][layer], values[s_a][layer]
            f_end = frozen_end(keys_next, values_next, starts[s_a] + row_a - bounds[s_a])
            tail_a = f_end // KEY_BLOCK
            keys_a = keys_next[after % n_kv].reshape(-1)[tail_a * keys_next.shape[2] :]
            values_a = values_next[after % n_kv].reshape(-1)
            k_last = (-(-end_a // KEY_BLOCK) - tail_a) * keys_next.shape[2] - 1 if fresh else 0
            v_last = end_a * hd - 1 if fresh else 0
            _attend_task(
                q,
                row,
                kv,
                keys_t,
                values_s,
                starts[s],
                first,
                visible[s],
                scale,
                cap,
                out,
                row - lo,
                scratch,
                row == lo and task == begin,
                keys_a,
                k_last,
                values_a,
                v_last,
                frozen_area(keys_next, values_next, after % n_kv),
                f_end if fresh else 0,
            )
    return out

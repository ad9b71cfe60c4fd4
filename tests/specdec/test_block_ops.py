"""The fused per-layer loops: the same values as the numpy formulas they replace, and
a row's bits that do not depend on the rows beside it (a tree row against its chain:
test_tree.py)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from specq.specdec import block_ops, vec
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.model import KVCache, Segment, cache_types, frozen_parts, frozen_shares

RNG = np.random.default_rng(0)


def test_rms_norm_rope_and_gate_match_their_formulas():
    x = RNG.standard_normal((5, 48), dtype=np.float32)
    w = RNG.standard_normal(48, dtype=np.float32)
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(block_ops.rms_norm(x, w, 1e-5), want, rtol=1e-5, atol=1e-6)

    heads = RNG.standard_normal((3, 2, 8), dtype=np.float32)
    angles = RNG.uniform(0, 6, (10, 4))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    positions = np.array([7, 2, 9])
    got = block_ops.rope(heads, cos, sin, positions)
    pairs = heads.reshape(3, 2, 4, 2).astype(np.float64)
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    want = np.stack([pairs[..., 0] * c - pairs[..., 1] * s, pairs[..., 0] * s + pairs[..., 1] * c], -1)
    np.testing.assert_allclose(got, want.reshape(3, 2, 8), rtol=1e-5, atol=1e-6)

    gate_up = RNG.standard_normal((4, 20), dtype=np.float32)
    g, u = gate_up[:, :10].astype(np.float64), gate_up[:, 10:]
    np.testing.assert_allclose(block_ops.silu_gate(gate_up, 10), g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d_ffn", [8, 21, 1536])
def test_the_gate_rounds_as_its_formula_in_the_vector_body_and_the_remainder(d_ffn):
    """silu_gate computes (gate up) / (1 + exp(-gate)), each step rounded once (the
    order the loop had), in its 8-wide vector body and in its scalar remainder alike:
    the same (gate, up) pairs in both give the same bits."""
    pairs = RNG.standard_normal((2, 8)).astype(np.float32) * np.float32(30.0)
    pairs[0, :3] = [-120.0, 95.0, 0.0]  # e at exp's clamp (exp(88)), e flushed to 0, e = 1
    gate = np.resize(pairs[0], d_ffn).astype(np.float32)
    up = np.resize(pairs[1], d_ffn).astype(np.float32)
    got = block_ops.silu_gate(np.concatenate([gate, up])[None, :], d_ffn)[0]
    e = -gate
    block_ops.exp_inplace(e, d_ffn, np.empty(d_ffn, np.int32))
    want = (gate * up) / (np.float32(1.0) + e)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    tail = d_ffn % 8
    if tail and d_ffn > 8:  # a remainder lane has the bits of the body lane with its values
        np.testing.assert_array_equal(got[d_ffn - tail :].view(np.uint32), got[:tail].view(np.uint32))


@pytest.mark.parametrize("hd", [64, 16, 12])
def test_rope_rounds_as_its_formula_in_vectors_and_in_the_scalar_loop(hd):
    """rope's rotation is even = fma(x0, c, -(x1 s)), odd = fma(x0, s, x1 c), each
    product rounded once: in its 8-wide body (rows of hd contiguous, hd a multiple of
    8) and in its scalar loop (a strided view, or hd 12) alike, the same bits."""
    qkv = RNG.standard_normal((5, 3 * hd + 3), dtype=np.float32) * np.float32(7.0)
    angles = RNG.uniform(0, 60, (40, hd // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    positions = np.array([0, 39, 7, 7, 21], dtype=np.int64)
    strided = qkv[:, 3:].reshape(5, 3, hd)  # rows of the product, its first 3 columns skipped
    contiguous = np.ascontiguousarray(strided)
    got = block_ops.rope(contiguous, cos, sin, positions)
    np.testing.assert_array_equal(got.view(np.uint32), block_ops.rope(strided, cos, sin, positions).view(np.uint32))
    x0, x1 = contiguous[..., 0::2].astype(np.float64), contiguous[..., 1::2].astype(np.float64)
    c, s = cos[positions][:, None, :].astype(np.float64), sin[positions][:, None, :].astype(np.float64)
    # x0 c is exact in float64 and the float32 product below is rounded once: the sum,
    # rounded to float32, is the fused multiply-add's (for these values).
    even = (x0 * c - (x1 * s).astype(np.float32)).astype(np.float32)
    odd = (x0 * s + (x1 * c).astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(got[..., 0::2].view(np.uint32), even.view(np.uint32))
    np.testing.assert_array_equal(got[..., 1::2].view(np.uint32), odd.view(np.uint32))


def _reference_attention(q, keys, values, start, visible, scale, firsts=None):
    n, n_q, hd = q.shape
    group = n_q // keys.shape[0]
    out = np.zeros((n, n_q, hd))
    firsts = np.zeros(n, np.int64) if firsts is None else firsts
    for r in range(n):
        seen = list(range(firsts[r], start)) + [start + j for j in range(n) if visible[r, j]]
        for h in range(n_q):
            k, v = keys[h // group, seen].astype(np.float64), values[h // group, seen]
            s = k @ q[r, h] * scale
            p = np.exp(s - s.max())
            out[r, h] = (p / p.sum()) @ v
    return out.reshape(n, -1)


@pytest.mark.parametrize("n_kv", [1, 3])
def test_attention_matches_softmax_attention_with_a_tree_mask(n_kv):
    start, n, hd = 9, 5, 16
    q = RNG.standard_normal((n, 6, hd), dtype=np.float32)
    keys = RNG.standard_normal((n_kv, 20, hd), dtype=np.float32)
    values = RNG.standard_normal((n_kv, 20, hd), dtype=np.float32)
    parents = (-1, 0, 0, 1, 2)
    visible = Segment(None, [0] * n, start, parents=parents).visible()
    keys_t, stored_values = _layer_cache(keys.transpose(0, 2, 1), values, np.float32)[:2]  # the cache's layout
    got = block_ops.attend(
        q, keys_t, stored_values, start, visible, np.float32(0.25), np.zeros(n, np.int64), np.float32(0)
    )
    np.testing.assert_allclose(got, _reference_attention(q, keys, values, start, visible, 0.25), rtol=1e-5, atol=1e-5)


def test_a_sliding_window_hides_the_cache_before_each_rows_first_position():
    start, n, hd = 30, 4, 16
    q = RNG.standard_normal((n, 2, hd), dtype=np.float32)
    keys = RNG.standard_normal((1, 40, hd), dtype=np.float32)
    values = RNG.standard_normal((1, 40, hd), dtype=np.float32)
    visible = np.tril(np.ones((n, n), dtype=bool))
    keys_t, stored_values = _layer_cache(keys.transpose(0, 2, 1), values, np.float32)[:2]
    firsts = np.array([0, 11, 12, 29], dtype=np.int64)  # none, a window, the next row's, all but one slot
    got = block_ops.attend(q, keys_t, stored_values, start, visible, np.float32(0.25), firsts, np.float32(0))
    want = _reference_attention(q, keys, values, start, visible, 0.25, firsts)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    no_window = np.zeros(n, np.int64)
    whole = block_ops.attend(q, keys_t, stored_values, start, visible, np.float32(0.25), no_window, np.float32(0))
    np.testing.assert_array_equal(got[0], whole[0])  # first 0: no window, the same bits
    assert not np.allclose(got[1:], whole[1:])  # the windows hide something


@njit(fastmath={"nnan", "ninf", "contract"})  # not cached: it reads block_ops (kernel_cache)
def _plain_loop_attention(
    q, keys_t, values, start, visible, scale, key_scales, value_scales, frozen_ends, lows, steps, units, firsts
):  # pragma: no cover - compiled
    """The plain loops attention ran as before its register-blocked form: every score
    and weighted sum one fused multiply-add at a time in the same order, with sums
    in memory (its bits are the reference). An 8-bit cache's scales [n_kv, capacity]
    multiply each score and each weight once (ones for a float cache: exact). Row r
    reads positions below frozen_ends[r] frozen (block_ops.freeze_block): lows,
    steps and units [n_kv, hd, capacity] by position; per block of FROZEN_BLOCK, f_i
    = q_i step_i as integers q'_i = rint(f_i FOLD_LEVELS / max|f|), and a score
    there is max|f| / FOLD_LEVELS times the integer sum_i q'_i u_i, plus the
    constant sum_i q_i low_i (eight lanes, lane l summing i = l mod 8 in i order,
    then the lanes in order), one fused multiply-add. Row r sees the cache from
    position firsts[r] (a sliding window's start; 0 for none)."""
    n, n_q, hd = q.shape
    n_kv = keys_t.shape[0]
    group = n_q // n_kv
    end = start + n
    out = np.empty((n, n_q * hd), dtype=np.float32)
    pow2 = np.empty(end, dtype=np.int32)
    for r in range(n):
        for kv in range(n_kv):
            raw = np.zeros((group, end), dtype=np.float32)
            kept = np.empty((group, end), dtype=np.float32)
            acc = np.zeros((group, hd), dtype=np.float32)
            slots = np.empty(end, dtype=np.int64)
            for t in range(start - firsts[r]):
                slots[t] = firsts[r] + t
            for i in range(hd):
                for g in range(group):
                    qi = q[r, kv * group + g, i]
                    for t in range(end):
                        raw[g, t] += qi * keys_t[kv, i, t]
            for g in range(group):
                for b0 in range(0, frozen_ends[r], block_ops.FROZEN_BLOCK):
                    lanes, folded = np.zeros(8, np.float32), np.empty(hd, np.float32)
                    largest = np.float32(0.0)
                    for i in range(hd):
                        qi = q[r, kv * group + g, i]
                        lanes[i % 8] += qi * lows[kv, i, b0]
                        folded[i] = qi * steps[kv, i, b0]
                        largest = max(largest, abs(folded[i]))
                    constant = lanes[0]
                    for lane in range(1, 8):
                        constant += lanes[lane]
                    levels = np.float32(block_ops.FOLD_LEVELS)
                    to_int = levels / largest if largest > 0 else np.float32(0.0)
                    step = largest / levels
                    for t in range(b0, b0 + block_ops.FROZEN_BLOCK):
                        total = 0
                        for i in range(hd):
                            total += np.int64(np.rint(folded[i] * to_int)) * np.int64(units[kv, i, t])
                        raw[g, t] = step * np.float32(total) + constant
            for g in range(group):
                for t in range(end):
                    raw[g, t] *= key_scales[kv, t]
            m = start - firsts[r]
            for j in range(n):
                if visible[r, j]:
                    slots[m] = start + j
                    m += 1
            totals = np.empty(group, dtype=np.float64)
            for g in range(group):
                best = -np.inf
                for t in range(m):
                    kept[g, t] = raw[g, slots[t]] * scale
                    best = max(best, kept[g, t])
                for t in range(m):
                    kept[g, t] -= best
                block_ops.exp_inplace(kept[g], m, pow2)
                # The sum's order: eight float64 lanes (position t in lane t % 8) over
                # the whole eights, the lanes added as block_ops._softmax_weights does, then
                # the rest one at a time.
                whole = m - m % 8
                lanes = np.zeros(8, dtype=np.float64)
                for t in range(whole):
                    lanes[t % 8] += np.float64(kept[g, t])
                pairs = lanes[:4] + lanes[4:]
                totals[g] = (pairs[0] + pairs[1]) + (pairs[2] + pairs[3])
                for t in range(whole, m):
                    totals[g] += kept[g, t]
            for t in range(m):
                for g in range(group):
                    kept[g, t] *= value_scales[kv, slots[t]]
            for t in range(m):
                for g in range(group):
                    weight = kept[g, t]
                    for i in range(hd):
                        acc[g, i] += weight * values[kv, slots[t], i]
            for g in range(group):
                inv_total = np.float32(1.0 / totals[g])
                for i in range(hd):
                    out[r, (kv * group + g) * hd + i] = acc[g, i] * inv_total
    return out


def _layer_cache(keys_t: np.ndarray, values: np.ndarray, dtype) -> tuple[np.ndarray, ...]:
    """A layer's keys [n_kv, hd, capacity] and values [n_kv, capacity, hd] stored as a
    cache of `dtype` stores them (block_ops.write_kv, as the model does; capacity
    rounded up to whole blocks): (keys, values as the kernels take them; the values
    they hold as float32 [n_kv, hd, capacity] and [n_kv, capacity, hd]; key scales,
    value scales [n_kv, capacity], ones where they are float). `dtype`: one type for
    both or a (keys, values) pair, as KVCache takes it."""
    n_kv, hd, capacity = keys_t.shape
    key_dtype, value_dtype = cache_types(dtype)
    blocks = -(-capacity // block_ops.KEY_BLOCK)
    rows = KVCache.rows_per_block(hd, key_dtype, value_dtype)

    def kernel(t: np.dtype) -> np.dtype:
        return np.dtype(np.uint16) if t == np.float16 else t

    k = np.zeros((n_kv, blocks, rows * block_ops.KEY_BLOCK), kernel(key_dtype))
    v = np.zeros((n_kv, blocks * block_ops.KEY_BLOCK, hd), kernel(value_dtype))  # no rows for frozen keys
    block_ops.write_kv(k, v, 0, keys_t.transpose(2, 0, 1).astype(np.float32), values.transpose(1, 0, 2))
    by_position = k.reshape(n_kv, blocks, rows, block_ops.KEY_BLOCK).transpose(0, 2, 1, 3).reshape(n_kv, rows, -1)
    key_scales = value_scales = np.ones((n_kv, capacity), np.float32)
    if value_dtype == np.int8:
        # A block's 64 bytes after its keys: its 8 key scales (8-bit keys), then its 8 value scales (float32).
        at = hd * block_ops.KEY_BLOCK * k.itemsize
        scales = k.view(np.uint8)[:, :, at : at + block_ops.SCALE_BYTES].copy().view(np.float32)
        scales = scales.reshape(n_kv, blocks, 2, -1)
        scales = scales.transpose(0, 2, 1, 3).reshape(n_kv, 2, -1)
        value_scales = scales[:, 1, :capacity].copy()
        if key_dtype == np.int8:
            key_scales = scales[:, 0, :capacity].copy()

    def as_float(a: np.ndarray, t: np.dtype) -> np.ndarray:
        return a.view(np.float16).astype(np.float32) if t == np.float16 else a.astype(np.float32)

    keys_f32, values_f32 = as_float(by_position[:, :hd, :capacity], key_dtype), as_float(v[:, :capacity], value_dtype)
    return k, v, keys_f32, values_f32, key_scales, value_scales


CACHE_DTYPES = [np.float32, np.float16, (np.float16, np.int8), np.int8]


@pytest.mark.parametrize("n_q", [9, 12], ids=["groups_of_3", "groups_of_4"])
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize(
    "hd,start,n", [(64, 200, 1), (64, 37, 5), (16, 9, 5), (24, 3, 2), (72, 61, 3), (32, 5, 6), (128, 70, 2)]
)
def test_register_blocked_attention_has_the_plain_loops_bits(hd, start, n, cache_dtype, n_q):
    """Scores and weighted sums kept in registers (block_ops._scores, _weighted_values)
    do each fused multiply-add of the plain loops in the same order: the same bits,
    for positions and head widths in the blocked part, the vector remainder and the
    scalar one. A float16 cache (its uint16 bits) gives the bits of its values
    widened to float32: the vector and the scalar conversions are both exact. An
    8-bit cache gives the bits of its int8 values as floats, each score times its
    key's scale and each weight times its value's, in vectors and alone alike.
    Three query heads of a kv head take their weighted sums together where the
    width is a multiple of 32 (_weighted_values3), a fourth alone; a last block of
    positions cut by the segment's end is computed whole, its other lanes holding
    random keys (the capacity's)."""
    n_kv, capacity = 3, start + n + 7
    q = RNG.standard_normal((n, n_q, hd), dtype=np.float32)
    keys_t, values, keys_f32, values_f32, key_scales, value_scales = _layer_cache(
        RNG.standard_normal((n_kv, hd, capacity), dtype=np.float32),
        RNG.standard_normal((n_kv, capacity, hd), dtype=np.float32),
        cache_dtype,
    )
    visible = np.tri(n, dtype=bool)
    no_window = np.zeros(len(q), np.int64)
    got = block_ops.attend(q, keys_t, values, start, visible, np.float32(0.125), no_window, np.float32(0))
    none = np.zeros((n_kv, hd, 0), np.float32)  # no frozen keys: values without their rows
    scale = np.float32(0.125)
    want = _plain_loop_attention(
        q, keys_f32, values_f32, start, visible, scale, key_scales, value_scales, no_window, none, none, none, no_window
    )
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _frozen_cache(keys: np.ndarray, values: np.ndarray, capacity: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """keys and values [n, n_kv, hd] written from position 0 into a layer's cache of
    int16's types with frozen keys (KVCache's layout; room for n positions, or
    `capacity`), as the model writes them."""
    n, n_kv, hd = keys.shape
    key_t, value_t = np.dtype(np.float16), np.dtype(np.int8)
    blocks = -(-max(n, capacity) // block_ops.KEY_BLOCK)
    k = np.zeros((n_kv, blocks, KVCache.rows_per_block(hd, key_t, value_t) * block_ops.KEY_BLOCK), np.uint16)
    capacity = blocks * block_ops.KEY_BLOCK
    v = np.zeros((n_kv, capacity + block_ops.frozen_rows(capacity, hd), hd), np.int8)
    block_ops.write_kv(k, v, 0, keys, values)
    return k, v


def test_a_whole_block_of_keys_is_frozen_per_channel_with_a_minimum():
    """freeze_block: each channel of a whole block of FROZEN_BLOCK positions as 0..255
    steps above its float16 minimum (probe_key_scales.py's rounding), within half a
    step of the float16 key; a channel of large, offset keys does not coarsen the
    others; the block still being written is not frozen."""
    rng = np.random.default_rng(5)
    fb = block_ops.FROZEN_BLOCK
    n, n_kv, hd = 2 * fb + 6, 2, 64
    keys = rng.standard_normal((n, n_kv, hd)).astype(np.float32)
    keys[:, :, 7] = keys[:, :, 7] * 30 + 100
    keys[:, 1, 9] = 0.25  # a constant channel: its step is 1, every unit 0
    values = rng.standard_normal((n, n_kv, hd)).astype(np.float32)
    k, v = _frozen_cache(keys, values, capacity=3 * fb)
    shares = frozen_shares(v, 3 * fb)
    assert shares.shape[1] == 3
    units, lows, steps = frozen_parts(shares[:, :2], hd)
    held = keys.astype(np.float16).astype(np.float32).transpose(1, 2, 0)  # [n_kv, hd, n]: the float16 keys
    for b0 in (0, fb):
        block = held[:, :, b0 : b0 + fb]
        low = block.min(-1).astype(np.float16).astype(np.float32)
        step = (np.maximum(block.max(-1) - low, 0) / np.float32(255)).astype(np.float16).astype(np.float32)
        step[step == 0] = 1
        want = np.clip(np.rint((block - low[..., None]) / step[..., None]), 0, 255)
        np.testing.assert_array_equal(units[:, :, b0 : b0 + fb], want)
        np.testing.assert_array_equal(lows[:, :, b0], low)
        np.testing.assert_array_equal(steps[:, :, b0], step)
    error = np.abs(lows + units * steps - held[:, :, : 2 * fb])
    assert (error <= 0.5 * steps * (1 + 1e-5) + np.abs(held[:, :, : 2 * fb]) * 2.0**-11).all()
    others = [c for c in range(hd) if c != 7]
    assert error[:, others].max() < 0.03  # one step for all channels would be about 0.8
    assert steps[1, 9, 0] == 1 and not units[1, 9, : 2 * fb].any()
    # Each whole block's value scales, copied by position after its parameters.
    at = hd * block_ops.KEY_BLOCK  # a block of keys' scales follow its hd rows (uint16 elements)
    scales = k[:, :, at : at + block_ops.SCALE_BYTES // 2].copy().view(np.float32)  # [n_kv, blocks, 16]
    value_scales = scales[:, :, block_ops.KEY_BLOCK :].reshape(n_kv, -1)[:, : 2 * fb]
    first = (fb + block_ops.FROZEN_PARAMS) * hd
    copies = np.ascontiguousarray(shares[:, :2, first : first + block_ops.FROZEN_SCALES]).view(np.float32)
    assert (value_scales > 0).all()
    np.testing.assert_array_equal(copies.reshape(n_kv, -1), value_scales)
    assert not shares[:, 2].any()  # the last 6 positions: not a whole block yet


def _depths(visible: np.ndarray) -> np.ndarray:
    return visible.sum(axis=1) - 1


def _frozen_case(rng: np.random.Generator, start: int, parents: tuple[int, ...], n_q: int) -> tuple[np.ndarray, ...]:
    """Random queries for a segment of `parents` at `start`, and a cache with frozen
    keys (two kv heads of 64) filled from position 0 past the segment: q, k, v, visible."""
    n_kv, hd, n = 2, 64, len(parents)
    capacity = start + n + 7
    keys = rng.standard_normal((capacity, n_kv, hd)).astype(np.float32)
    values = rng.standard_normal((capacity, n_kv, hd)).astype(np.float32)
    k, v = _frozen_cache(keys, values)
    visible = Segment(None, [0] * n, start, parents=parents).visible()
    return rng.standard_normal((n, n_q, hd)).astype(np.float32), k, v, visible


@pytest.mark.parametrize("n_q", [6, 8], ids=["groups_of_3", "groups_of_4"])
@pytest.mark.parametrize(
    "start,parents",
    [(200, (-1,)), (93, (-1, 0, 1, 2, 3)), (63, (-1, 0)), (30, (-1, 0, 1)), (94, (-1, 0, 0, 1, 2, 3))],
    ids=["step", "chain_across_a_bound", "at_the_first_bound", "before_any", "tree"],
)
def test_rows_read_frozen_keys_below_their_own_bound(start, parents, n_q):
    """A row at position p reads the frozen keys of the blocks that ended
    FROZEN_DELAY positions before it or earlier, the float16 keys after them: the
    plain loops' bits with each score there computed from the frozen form, for a
    step, a chain whose rows fall on both sides of a bound, and a tree; three query
    heads of a kv head together (_frozen_scores3), a fourth alone."""
    q, k, v, visible = _frozen_case(np.random.default_rng(start), start, parents, n_q)
    no_window = np.zeros(len(parents), np.int64)
    got = block_ops.attend(q, k, v, start, visible, np.float32(0.125), no_window, np.float32(0))
    ends, plain = _frozen_plain_loops(q, k, v, start, visible, np.float32(0.125))
    np.testing.assert_array_equal(got.view(np.uint32), plain(ends, no_window).view(np.uint32))
    if ends.any():  # the frozen form did change the scores
        assert not np.array_equal(got, plain(0 * ends, no_window))


def _frozen_plain_loops(q, k, v, start, visible, scale):
    """The plain loops over a cache with frozen keys (_frozen_cache), reading what
    they read of it (the float16 keys as float32, the values, the value scales, the
    frozen blocks' lows, steps and units): each row's frozen end, and
    plain(frozen ends, window starts) giving the rows' attention."""
    n_kv, hd = k.shape[0], q.shape[2]
    positions = start + _depths(visible)
    ends = np.maximum(0, (positions + 1 - block_ops.FROZEN_DELAY) // block_ops.FROZEN_BLOCK) * block_ops.FROZEN_BLOCK
    units, lows, steps = frozen_parts(frozen_shares(v, k.shape[1] * block_ops.KEY_BLOCK), hd)
    blocks = k.reshape(n_kv, k.shape[1], -1, block_ops.KEY_BLOCK)[:, :, :hd]
    keys_f32 = blocks.transpose(0, 2, 1, 3).reshape(n_kv, hd, -1).view(np.float16).astype(np.float32)
    at = hd * block_ops.KEY_BLOCK
    scales = k[:, :, at : at + block_ops.SCALE_BYTES // 2].copy().view(np.float32)
    scales = scales.reshape(n_kv, -1, 2, block_ops.KEY_BLOCK)
    value_scales = np.ascontiguousarray(scales[:, :, 1].reshape(n_kv, -1))
    ones, values_f32 = np.ones_like(value_scales), v.astype(np.float32)

    def plain(frozen_ends, firsts):
        return _plain_loop_attention(
            q, keys_f32, values_f32, start, visible, scale, ones, value_scales, frozen_ends, lows, steps, units, firsts
        )

    return ends, plain


@pytest.mark.parametrize(
    "start,parents,window",
    [
        (200, (-1,), 100),  # from position 101, inside the frozen block 64..127
        (200, (-1,), 137),  # from 64, that block's first position
        (200, (-1,), 138),  # from 63, the block before's last
        (200, (-1,), 73),  # from 128, where the row's frozen keys end
        (200, (-1,), 40),  # from 161, past them
        (93, (-1, 0, 1, 2, 3), 60),  # a chain across a bound, each row its own window start
        (300, (-1, 0, 0, 1, 2, 3), 150),  # a tree
    ],
    ids=["inside_a_block", "at_a_block", "before_a_block", "at_the_frozen_end", "past_the_frozen_end", "chain", "tree"],
)
def test_a_sliding_window_over_frozen_keys_reads_only_its_positions(start, parents, window):
    """Sliding-window layers at int16 (gemma3's local ones; gemma2's also cap their
    scores, which this reference does not): a row at position p sees p - window + 1
    .. p, and the frozen blocks below its bound give their frozen scores there. The
    plain loops' bits with the same window starts, for windows that start inside a
    frozen block, at one's start, just before it, where the frozen keys end and after
    them; three query heads of a kv head together (_frozen_scores3) and one alone."""
    q, k, v, visible = _frozen_case(np.random.default_rng(start + window), start, parents, 8)
    positions = start + _depths(visible)
    firsts = np.maximum(positions - (window - 1), 0).astype(np.int64)
    scale = np.float32(0.125)
    got = block_ops.attend(q, k, v, start, visible, scale, firsts, np.float32(0))
    ends, plain = _frozen_plain_loops(q, k, v, start, visible, scale)
    np.testing.assert_array_equal(got.view(np.uint32), plain(ends, firsts).view(np.uint32))
    assert not np.array_equal(got, plain(ends, 0 * firsts))  # the window hid positions
    assert not np.array_equal(got, plain(ends, firsts + 1))  # and exactly those: one more
    assert not np.array_equal(got, plain(ends, firsts - 1))  # or one fewer would differ
    if (ends > firsts).any():  # rows that see frozen positions read their frozen scores
        assert not np.array_equal(got, plain(0 * ends, firsts))


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("hd,end", [(64, 201), (64, 8), (24, 37), (72, 70)])
def test_a_tasks_loops_ask_for_all_of_the_next_tasks_keys_and_values(hd, end, cache_dtype):
    """Each of attention's loops asks for the next task's lines (block_ops._ask) at
    the pace it reads its own: over a next task as long as this one, the scores'
    asks end at the last element of its keys (an 8-bit cache's scale rows too) and
    the weighted sums' at the last of its values, whether three heads share the
    loops or one goes alone; over a shorter one they stop at its end. Asks change
    no bits (the tests above); without them a round of 32 sequences' attention
    waited for each task's lines from memory before multiplying."""
    n_kv, capacity = 1, end + 5
    keys_t, values, *_ = _layer_cache(
        RNG.standard_normal((n_kv, hd, capacity), dtype=np.float32),
        RNG.standard_normal((n_kv, capacity, hd), dtype=np.float32),
        cache_dtype,
    )
    q = RNG.standard_normal((1, 3, hd), dtype=np.float32)
    blocks = -(-end // block_ops.KEY_BLOCK)
    raw = np.zeros((3, blocks * block_ops.KEY_BLOCK), np.float32)
    kept = np.full((3, end), 1e-3, np.float32)
    slots = np.arange(end, dtype=np.int64)
    out = np.zeros((1, 3 * hd), np.float32)
    ahead_k, ahead_v = keys_t[0].reshape(-1), values[0].reshape(-1)
    k_last, v_last = blocks * keys_t.shape[2] - 1, end * hd - 1
    ends = _asks_end(q, keys_t[0], end, raw, kept, slots, values[0], out, ahead_k, ahead_v, k_last, v_last)
    assert ends[:2] == (k_last, k_last)
    assert ends[2] == v_last
    assert ends[3] == (v_last if hd % 32 == 0 else -1)
    wide = block_ops._WIDE and hd % 64 == 0  # _weighted_values3_w runs (512-bit vectors)
    assert ends[4] == (v_last if wide else -1)
    # Half as long a next task: the asks stop at its end.
    ends = _asks_end(q, keys_t[0], end, raw, kept, slots, values[0], out, ahead_k, ahead_v, k_last // 2, v_last // 2)
    assert ends[:3] == (k_last // 2, k_last // 2, v_last // 2)
    assert ends[4] == (v_last // 2 if wide else -1)
    # Twice as long: this task's loops get halfway through its keys and values (a
    # block of keys after each block they read, the values of eight positions
    # before each eight they weigh); the next task's own loops read the rest.
    long_last = 2 * blocks * keys_t.shape[2] - 1
    ends = _asks_end(q, keys_t[0], end, raw, kept, slots, values[0], out, ahead_k, ahead_v, long_last, 2 * end * hd)
    assert ends[:3] == (blocks * keys_t.shape[2], blocks * keys_t.shape[2], blocks * block_ops.KEY_BLOCK * hd)
    assert ends[4] == (blocks * block_ops.KEY_BLOCK * hd if wide else -1)


_WIDE = block_ops._WIDE  # a global constant, so that numba drops the branch where it is False


@njit
def _asks_end(q, keys, end, raw, kept, slots, values, out, ahead_k, ahead_v, k_last, v_last):
    """Where each loop's asks end: _scores3, _scores, _weighted_values, (hd a
    multiple of 32, else -1) _weighted_values3 and (with AVX-512 VNNI and hd a
    multiple of 64, else -1) _weighted_values3_w, for query heads 0 to 2 of row 0.
    One compiled function, not five: each took 15 s to compile."""
    m = slots.shape[0]
    three = block_ops._scores3(q, 0, 0, keys, 0, end, raw, 0, ahead_k, 0, k_last)
    alone = block_ops._scores(q, 0, 0, keys, 0, end, raw, 0, ahead_k, 0, k_last)
    values1 = block_ops._weighted_values(kept, 0, slots, m, values, out, 0, 0, ahead_v, 0, v_last)
    values3 = -1
    if values.shape[1] % 32 == 0:
        values3 = block_ops._weighted_values3(kept, 0, slots, m, values, out, 0, 0, ahead_v, 0, v_last)
    values3w = -1
    if _WIDE and values.shape[1] % 64 == 0:
        values3w = block_ops._weighted_values3_w(kept, 0, slots, m, values, out, 0, 0, ahead_v, 0, v_last)
    return three, alone, values1, values3, values3w


@pytest.mark.parametrize("dtype", [np.int8, (np.float16, np.int8)], ids=["8_bit", "float16_keys"])
def test_an_8_bit_cache_stores_each_position_as_numpy_quantizes_it(dtype):
    """write_kv (and the compiled stacks, through the same store_position) keep a
    position's 8-bit key and value of a kv head as int8 values rint(x * 127 / max|x|)
    and the scale max|x| / 127, float32 arithmetic as numpy's: the same bits on every
    path. Dequantized, every value is within half a step of what was stored. A zero
    vector stays zero. Float16 keys beside 8-bit values are numpy's float16 cast."""
    n, n_kv, hd = 6, 3, 64
    magnitudes = np.float32(10.0) ** RNG.integers(-3, 3, (n, n_kv, 1)).astype(np.float32)
    k = RNG.standard_normal((n, n_kv, hd), dtype=np.float32) * magnitudes
    v = RNG.standard_normal((n, n_kv, hd), dtype=np.float32) * magnitudes[::-1]
    k[2, 1] = 0.0
    v[2, 1] = 0.0
    v[0, 2, 5] = 40.0  # an outlier takes the whole range
    _, _, keys, values, key_scales, value_scales = _layer_cache(k.transpose(1, 2, 0), v.transpose(1, 0, 2), dtype)
    quantized = [(v, values.transpose(1, 0, 2), value_scales.T)]
    if dtype == np.int8:
        quantized.append((k, keys.transpose(2, 0, 1), key_scales.T))
    else:
        np.testing.assert_array_equal(keys.transpose(2, 0, 1), k.astype(np.float16).astype(np.float32))
        assert (key_scales == 1).all()
    for x, quants, scales in quantized:
        largest = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(1e-30))
        want = np.rint(x * (np.float32(127.0) / largest))
        np.testing.assert_array_equal(quants, want)
        np.testing.assert_array_equal(scales[..., None], largest / np.float32(127.0))
        assert np.all(np.abs(quants * scales[..., None] - x) <= 0.5001 * scales[..., None])
    assert not keys[1, :, 2].any()
    assert not values[1, 2].any()


@pytest.mark.parametrize("dtype", [np.int8, (np.float16, np.int8)], ids=["8_bit", "float16_keys"])
def test_an_8_bit_cache_keeps_its_scales_through_growth_and_moves(toy, dtype):
    """The scales live in the keys' blocks: growing the cache keeps every stored
    position's keys, values and scales, and moving slots (a tree's accepted path)
    moves a position's scales with it, across blocks and lanes. The cache takes the
    bytes bytes_per_position says."""
    model, _ = toy
    cfg = model.config
    cache = KVCache(cfg, 6, dtype)
    assert cache.capacity == block_ops.KEY_BLOCK  # whole blocks
    k = RNG.standard_normal((12, cfg.n_kv_heads, cfg.head_dim), dtype=np.float32)
    v = RNG.standard_normal((12, cfg.n_kv_heads, cfg.head_dim), dtype=np.float32)
    for layer in range(cfg.n_layers):
        block_ops.write_kv(cache.kernel_keys[layer], cache.kernel_values[layer], 0, k[:6], v[:6])
    before = [cache.floats(layer, 6) for layer in range(cfg.n_layers)]
    cache.reserve(12)
    assert cache.capacity >= 12
    for layer in range(cfg.n_layers):
        block_ops.write_kv(cache.kernel_keys[layer], cache.kernel_values[layer], 6, k[6:], v[6:])
        keys, values = cache.floats(layer, 12)
        np.testing.assert_array_equal(keys[..., :6], before[layer][0])  # the old positions' scales moved with them
        np.testing.assert_array_equal(values[:, :6], before[layer][1])
        np.testing.assert_allclose(keys.transpose(2, 0, 1), k, atol=np.abs(k).max() / 250)
        np.testing.assert_allclose(values.transpose(1, 0, 2), v, atol=np.abs(v).max() / 250)
    moved = [cache.floats(layer, 12) for layer in range(cfg.n_layers)]
    stored = cache.stored(12)
    cache.move([10, 11], [2, 3])
    for layer in range(cfg.n_layers):
        keys, values = cache.floats(layer, 12)
        np.testing.assert_array_equal(keys[..., 2:4], moved[layer][0][..., 10:12])
        np.testing.assert_array_equal(values[:, 2:4], moved[layer][1][:, 10:12])
        np.testing.assert_array_equal(np.delete(keys, [2, 3], -1), np.delete(moved[layer][0], [2, 3], -1))
    (keys_before, values_before, scales_before, *_), (keys_after, values_after, scales_after, *_) = (
        stored,
        cache.stored(12),
    )
    np.testing.assert_array_equal(keys_after[..., 2:4], keys_before[..., 10:12])  # the stored int8 values
    np.testing.assert_array_equal(values_after[:, :, 2:4], values_before[:, :, 10:12])
    np.testing.assert_array_equal(scales_after[..., 2:4], scales_before[..., 10:12])
    held = cache.all_keys.nbytes + cache.all_values.nbytes
    # Frozen keys take bytes_per_position's share for whole blocks of FROZEN_BLOCK positions only.
    unfrozen = cache.capacity % block_ops.FROZEN_BLOCK if cache.frozen else 0
    frozen_bytes = -(-cfg.head_dim * block_ops.frozen_block_rows(cfg.head_dim) // block_ops.FROZEN_BLOCK)
    per_frozen_position = cfg.n_layers * cfg.n_kv_heads * frozen_bytes
    assert held == cache.capacity * KVCache.bytes_per_position(cfg, dtype) - unfrozen * per_frozen_position


def test_8_bit_keys_need_8_bit_values(toy):
    """8-bit keys' scales share a block with the values' scales: keys of 8 bits beside
    float values are refused, not stored without room for their scales."""
    model, _ = toy
    with pytest.raises(ValueError, match="8-bit keys need 8-bit values"):
        KVCache(model.config, 8, (np.int8, np.float16))


@njit  # not cached: vec inlines into it (kernel_cache)
def _written_by_numba(x, out):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        out[i] = vec.as_element(out, x[i])


@njit  # not cached: vec inlines into it (kernel_cache)
def _read_by_numba(bits, out):  # pragma: no cover - compiled
    for i in range(bits.shape[0]):
        out[i] = vec.as_f32(bits[i])


def test_numba_rounds_a_cache_value_to_float16_as_numpy_does():
    """The compiled block loop writes keys and values into a float16 cache, the Python
    loop by numpy's cast: the same bits, or a row's result would depend on its path.
    Ties, subnormals, overflow, signed zeros and NaN-free extremes included."""
    tiny = np.float32(2.0**-24)
    x = np.concatenate(
        [
            RNG.standard_normal(100_000).astype(np.float32) * np.float32(10.0) ** RNG.integers(-8, 5, 100_000),
            np.array(
                [
                    0.0,
                    -0.0,
                    65504.0,
                    65520.0,
                    65519.99,
                    -1e9,
                    1e9,
                    tiny,
                    tiny / 2,
                    tiny * 1.5,
                    3 * tiny / 2,
                    1.0 + 2.0**-11,
                    1.0 + 3 * 2.0**-11,
                    np.inf,
                    -np.inf,
                ],
                dtype=np.float32,
            ),
            (np.arange(-2048, 2048, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-10),  # ties
        ]
    ).astype(np.float32)
    bits = np.empty(x.shape, np.uint16)
    _written_by_numba(x, bits)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(bits, x.astype(np.float16).view(np.uint16))
    back = np.empty(x.shape, np.float32)
    _read_by_numba(bits, back)
    np.testing.assert_array_equal(back.view(np.uint32), bits.view(np.float16).astype(np.float32).view(np.uint32))


@pytest.fixture(scope="module")
def toy(toy_model_file):
    return load_model_and_tokenizer(toy_model_file())


def test_a_step_and_a_verification_row_have_the_same_bits(toy):
    model, tokenizer = toy
    ids = tokenizer.encode("the cat sat on the mat and the dog")
    one_by_one = model.new_cache()
    model.forward([Segment(one_by_one, ids[:4], 0)])
    steps = [model.forward([Segment(one_by_one, [t], 4 + i)])[0].logits[0] for i, t in enumerate(ids[4:])]
    together = model.new_cache()
    model.forward([Segment(together, ids[:4], 0)])
    verified = model.forward([Segment(together, ids[4:], 4)])[0].logits
    np.testing.assert_array_equal(np.stack(steps), verified)


def test_attention_chunks_split_a_rounds_work_evenly_not_its_tasks():
    """numba's parallel loop gives each thread an equal run of chunks, so each run of
    chunks must hold an equal share of the round's work (its rows' positions), not of
    its tasks: 16 short sequences then 16 long ones split by work, not at the 16th."""
    n_kv = 3

    def done_before(starts, bounds):  # per task: the work of the tasks before it (positions plus overhead)
        rows = [starts[s] + r - bounds[s] + 1 for s in range(len(starts)) for r in range(bounds[s], bounds[s + 1])]
        return np.concatenate([[0], np.cumsum(np.repeat(np.array(rows) + block_ops.TASK_OVERHEAD, n_kv))])

    rounds = [
        (np.array([150] * 16 + [850] * 16), np.arange(33)),  # a decode round, short ones first
        (np.array([40, 900, 7]), np.array([0, 5, 6, 11])),  # verification chains beside a decode row
        (np.array([300]), np.array([0, 1])),  # a lone step: three tasks, three chunks, one each
    ]
    for starts, bounds in rounds:
        starts, bounds = starts.astype(np.int64), bounds.astype(np.int64)
        n_tasks = n_kv * int(bounds[-1])
        n_chunks = min(n_tasks, 32)
        edges = block_ops._task_edges(starts, bounds, n_kv, n_chunks)
        assert edges[0] == 0 and edges[-1] == n_tasks and (np.diff(edges) >= 0).all()
        done = done_before(starts, bounds)
        for c in range(1, n_chunks):  # each edge: the task nearer its share, never before the last edge
            share = done[-1] * c // n_chunks
            after = int(np.searchsorted(done, share))  # the first task at or past the share
            nearer = after - 1 if share - done[after - 1] < done[after] - share else after
            assert edges[c] == max(nearer, edges[c - 1]), (c, edges)
    # The first round's two halves (one thread's chunks each): within half a long task of equal.
    starts, bounds = np.array([150] * 16 + [850] * 16, np.int64), np.arange(33, dtype=np.int64)
    edges = block_ops._task_edges(starts, bounds, n_kv, 32)
    done = done_before(starts, bounds)
    assert abs(2 * done[edges[16]] - done[-1]) <= 850 + 1 + block_ops.TASK_OVERHEAD
    assert edges[16] > 22 * n_kv  # the first thread: all 16 short sequences and 19 of the long ones' tasks


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_attention_of_many_segments_in_one_loop_has_each_segments_bits(cache_dtype):
    """attend_many (one parallel loop over every segment's rows) gives every row the
    bits attend gives it segment by segment: segments of different lengths, starts
    and masks (a decode row, a chain, a tree)."""
    from numba.typed import List

    rng = np.random.default_rng(3)
    layers, n_kv, n_q, hd = 2, 2, 4, 8
    shapes = [
        (5, 1, np.ones((1, 1), bool)),  # start, rows, visible
        (0, 3, np.tril(np.ones((3, 3), bool))),
        (17, 4, np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], bool)),
    ]
    keys, values, visible = List(), List(), List()
    for start, n, mask in shapes:
        per_layer = [
            _layer_cache(
                rng.standard_normal((n_kv, hd, start + n + 2)).astype(np.float32),
                rng.standard_normal((n_kv, start + n + 2, hd)).astype(np.float32),
                cache_dtype,
            )
            for _ in range(layers)
        ]
        keys.append(np.stack([layer[0] for layer in per_layer]))
        values.append(np.stack([layer[1] for layer in per_layer]))
        visible.append(np.ascontiguousarray(mask))
    starts = np.array([s for s, _, _ in shapes], dtype=np.int64)
    bounds = np.cumsum([0] + [n for _, n, _ in shapes]).astype(np.int64)
    q = rng.standard_normal((int(bounds[-1]), n_q, hd)).astype(np.float32)
    for layer in range(layers):
        many = block_ops.attend_many(q, starts, bounds, visible, keys, values, layer, np.float32(0.3))
        for s, (start, _, _) in enumerate(shapes):
            lo, hi = bounds[s], bounds[s + 1]
            alone = block_ops.attend(
                np.ascontiguousarray(q[lo:hi]),
                keys[s][layer],
                values[s][layer],
                start,
                visible[s],
                np.float32(0.3),
                np.zeros(hi - lo, np.int64),
                np.float32(0),
            )
            assert np.array_equal(many[lo:hi], alone)

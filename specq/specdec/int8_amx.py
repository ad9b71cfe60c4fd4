"""Q8_0 products of many rows on AMX tiles (amx.py says why): the output head, and
its screen's first cut (head_screen.py).

The same integers and the same float epilogue as int8_codegen's q8_0v (8-bit
activations) and q8_0vs (int16's halves) kernels, in the same order: per 16 rows by
16 outputs, per block of 32 inputs, the tiles sum the activations (or each of their
two halves) against the block's weights, exact int32 as vpdpbusd's, the sums are
stored, and each row's 16 outputs take, on vectors,

    acc = fma(float(sum), d_w * d_x, acc)    (int16: sum = 128 high + low)

so a row's bits are the vector kernels', whichever path and whatever rows beside it
(bitwise row invariance: a lone step on vectors, the same row in a round on tiles).
A block of 16 outputs in int8.py's 16-lane layout is already a B tile (8 rows of 4
inputs by 16 outputs), read where it lies. The tiles multiply signed bytes by signed
bytes, so the activations are not shifted by 128 and the weights' sums are not used.

Q4_1 on tiles (its 4-bit blocks unpacked to B tiles, with its second fused
multiply-add for the minimum) measured no faster than the vector kernels at 8 to 128
rows (0.84x-1.14x): the tiles' stores of two int32 sums per row, output and block,
and the epilogue's floats, cost what the vector kernels' integer products do.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from specq.specdec import amx
from specq.specdec.vec import (
    broadcast_f32_w,
    combine7_w,
    fma_w,
    load_f32_w,
    load_i32_w,
    mul_w,
    prefetch,
    store_f32_w,
    to_float_w,
)

LANES = 16  # outputs a tile column group holds: the 512-bit epilogue's lanes

# Tiles 0 and 1: the activations of two row tiles (one half at a time where split);
# 2 and 3: the weights of two output groups; 4 to 7: the four (row tile, group) sums.
# Four independent tile products per load: a chain of them on one accumulator ran at
# about a sixth of their rate (33 ns a product, where independent ones took 5), each
# waiting for the last. Split activations' high halves, then their low ones, go
# through the same four.
_load_a0, _load_a1, _load_b0, _load_b1 = amx.load(0), amx.load(1), amx.load(2), amx.load(3)
_zero4, _zero5, _zero6, _zero7 = (amx.zero(t) for t in range(4, 8))
_store4, _store5, _store6, _store7 = (amx.store(t) for t in range(4, 8))
_dot02, _dot03, _dot12, _dot13 = amx.dot_ss(4, 0, 2), amx.dot_ss(5, 0, 3), amx.dot_ss(6, 1, 2), amx.dot_ss(7, 1, 3)
_HALF = 4 * 256  # int32s of one half's sums of a block: (row tile, group) x 16 rows x 16 outputs
_BLOCK_SUMS = 2 * _HALF


@njit(inline="always")
def _configure(config, rows0, rows1):  # pragma: no cover - compiled
    amx.configure(
        config,
        ((rows0, 32), (rows1, 32), (8, 64), (8, 64), (rows0, 64), (rows0, 64), (rows1, 64), (rows1, 64)),
    )
    amx.load_config(config)


@njit(inline="always")
def _products(x, x0, x1, n_in, wq, b0, b1):  # pragma: no cover - compiled
    """A block's products for two row tiles (activations x from x0 and x1) by two
    output groups (weights from b0 and b1) into tiles 4 to 7."""
    _zero4()
    _zero5()
    _zero6()
    _zero7()
    _load_a0(x, x0, n_in)
    _load_a1(x, x1, n_in)
    _load_b0(wq, b0, 64)
    _load_b1(wq, b1, 64)
    _dot02()
    _dot03()
    _dot12()
    _dot13()


@njit(inline="always")
def _store_sums(sums, at):  # pragma: no cover - compiled
    _store4(sums, at, 64)
    _store5(sums, at + 256, 64)
    _store6(sums, at + 512, 64)
    _store7(sums, at + 768, 64)


@njit(inline="always")
def _epilogue(wd, xd, nb, b, w, r0, i, rows, tile, sums, at, acc, split):  # pragma: no cover - compiled
    """Block b's float steps for one (row tile i, group) from its sums at sums[at:]
    (tile: its place, 2 i + group; split: the low halves' _HALF further), the group's
    block w of weights; acc [row tile, group, 16 rows, 16 outputs]."""
    dw = load_f32_w(wd, w * 16)
    for r in range(rows):
        k = 256 * tile + 16 * r
        s = load_i32_w(sums, at + k)
        if split:
            s = combine7_w(s, load_i32_w(sums, at + _HALF + k))
        dx = broadcast_f32_w(xd, (r0 + 16 * i + r) * nb + b)
        store_f32_w(acc, k, fma_w(to_float_w(s), mul_w(dw, dx), load_f32_w(acc, k)))


@njit(inline="always")
def _groups(wq, wd, xq, xl, xd, out, c, c1, n, nb, n_in, n_out, config, sums, acc, split):  # pragma: no cover
    """Output groups c and c1 (c1 may be c again: then written once) for every row,
    32 rows (two row tiles) at a time. A block's tile work is interleaved with the
    previous block's float steps, a quarter at a time: one after the other they took
    the sum of their times (the window of instructions in flight is too short to
    overlap a whole block of either)."""
    for r0 in range(0, n, 2 * amx.ROWS):
        rows0 = min(amx.ROWS, n - r0)
        rows1 = min(amx.ROWS, n - r0 - amx.ROWS)
        second = r0 + amx.ROWS if rows1 > 0 else r0  # a lone row tile: its own rows again, not read
        _configure(config, rows0, rows1 if rows1 > 0 else rows0)
        rows1 = max(rows1, 0)
        acc[:] = 0.0
        for b in range(nb + 1):
            at, before = (b % 2) * _BLOCK_SUMS, ((b + 1) % 2) * _BLOCK_SUMS
            b0, b1 = (c * nb + b) * 512, (c1 * nb + b) * 512
            x0, x1 = r0 * n_in + b * 32, second * n_in + b * 32
            w0, w1 = c * nb + b - 1, c1 * nb + b - 1
            ahead, last = b < nb, b - 1
            if ahead:  # the next pair of groups' weights, read as they lie (as int8_codegen's)
                for line in range(0, 512, 64):
                    prefetch(wq, b0 + 2 * nb * 512 + line)
                    prefetch(wq, b1 + 2 * nb * 512 + line)
                _products(xq, x0, x1, n_in, wq, b0, b1)
            if b > 0:
                _epilogue(wd, xd, nb, last, w0, r0, 0, rows0, 0, sums, before, acc, split)
            if ahead:
                _store_sums(sums, at)
            if b > 0:
                _epilogue(wd, xd, nb, last, w1, r0, 0, rows0, 1, sums, before, acc, split)
            if ahead and split:
                _products(xl, x0, x1, n_in, wq, b0, b1)
            if b > 0:
                _epilogue(wd, xd, nb, last, w0, r0, 1, rows1, 2, sums, before, acc, split)
            if ahead and split:
                _store_sums(sums, at + _HALF)
            if b > 0:
                _epilogue(wd, xd, nb, last, w1, r0, 1, rows1, 3, sums, before, acc, split)
        for j in range(2 if c1 != c else 1):
            for i in range(2):
                for r in range(rows0 if i == 0 else rows1):
                    k = 256 * (2 * i + j) + 16 * r
                    store_f32_w(out, (r0 + 16 * i + r) * n_out + (c if j == 0 else c1) * 16, load_f32_w(acc, k))


@njit(parallel=True, cache=True, nogil=True)
def q8_0_tiles(wq, wd, xq, xl, xd, out, n, nb, n_in, n_out, n_slices, split):  # pragma: no cover - compiled
    """x @ w.T into out [n, n_out] for a Q8_0 Int8Matrix's arrays (wq, wd) and the
    activations quantized, not shifted (xq; split: xq and xl, the halves): the bits
    of int8_kernels.q8_0vw_* (q8_0vsw_* where split)."""
    groups = n_out // LANES
    for t in prange(n_slices):
        config = np.zeros(64, np.uint8)
        sums, acc = np.empty(2 * _BLOCK_SUMS, np.int32), np.empty(4 * 256, np.float32)
        last = (t + 1) * groups // n_slices
        for c in range(t * groups // n_slices, last, 2):
            _groups(wq, wd, xq, xl, xd, out, c, min(c + 1, last - 1), n, nb, n_in, n_out, config, sums, acc, split)
        amx.release()

"""The int16 precision's products of many rows on AMX tiles (amx.py says why).

The same integers and the same float epilogue as int8_codegen's split kernels, in the
same order: per 16 rows by 16 outputs, per block of 32 inputs, the tiles sum the
activations' high and low halves against the block's weights (exact int32, as
vpdpbusd), the sums are stored, and each row's 16 outputs take, on vectors,

    Q4_1:  acc = fma(float(128 high + low), d_w * d_x, acc);  acc = fma(m_w, s_x, acc)
    Q8_0:  acc = fma(float(128 high + low), d_w * d_x, acc)

so a row's bits are the vector kernels', whichever path and whatever rows beside it
(bitwise row invariance: a lone step on vectors, the same row in a round on tiles).
The weights are the 16-lane layout of int8.py: a Q8_0 block of 16 outputs is already
a B tile (8 rows of 4 inputs by 16 outputs); a Q4_1 block is unpacked to one (low
nibbles are inputs 0-15, high ones 16-31) once per output group, for all row tiles.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from specq.specdec import amx
from specq.specdec.vec import (
    broadcast_f32_w,
    combine7_w,
    fma_w,
    high_nibbles_w,
    load_bytes_w,
    load_f32_w,
    load_i32_w,
    low_nibbles_w,
    mul_w,
    prefetch,
    store_bytes_w,
    store_f32_w,
    to_float_w,
)

LANES = 16  # outputs a tile column group holds: the 512-bit epilogue's lanes

# Tiles 0 and 1: the activations of two row tiles (one half, high or low, at a time);
# 2 and 3: the weights of two output groups; 4 to 7: the four (row tile, group) sums.
# Four independent tile products per load: a tile product's latency (about 50 cycles
# where its throughput is 16) left one chain of them waiting on itself four times
# out of five. The high halves' sums, then the low halves', go through the same four.
_load_a0, _load_a1, _load_b0, _load_b1 = amx.load(0), amx.load(1), amx.load(2), amx.load(3)
_ZERO = tuple(amx.zero(t) for t in range(4, 8))
_zero4, _zero5, _zero6, _zero7 = _ZERO
_store4, _store5, _store6, _store7 = (amx.store(t) for t in range(4, 8))
_su = (amx.dot_su(4, 0, 2), amx.dot_su(5, 0, 3), amx.dot_su(6, 1, 2), amx.dot_su(7, 1, 3))
_ss = (amx.dot_ss(4, 0, 2), amx.dot_ss(5, 0, 3), amx.dot_ss(6, 1, 2), amx.dot_ss(7, 1, 3))
_su02, _su03, _su12, _su13 = _su
_ss02, _ss03, _ss12, _ss13 = _ss
_SUMS = 2 * 4 * 256  # int32s of one block's sums: (high, low) x (row tile, group) x 16 x 16


@njit(inline="always")
def _configure(config, rows0, rows1):  # pragma: no cover - compiled
    amx.configure(
        config,
        ((rows0, 32), (rows1, 32), (8, 64), (8, 64), (rows0, 64), (rows0, 64), (rows1, 64), (rows1, 64)),
    )
    amx.load_config(config)


@njit(inline="always")
def _unpack_q4_1(wq, c, nb, b_tiles, at):  # pragma: no cover - compiled
    """Output group c's Q4_1 blocks as B tiles of nibble values, 512 bytes a block,
    into b_tiles[at:]."""
    for b in range(nb):
        src, dst = (c * nb + b) * 256, at + b * 512
        for i in range(0, 256, 64):
            prefetch(wq, src + 2 * nb * 256 + i)  # the next pair of groups' (amx.py: as int8_codegen's)
            v = load_bytes_w(wq, src + i)
            store_bytes_w(b_tiles, dst + i, low_nibbles_w(v))
            store_bytes_w(b_tiles, dst + 256 + i, high_nibbles_w(v))


@njit(inline="always")
def _products(x, x0, x1, n_in, bt, b0, b1, signed):  # pragma: no cover - compiled
    """One half's (high or low) block products for two row tiles (rows from x0, x1)
    by two groups (B tiles at b0, b1) into tiles 4 to 7."""
    _zero4()
    _zero5()
    _zero6()
    _zero7()
    _load_a0(x, x0, n_in)
    _load_a1(x, x1, n_in)
    _load_b0(bt, b0, 64)
    _load_b1(bt, b1, 64)
    if signed:
        _ss02()
        _ss03()
        _ss12()
        _ss13()
    else:
        _su02()
        _su03()
        _su12()
        _su13()


@njit(inline="always")
def _store_sums(sums, at):  # pragma: no cover - compiled
    _store4(sums, at, 64)
    _store5(sums, at + 256, 64)
    _store6(sums, at + 512, 64)
    _store7(sums, at + 768, 64)


@njit(inline="always")
def _epilogue(wd, wm, xd, xs, nb, b, w, r0, i, rows, tile, sums, at, acc, q8):  # pragma: no cover - compiled
    """Block b's float steps for one (row tile i, group) of its sums at sums[at:]
    (tile: its place, 2 i + group), for the group's block w of weights; acc [row
    tile, group, 16, 16]."""
    dw = load_f32_w(wd, w * 16)
    mw = load_f32_w(wm, w * 16)
    for r in range(rows):
        k = 256 * tile + 16 * r
        s = combine7_w(load_i32_w(sums, at + k), load_i32_w(sums, at + 1024 + k))
        xi = (r0 + 16 * i + r) * nb + b
        a = fma_w(to_float_w(s), mul_w(dw, broadcast_f32_w(xd, xi)), load_f32_w(acc, k))
        if not q8:
            a = fma_w(mw, broadcast_f32_w(xs, xi), a)
        store_f32_w(acc, k, a)


@njit(inline="always")
def _groups(wq, wd, wm, xq, xl, xd, xs, out, c, c1, n, nb, n_in, n_out, config, bt, sums, acc, q8):  # pragma: no cover
    """Output groups c and c1 (c1 may be c again: then written once) for every row,
    32 rows (two row tiles) at a time. A block's tile work is interleaved with the
    previous block's float steps, a quarter of each at a time: run one after the
    other they took the sum of their times (the tiles' stores and the floats' loads of
    them do not wait on each other this way, and the window of instructions in
    flight is too short to overlap a whole block of either)."""
    for r0 in range(0, n, 2 * amx.ROWS):
        rows0 = min(amx.ROWS, n - r0)
        rows1 = min(amx.ROWS, n - r0 - amx.ROWS)
        second = r0 + amx.ROWS if rows1 > 0 else r0  # a lone row tile: its own rows again, not read
        _configure(config, rows0, rows1 if rows1 > 0 else rows0)
        rows1 = max(rows1, 0)
        acc[:] = 0.0
        for b in range(nb + 1):
            at, before = (b % 2) * 2048, ((b + 1) % 2) * 2048
            b0 = (c * nb + b) * 512 if q8 else b * 512
            b1 = (c1 * nb + b) * 512 if q8 else (nb + b) * 512
            x0, x1 = r0 * n_in + b * 32, second * n_in + b * 32
            w0, w1 = c * nb + b - 1, c1 * nb + b - 1
            if q8 and b < nb:  # the next pair of groups' weights, read as they are
                for line in range(0, 512, 64):
                    prefetch(wq, b0 + 2 * nb * 512 + line)
                    prefetch(wq, b1 + 2 * nb * 512 + line)
            if b < nb:
                _products(xq, x0, x1, n_in, bt, b0, b1, q8)
            if b > 0:
                _epilogue(wd, wm, xd, xs, nb, b - 1, w0, r0, 0, rows0, 0, sums, before, acc, q8)
            if b < nb:
                _store_sums(sums, at)
            if b > 0:
                _epilogue(wd, wm, xd, xs, nb, b - 1, w1, r0, 0, rows0, 1, sums, before, acc, q8)
            if b < nb:
                _products(xl, x0, x1, n_in, bt, b0, b1, q8)
            if b > 0:
                _epilogue(wd, wm, xd, xs, nb, b - 1, w0, r0, 1, rows1, 2, sums, before, acc, q8)
            if b < nb:
                _store_sums(sums, at + 1024)
            if b > 0:
                _epilogue(wd, wm, xd, xs, nb, b - 1, w1, r0, 1, rows1, 3, sums, before, acc, q8)
        for j in range(2 if c1 != c else 1):
            for i in range(2):
                for r in range(rows0 if i == 0 else rows1):
                    k = 256 * (2 * i + j) + 16 * r
                    store_f32_w(out, (r0 + 16 * i + r) * n_out + (c if j == 0 else c1) * 16, load_f32_w(acc, k))


@njit(parallel=True, cache=True, nogil=True)
def q4_1s_tiles(wq, wd, wm, xq, xl, xd, xs, out, n, nb, n_in, n_out, n_slices):  # pragma: no cover - compiled
    """int8_kernels.q4_1sw_*'s product (same arguments, same bits) on tiles."""
    groups = n_out // LANES
    for t in prange(n_slices):
        config = np.zeros(64, np.uint8)
        bt = np.empty(2 * nb * 512, np.uint8)
        sums, acc = np.empty(2 * _SUMS, np.int32), np.empty(1024, np.float32)
        last = (t + 1) * groups // n_slices
        for c in range(t * groups // n_slices, last, 2):
            c1 = min(c + 1, last - 1)
            _unpack_q4_1(wq, c, nb, bt, 0)
            _unpack_q4_1(wq, c1, nb, bt, nb * 512)
            _groups(wq, wd, wm, xq, xl, xd, xs, out, c, c1, n, nb, n_in, n_out, config, bt, sums, acc, False)
        amx.release()


@njit(parallel=True, cache=True, nogil=True)
def q8_0s_tiles(wq, wd, ws, xq, xl, xd, out, n, nb, n_in, n_out, n_slices):  # pragma: no cover - compiled
    """int8_kernels.q8_0vsw_*'s product on tiles, but for the activations: not
    shifted (the tiles multiply signed bytes by signed bytes), so the weights' sums
    ws are not needed (taken for the same arguments)."""
    groups = n_out // LANES
    for t in prange(n_slices):
        config = np.zeros(64, np.uint8)
        sums, acc = np.empty(2 * _SUMS, np.int32), np.empty(1024, np.float32)
        last = (t + 1) * groups // n_slices
        for c in range(t * groups // n_slices, last, 2):
            _groups(
                wq,
                wd,
                wd,
                xq,
                xl,
                xd,
                xd,
                out,
                c,
                min(c + 1, last - 1),
                n,
                nb,
                n_in,
                n_out,
                config,
                wq,
                sums,
                acc,
                True,
            )
        amx.release()

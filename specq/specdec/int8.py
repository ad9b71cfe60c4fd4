"""Products on integer activations: the `int16` and `int8` precisions (issue 14).

Why. With the weights in cache, the float32 kernel (qkernels.py) is bound by
arithmetic: every extra row of a forward cost about 0.4 of a one-row step. Integer
dot-product instructions do 4 multiply-adds per 32-bit lane where a float FMA does
one, so here, as in llama.cpp, each activation row is quantized like Q8_0 (per block
of 32: d = max|x| / L, q = rint(x / d)) and multiplied by the weights' own integers:

    Q8_0 weights (d_w, q_w):       out += float(sum q_w q_x) * (d_w * d_x)
    Q4_1 weights (d_w, m_w, q_w):  out += float(sum q_w q_x) * (d_w * d_x);  out += m_w * s_x

with s_x = d_x * sum(q_x), the block's sum as the integers see it (llama.cpp's Q8_1):
the float sum of x would leave an error (w - m) dx instead of w dx, measured twice as
large. The sums are exact integers (int16's Q8_0 sums, up to 2**26, are rounded once
when converted to float), each + is one fused multiply-add in block order, so a row's
bits depend only on its own values (bitwise row invariance) and are the same on every
CPU with AVX2, with any vector width (vec.dot4).

int8: L = 127, llama.cpp's choice. A product differs from float32's by about 0.5% rms,
which changes the model's next token at near-ties (top-1 agreement with f32 about 97%
on the bench mix, `specq bench --quality`).
int16: L = 127 * 128, q split into two int8 halves, q = 128 high + low (high in
[-127, 127], low in [-64, 63]); the kernel sums both halves against the same weights
(the "split" kernels) and combines them in int32. About 1e-4 from float32 per
product, and f32's next-token predictions at 99.91% of the bench mix's positions
with a float16 KV cache (99.59% with the float16 keys and 8-bit values int16 keeps
since 2026-12-05), for about 1.6x int8's arithmetic.

Without VNNI (AVX2's vpmaddubsw, which has no int32 accumulate) two kinds of product
take a shorter road to the same integers: against 4-bit weights a block's pairs are
added as int16 and widened once (vec.nibble_dot4), and int16's products against 8-bit
weights (Q8_0, Q8_M, Q8_H) multiply the whole 15-bit activations by the weights
widened to int16 with vpmaddwd (the `q8_0i`, `q8_mi` and `q8_hi` kernels,
vec.madd16) instead of summing the two halves by the sign trick.

Formats. Besides the default model's Q4_1 and Q8_0, every GGUF type with integer
weights in blocks of 32 is unpacked at load, without loss, into one of four formats
(gguf_blocks.py): Q4_1 (4-bit q, d, m: also Q4_0 and Q4_K), Q8_0 (8-bit q, d: also
Q5_0), Q8_M (8-bit q, d, m: Q5_1 and Q5_K) and Q8_H (8-bit q with a d per half
block of 16, and m: Q6_K and Q3_K, and q/k/v matrices of several types stacked).
Their products differ only in the epilogue (int8_codegen).

Layout, repacked at load from gguf's blocks (`lanes` outputs side by side, 8 or 16,
the vector width; each 32-bit lane holds 4 consecutive inputs of its output, so the
instructions reduce along the inputs within a lane and the activations are a
broadcast of 4 bytes: no horizontal sums):
    Q4_1 quants [n_out/lanes, blocks, 4, 4 lanes] uint8: byte 4 * lane + p of vector v
         holds input 4v + p (low nibble) and input 16 + 4v + p (high nibble)
    Q8_* quants [n_out/lanes, blocks, 8, 4 lanes] int8: byte 4 * lane + p of vector v
         is input 4v + p
    d (and m) [n_out/lanes, blocks, lanes] (Q8_H's d [n_out/lanes, blocks, 2, lanes]):
         float16 held as uint16 bits where every one of them is a float16 (the files'
         own scales: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), else float32 (a K-quant's
         products of two of them). Exact either way; the kernels widen float16 as they load it
         (vcvtph2ps). A one-row step streams every weight byte once from memory, and
         float32 scales were a third of a Q4_1 matrix's bytes: float16 made the
         layers' products of one row 1.18x faster (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import config, njit, prange

from specq.specdec import amx, gguf_blocks, vec
from specq.specdec.precision import require_integer
from specq.specdec.qkernels import BLOCK, QuantizedMatrix

TYPES = ("Q4_1", "Q8_0")  # the GGUF types kept as qkernels.QuantizedMatrix and converted from it
FORMATS = ("Q4_1", "Q8_0", "Q8_M", "Q8_H")  # an Int8Matrix's; a format's code is its index
_MIN = ("Q4_1", "Q8_M", "Q8_H")  # the formats with a minimum m
AVAILABLE = vec.has_avx2()  # the kernels need AVX2 and FMA (and F16C); vec.dot4 says why this suffices

if AVAILABLE:
    from specq.specdec import int8_kernels as _kernels

    _VNNI = vec.has_vnni()
    # 512-bit vectors where AVX-512 has VNNI: twice the outputs per instruction. Else
    # 256-bit ones, with the larger micro-kernel where AVX-512VL gives 32 registers.
    _512 = vec.has_avx512_vnni()
    _32_REGISTERS = "avx512vl" in vec.cpu_features()
    if _512:
        _drive_q4_1, _drive_q8_0v = _kernels.q4_1w_2x3, _kernels.q8_0vw_2x3
        _drive_q4_1s, _drive_q8_0vs = _kernels.q4_1sw_2x4, _kernels.q8_0vsw_2x3
    else:
        _drive_q4_1 = _kernels.q4_1_2x3 if _32_REGISTERS else _kernels.q4_1_1x3
        _drive_q8_0v = _kernels.q8_0v_2x3 if _32_REGISTERS else _kernels.q8_0v_1x4
        _drive_q4_1s = _kernels.q4_1s_2x2 if _32_REGISTERS else _kernels.q4_1s_1x2
        _drive_q8_0vs = _kernels.q8_0vs_2x2 if _32_REGISTERS else _kernels.q8_0vs_1x2
    _drive_q8_0 = _kernels.q8_0_2x3 if _32_REGISTERS else _kernels.q8_0_1x4
    _drive_q8_0i, _drive_q8_mi, _drive_q8_hi = _kernels.q8_0i_1x3, _kernels.q8_mi_1x3, _kernels.q8_hi_1x2
    # The other formats' kernels (int8_codegen), chosen as for Q8_0. Without VNNI, the
    # sign trick (int8) or int16 products (int16), at 8 lanes only; with VNNI, x + 128,
    # at 16 lanes with AVX-512.
    _drive_q8_m = _kernels.q8_m_2x3 if _32_REGISTERS else _kernels.q8_m_1x4
    _drive_q8_h = _kernels.q8_h_2x2 if _32_REGISTERS else _kernels.q8_h_1x2
    if _512:
        _drive_q8_mv, _drive_q8_mvs = _kernels.q8_mvw_2x3, _kernels.q8_mvsw_2x2
        _drive_q8_hv, _drive_q8_hvs = _kernels.q8_hvw_2x2, _kernels.q8_hvsw_1x2
    else:
        _drive_q8_mv = _kernels.q8_mv_2x3 if _32_REGISTERS else _kernels.q8_mv_1x4
        _drive_q8_mvs = _kernels.q8_mvs_2x2 if _32_REGISTERS else _kernels.q8_mvs_1x2
        _drive_q8_hv = _kernels.q8_hv_2x2 if _32_REGISTERS else _kernels.q8_hv_1x2
        _drive_q8_hvs = _kernels.q8_hvs_1x2 if _32_REGISTERS else _kernels.q8_hvs_1x1
LANES = 16 if AVAILABLE and _512 else 8  # outputs side by side in a weight's layout: the kernels' vector lanes

# From this many rows the Q8_0 products (the output head, and its screen's first cut)
# run on AMX tiles where the CPU has them (int8_amx.py; the same bits as the vector
# kernels). On a Xeon with AMX, the head (49,152 x 576) against the 512-bit kernels,
# products alone, medians of 21 pairs in two or three runs: at 16 and 17 rows 0.92x to
# 1.22x; at 20 1.26x-1.37x with 8-bit activations, 0.94x-1.28x with int16's; at 32
# 1.21x-1.50x; at 64 1.12x-1.42x (docs/performance.md). Elsewhere never reached.
TILES = AVAILABLE and _512 and amx.AVAILABLE
TILE_ROWS = 20 if TILES else 1 << 62
if TILES:
    from specq.specdec.int8_amx import q8_0_tiles as _tiles_q8_0
elif AVAILABLE:

    @njit(nogil=True, cache=True)
    def _tiles_q8_0(wq, wd, xq, xl, xd, out, n, nb, n_in, n_out, n_slices, split):  # pragma: no cover - compiled
        """Never called (TILE_ROWS): numba types both sides of the branch that calls
        int8_amx's, which compiles only for a CPU with AMX."""
        raise AssertionError("no AMX tiles on this CPU")


require = require_integer  # the same check as AVAILABLE, its one-line error kept in precision.py


@dataclass(frozen=True, eq=False)
class Int8Matrix:
    """A matrix [n_out, n_in] in one of FORMATS, in the int8 kernels' layout (module
    docstring) for `lanes` outputs side by side, padded with zero rows to a multiple
    of `lanes` outputs."""

    type_name: str  # its format, one of FORMATS
    shape: tuple[int, int]
    quants: np.ndarray  # flat: Q4_1 uint8, the others int8
    d: np.ndarray  # flat, float16 bits (uint16) or float32 (the module docstring)
    m: np.ndarray  # flat, d's dtype (Q4_1, Q8_M and Q8_H; empty for Q8_0)
    sums: np.ndarray  # flat int32 (Q8_*): 128 * the sum of each output's block (Q8_H: half block) of weights
    lanes: int = 8
    split: bool = False  # activations as two int8 halves (the int16 precision; module docstring)

    @classmethod
    def from_quantized(cls, w: QuantizedMatrix, lanes: int = 0, split: bool = False) -> Int8Matrix:
        """lanes: 8 or 16; 0, this CPU's kernels' (LANES). split: the int16
        precision's products."""
        if w.type_name not in TYPES:
            raise ValueError(f"no int8 kernel for {w.type_name}")
        n_out, n_in = w.shape
        raw = w.to_gguf_bytes().reshape(n_out, n_in // BLOCK, -1)
        d = raw[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
        if w.type_name == "Q4_1":
            m = raw[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
            nibbles = raw[:, :, 4:20]  # byte j: element j (low nibble), element j + 16 (high)
            ints = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2)
        else:
            m = None
            ints = raw[:, :, 2:34].view(np.int8)
        return cls.from_blocks(w.type_name, w.shape, ints, d, m, lanes, split)

    @classmethod
    def from_blocks(
        cls,
        type_name: str,
        shape: tuple[int, int],
        ints: np.ndarray,
        d: np.ndarray,
        m: np.ndarray | None,
        lanes: int = 0,
        split: bool = False,
    ) -> Int8Matrix:
        """ints [n_out, blocks, 32] (Q4_1: values 0..15; the others: int8), d [n_out,
        blocks] (Q8_H: [n_out, blocks, 2], a scale per half block), m [n_out, blocks]
        or None (no minimum: -0.0, which leaves every value as it is)."""
        if type_name not in FORMATS:
            raise ValueError(f"no int8 kernel for {type_name}")
        lanes = lanes or LANES
        pad = -shape[0] % lanes
        m = np.full(d.shape[:2], -0.0, np.float32) if m is None else m
        if pad:
            ints, d, m = (np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) for a in (ints, d, m))
        groups, nb = ints.shape[0] // lanes, ints.shape[1]

        def per_lane(a: np.ndarray) -> np.ndarray:  # [n_out, nb(, 2)] -> flat [groups, nb(, 2), lanes]
            a = a.reshape(groups, lanes, nb, -1).transpose(0, 2, 3, 1)
            return np.ascontiguousarray(a).reshape(-1)

        d, m = per_lane(d.astype(np.float32)), per_lane(m.astype(np.float32))
        if type_name not in _MIN:
            m = np.empty(0, np.float32)
        d, m = _narrowed(d, m)
        if type_name == "Q4_1":
            low = ints[:, :, :16].reshape(groups, lanes, nb, 4, 4).transpose(0, 2, 3, 1, 4)
            high = ints[:, :, 16:].reshape(groups, lanes, nb, 4, 4).transpose(0, 2, 3, 1, 4)
            quants = np.ascontiguousarray(low | (high << 4)).astype(np.uint8).reshape(-1)
            return cls(type_name, tuple(shape), quants, d, m, np.empty(0, np.int32), lanes, split)
        ints = ints.astype(np.int8)
        quants = np.ascontiguousarray(ints.reshape(groups, lanes, nb, 8, 4).transpose(0, 2, 3, 1, 4)).reshape(-1)
        parts = 2 if type_name == "Q8_H" else 1
        sums = per_lane(
            (128 * ints.astype(np.int32).reshape(-1, nb, parts, BLOCK // parts).sum(axis=3)).astype(np.int32)
        )
        return cls(type_name, tuple(shape), quants, d, m, sums, lanes, split)

    @property
    def n_padded(self) -> int:
        return -(-self.shape[0] // self.lanes) * self.lanes

    @property
    def nbytes(self) -> int:
        return self.quants.nbytes + self.d.nbytes + self.m.nbytes + self.sums.nbytes

    def integers(self) -> np.ndarray:
        """The weights' integers [n_out, blocks, 32]: nibble values (uint8) or int8."""
        lanes = self.lanes
        groups, nb = self.n_padded // lanes, self.shape[1] // BLOCK
        if self.type_name == "Q4_1":
            packed = self.quants.reshape(groups, nb, 4, lanes, 4).transpose(0, 3, 1, 2, 4).reshape(-1, nb, 16)
            ints = np.concatenate([packed & 0x0F, packed >> 4], axis=2)
        else:
            ints = self.quants.reshape(groups, nb, 8, lanes, 4).transpose(0, 3, 1, 2, 4).reshape(-1, nb, 32)
        return ints[: self.shape[0]]

    def block_scales(self, which: str = "d") -> np.ndarray:
        """d (or m) per output and block, [n_out, blocks]; Q8_H's d [n_out, blocks, 2]."""
        lanes = self.lanes
        groups, nb = self.n_padded // lanes, self.shape[1] // BLOCK
        a = widened(getattr(self, which))
        a = a.reshape(groups, nb, -1, lanes).transpose(0, 3, 1, 2).reshape(groups * lanes, nb, -1)
        a = a[: self.shape[0]]
        return a if a.shape[2] == 2 else a[:, :, 0]

    def dequantize(self) -> np.ndarray:
        """float32 [n_out, n_in], gguf's values (d * q + m, q * d), bit for bit."""
        m = self.block_scales("m") if self.type_name in _MIN else None
        return gguf_blocks.values(self.type_name, self.integers(), self.block_scales("d"), m).reshape(self.shape)

    def rows(self, ids) -> np.ndarray:
        """Dequantized rows [len(ids), n_in] (an embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return self.select_rows(ids % self.shape[0]).dequantize()

    def select_rows(self, ids) -> Int8Matrix:
        """The matrix of rows `ids` only: a product with it gives the bits that the
        same rows give in a product with the whole matrix."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not ids.size or ids.min() < 0 or ids.max() >= self.shape[0]:
            raise IndexError(f"row ids out of range for a matrix of {self.shape[0]} rows")
        m = self.block_scales("m")[ids] if self.type_name in _MIN else None
        return self.from_blocks(
            self.type_name,
            (ids.size, self.shape[1]),
            self.integers()[ids],
            self.block_scales("d")[ids],
            m,
            self.lanes,
            self.split,
        )


def _narrowed(d: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d and m (float32) as float16 bits when each of them is a float16, else as
    they are: both in one dtype, so a format's kernel has two variants, not four."""
    halves = d.astype(np.float16), m.astype(np.float16)
    if all(np.array_equal(h.astype(np.float32), a, equal_nan=True) for h, a in zip(halves, (d, m))):
        return halves[0].view(np.uint16), halves[1].view(np.uint16)
    return d, m


def widened(scales: np.ndarray) -> np.ndarray:
    """Block scales as float32, from the float16 bits they may be held as."""
    return scales.view(np.float16).astype(np.float32) if scales.dtype == np.uint16 else scales


# The largest integer an activation is rounded to: 127 (int8), or 127 * 128 (int16,
# as two int8 halves: q = 128 high + low, high in [-127, 127], low in [-64, 63]).
LEVELS, SPLIT_LEVELS = 127, 16256


@njit("void(float32[:, ::1], int32[::1], float32[::1], float32[::1], float32)", cache=True, nogil=True)
def _quantize_portable(x, q, d, s, levels):  # pragma: no cover - compiled
    """quantize_rows without vector instructions, q whole (the tests' reference)."""
    n, n_in = x.shape
    nb = n_in // BLOCK
    for r in range(n):
        for b in range(nb):
            largest = np.float32(0.0)
            for j in range(BLOCK):
                largest = max(largest, abs(x[r, b * BLOCK + j]))
            scale = levels / largest if largest > 0 else np.float32(0.0)
            total = 0
            for j in range(BLOCK):
                v = np.int32(np.rint(x[r, b * BLOCK + j] * scale))
                q[r * n_in + b * BLOCK + j] = v
                total += v
            d[r * nb + b] = largest / levels
            s[r * nb + b] = np.float32(total) * (largest / levels)


if AVAILABLE:

    @njit(inline="always")
    def _store_split(high, low, i, q):  # pragma: no cover - compiled
        h = vec.high7(q)
        vec.store_i8(high, i, h)
        vec.store_i8(low, i, vec.low7(q, h))

    @njit("void(float32[:, ::1], int8[::1], int8[::1], float32[::1], float32[::1], boolean)", cache=True, nogil=True)
    def quantize_rows(x, q, low, d, s, split):  # pragma: no cover - compiled
        """Each row of x [n, n_in], per block of 32: q = rint(x * L / max|x|), with L
        = LEVELS, or SPLIT_LEVELS with split (q's high half into q, its low half into
        low); d = max|x| / L and s = d * sum(q) into d, s [n * n_in / 32].
        |x * L / max|x|| <= L up to one rounding, which rint brings back to L."""
        n, n_in = x.shape
        nb = n_in // BLOCK
        flat = x.reshape(-1)
        levels = np.float32(SPLIT_LEVELS if split else LEVELS)
        for r in range(n):
            for b in range(nb):
                i = r * n_in + b * BLOCK
                v0 = vec.load_f32(flat, i)
                v1 = vec.load_f32(flat, i + 8)
                v2 = vec.load_f32(flat, i + 16)
                v3 = vec.load_f32(flat, i + 24)
                largest = vec.largest_lane(
                    vec.max_abs(vec.max_abs(vec.max_abs(vec.max_abs(vec.zeros_f32(), v0), v1), v2), v3)
                )
                scale = vec.splat_f32(levels / largest if largest > 0 else np.float32(0.0))
                q0 = vec.round_scaled(v0, scale)
                q1 = vec.round_scaled(v1, scale)
                q2 = vec.round_scaled(v2, scale)
                q3 = vec.round_scaled(v3, scale)
                if split:
                    _store_split(q, low, i, q0)
                    _store_split(q, low, i + 8, q1)
                    _store_split(q, low, i + 16, q2)
                    _store_split(q, low, i + 24, q3)
                else:
                    vec.store_i8(q, i, q0)
                    vec.store_i8(q, i + 8, q1)
                    vec.store_i8(q, i + 16, q2)
                    vec.store_i8(q, i + 24, q3)
                step = largest / levels
                d[r * nb + b] = step
                s[r * nb + b] = np.float32(vec.lane_sum(q0, q1, q2, q3)) * step

    @njit(nogil=True, cache=True)
    def quantized_buffers(n, n_in, split):  # pragma: no cover - compiled
        """Empty (q, low, d, s) for n rows of n_in activations (quantize_rows)."""
        q = np.empty(n * n_in, dtype=np.int8)
        low = np.empty(n * n_in if split else 0, dtype=np.int8)
        xd = np.empty(n * (n_in // BLOCK), dtype=np.float32)
        xs = np.empty(n * (n_in // BLOCK), dtype=np.float32)
        return q, low, xd, xs

    @njit(inline="always")
    def chunk_rows(c, n, n_chunks):  # pragma: no cover - compiled
        """Rows lo..hi of chunk c of n rows in n_chunks."""
        return c * n // n_chunks, (c + 1) * n // n_chunks

    @njit(inline="always")
    def quantize_chunk(x, qx, lo, hi, n_in, split):  # pragma: no cover - compiled
        """quantize_rows of x, rows lo..hi of a whole (x's own rows), into those rows'
        places in the whole's buffers qx (an empty `low`, not split, stays empty)."""
        q, low, xd, xs = qx
        nb = n_in // BLOCK
        quantize_rows(
            x, q[lo * n_in : hi * n_in], low[lo * n_in : hi * n_in], xd[lo * nb : hi * nb], xs[lo * nb : hi * nb], split
        )

    # From this many rows, the activations are quantized by every thread (a chunk of
    # rows each) and not by one while the other waits: each row's bits are quantize_rows'
    # whichever thread computes it. Quantizing, RMSNorm and SwiGLU's gate took about
    # 2.4 ms of a 35 ms decode round of 32 requests on one thread (a Zen 4). 8 is a
    # guess, not a measured threshold: below it the serial work is a few tens of
    # microseconds a forward, near what waking the threads costs.
    PARALLEL_ROWS = 8

    @njit(parallel=True, nogil=True, cache=True)
    def _quantize_parallel(x, qx, split, n_chunks):  # pragma: no cover - compiled
        n, n_in = x.shape
        for c in prange(n_chunks):
            lo, hi = chunk_rows(c, n, n_chunks)
            quantize_chunk(x[lo:hi], qx, lo, hi, n_in, split)

    @njit(nogil=True, cache=True)
    def quantized(x, split, n_threads):  # pragma: no cover - compiled
        """x [n, n_in] quantized (quantize_rows) into new buffers (q, low, d, s), by
        every thread from PARALLEL_ROWS rows."""
        n, n_in = x.shape
        qx = quantized_buffers(n, n_in, split)
        if n >= PARALLEL_ROWS and n_threads > 1:
            _quantize_parallel(x, qx, split, n_threads)
        else:
            quantize_rows(x, qx[0], qx[1], qx[2], qx[3], split)
        return qx

    @njit(nogil=True, cache=True)
    def product_q4_1(x, quants, d, m, n_out, n_threads, split):  # pragma: no cover - compiled
        """x [n, n_in] float32 -> x @ w.T [n, n_out] for a Q4_1 Int8Matrix's arrays,
        from inside numba too (the layer stack)."""
        n, n_in = x.shape
        return product_q4_1_of(quantized(x, split, n_threads), n, n_in, quants, d, m, n_out, n_threads, split)

    @njit(nogil=True, cache=True)
    def product_q4_1_of(qx, n, n_in, quants, d, m, n_out, n_threads, split):  # pragma: no cover - compiled
        """product_q4_1 of activations quantized already: qx = (q, low, d, s) of n rows
        of n_in (quantize_rows)."""
        q, low, xd, xs = qx
        out = np.empty((n, n_out), dtype=np.float32)
        flat, nb = out.reshape(-1), n_in // BLOCK
        if split:
            _drive_q4_1s(quants, d, m, q, low, xd, xs, flat, n, nb, n_in, n_out, n_threads)
        else:
            _drive_q4_1(quants, d, m, q, xd, xs, flat, n, nb, n_in, n_out, n_threads)
        return out

    @njit(inline="always")
    def _shifted(q, low):  # pragma: no cover - compiled
        """The activations as the 512-bit VNNI kernels read them: x + 128 as unsigned
        bytes (int8_codegen)."""
        if _512:
            return (q.view(np.uint8) ^ np.uint8(0x80)).view(np.int8), (low.view(np.uint8) ^ np.uint8(0x80)).view(
                np.int8
            )
        return q, low

    @njit(nogil=True, cache=True)
    def _whole(high, low):  # pragma: no cover - compiled
        """A split activation's halves put back together: 128 high + low as int16."""
        q = np.empty(high.size, dtype=np.int16)
        for i in range(high.size):
            q[i] = np.int16(high[i]) * np.int16(128) + np.int16(low[i])
        return q

    @njit(nogil=True, cache=True)
    def product_q8_0(x, quants, d, sums, n_out, n_threads, split):  # pragma: no cover - compiled
        n, n_in = x.shape
        q, low, xd, _ = quantized(x, split, n_threads)
        out = np.empty((n, n_out), dtype=np.float32)
        flat, nb = out.reshape(-1), n_in // BLOCK
        if TILES and n >= TILE_ROWS:  # tiles multiply signed bytes: not shifted
            _tiles_q8_0(quants, d, q, low, xd, flat, n, nb, n_in, n_out, n_threads, split)
            return out
        q, low = _shifted(q, low)
        if split and _VNNI:
            _drive_q8_0vs(quants, d, sums, q, low, xd, flat, n, nb, n_in, n_out, n_threads)
        elif split:
            _drive_q8_0i(quants, d, _whole(q, low), xd, flat, n, nb, n_in, n_out, n_threads)
        elif _VNNI:
            _drive_q8_0v(quants, d, sums, q, xd, flat, n, nb, n_in, n_out, n_threads)
        else:
            _drive_q8_0(quants, d, q, xd, flat, n, nb, n_in, n_out, n_threads)
        return out

    @njit(nogil=True, cache=True)
    def product_q8_mh(x, quants, d, m, sums, n_out, n_threads, split, halves):  # pragma: no cover - compiled
        """x @ w.T for a Q8_M Int8Matrix's arrays, or with halves a Q8_H one's."""
        n, n_in = x.shape
        q, low, xd, xs = quantized(x, split, n_threads)
        out = np.empty((n, n_out), dtype=np.float32)
        flat, nb = out.reshape(-1), n_in // BLOCK
        q, low = _shifted(q, low)
        if split and _VNNI:
            if halves:
                _drive_q8_hvs(quants, d, m, sums, q, low, xd, xs, flat, n, nb, n_in, n_out, n_threads)
            else:
                _drive_q8_mvs(quants, d, m, sums, q, low, xd, xs, flat, n, nb, n_in, n_out, n_threads)
        elif split:
            if halves:
                _drive_q8_hi(quants, d, m, _whole(q, low), xd, xs, flat, n, nb, n_in, n_out, n_threads)
            else:
                _drive_q8_mi(quants, d, m, _whole(q, low), xd, xs, flat, n, nb, n_in, n_out, n_threads)
        elif _VNNI:
            if halves:
                _drive_q8_hv(quants, d, m, sums, q, xd, xs, flat, n, nb, n_in, n_out, n_threads)
            else:
                _drive_q8_mv(quants, d, m, sums, q, xd, xs, flat, n, nb, n_in, n_out, n_threads)
        else:
            if halves:
                _drive_q8_h(quants, d, m, q, xd, xs, flat, n, nb, n_in, n_out, n_threads)
            else:
                _drive_q8_m(quants, d, m, q, xd, xs, flat, n, nb, n_in, n_out, n_threads)
        return out

    @njit(nogil=True, cache=True)
    def product(x, code, quants, d, m, sums, n_out, n_threads, split):  # pragma: no cover - compiled
        """x @ w.T for an Int8Matrix of format FORMATS[code] given by its arrays
        (quants as bytes), from inside numba (the layer stack)."""
        if code == 0:
            return product_q4_1(x, quants, d, m, n_out, n_threads, split)
        if code == 1:
            return product_q8_0(x, quants.view(np.int8), d, sums, n_out, n_threads, split)
        return product_q8_mh(x, quants.view(np.int8), d, m, sums, n_out, n_threads, split, code == 3)


def int8_matmul_t(x: np.ndarray, w: Int8Matrix) -> np.ndarray:
    """x [n, n_in] -> about x @ w.dequantize().T, float32 [n, n_out]; a row's result
    is bitwise independent of the other rows."""
    require()
    if w.lanes != LANES:
        raise ValueError(f"a matrix laid out for {w.lanes} lanes; this CPU's kernels take {LANES}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_out, n_in = w.shape
    if x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"activations of shape {x.shape} do not fit a {w.shape} matrix")
    threads = config.NUMBA_NUM_THREADS
    if w.type_name == "Q4_1":
        out = product_q4_1(x, w.quants, w.d, w.m, w.n_padded, threads, w.split)
    elif w.type_name == "Q8_0":
        out = product_q8_0(x, w.quants, w.d, w.sums, w.n_padded, threads, w.split)
    else:
        out = product_q8_mh(x, w.quants, w.d, w.m, w.sums, w.n_padded, threads, w.split, w.type_name == "Q8_H")
    return out if w.n_padded == n_out else np.ascontiguousarray(out[:, :n_out])


def quantize_reference(x: np.ndarray, split: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activation quantization in numpy: (q [n, n_in] int32, whole, d [n, blocks],
    s [n, blocks])."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, n_in = x.shape
    q = np.empty(n * n_in, np.int32)
    d = np.empty(n * (n_in // BLOCK), np.float32)
    s = np.empty_like(d)
    _quantize_portable(x, q, d, s, np.float32(SPLIT_LEVELS if split else LEVELS))
    return q.reshape(n, n_in), d.reshape(n, -1), s.reshape(n, -1)


def int8_matmul_t_reference(x: np.ndarray, w: Int8Matrix) -> np.ndarray:
    """The same arithmetic in numpy (slow; the tests' reference): exact integer block
    sums, rounded to float32 as the kernels' conversion does (exact below 2**24, which
    only int16's Q8_0 sums exceed), then per block the float epilogue in the same
    order, each step rounded once as a fused multiply-add is (float64 holds the
    product exactly; then one rounding)."""
    q, xd, xs = quantize_reference(x, w.split)
    nb, parts = w.shape[1] // BLOCK, 2 if w.type_name == "Q8_H" else 1
    sums = np.einsum(
        "rbkj,obkj->rbko",
        q.reshape(-1, nb, parts, BLOCK // parts).astype(np.int64),
        w.integers().reshape(-1, nb, parts, BLOCK // parts).astype(np.int64),
    )
    sums = sums.astype(np.float32).astype(np.float64)
    d = w.block_scales("d").reshape(w.shape[0], nb, parts).transpose(1, 2, 0)  # [nb, parts, n_out]
    m = w.block_scales("m").T if w.type_name in _MIN else None
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for b in range(nb):
        for k in range(parts):
            scale = d[b, k][None, :] * xd[:, b : b + 1]  # float32 * float32: one rounding
            acc = (sums[:, b, k, :] * scale + acc).astype(np.float32)
        if m is not None:
            acc = (m[b][None, :].astype(np.float64) * xs[:, b : b + 1] + acc).astype(np.float32)
    return acc

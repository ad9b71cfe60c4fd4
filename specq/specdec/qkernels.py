"""Matrix products computed from GGUF's quantized blocks (Q4_1, Q8_0), not float32 copies.

A decode step streams every weight once, so it is bound by memory bandwidth: a float32
weight is 4 bytes, a Q4_1 weight 0.625 (a block of 32 is fp16 d, fp16 m and 16 bytes
of nibbles; value = d * q + m) and a Q8_0 weight 1.0625 (fp16 d and 32 int8; value =
d * q). Computing from the blocks moves 4 to 6 times fewer bytes.

Layout. GGUF keeps each output row's blocks together, which suits one dot product per
output; but numba (LLVM) vectorizes only the 16-byte loop inside a block and pays a
horizontal sum per block, which made a first kernel over that layout slower than the
float32 one. Here the vector lanes are *outputs*: `from_gguf_bytes` cuts the rows into
chunks of LANES outputs and stores, for every block and byte position, the chunk's
bytes side by side:

    quants[chunk, block, byte, lane]    Q4_1: uint8, byte j holds element j (low nibble)
                                        and element j + 16 (high nibble); Q8_0: int8
    scales[chunk, block, k, lane]       fp16 bits (uint16): k = 0 is d, k = 1 is m (Q4_1)

The innermost loop then runs over a chunk's outputs with the activations as scalars:
elementwise arithmetic that LLVM vectorizes, no horizontal sums, no shuffles.

Arithmetic, per lane, block and activation row x:
    Q8_0:  s = sum_j q_j * x_j                   out = out + d * s
    Q4_1:  s = sum_j f_j * x_j, f = 1 + q/16     out = out + 16d * s + (m - 16d) * sum(x)
sequentially over the block's weights. A nibble q becomes f = 1 + q/16 by writing it
into the top of a float's mantissa (f's bits are 0x3F800000 | q << 19): integer
operations instead of an int-to-float conversion, which at one activation row made
the kernel bound by the conversion port rather than by memory (the products of a
forward 1.2x faster at one row, 1.07x at five, on the 2-core AMD EPYC). f is exact
and d q + m = 16d f + (m - 16d); the sum of f x is larger than the sum of q x would
be, but the measured error is unchanged (1e-6 of the largest output). The weights of
a chunk (tens of KB) are read from memory once and stay in L1/L2 while groups of up
to five activation rows pass over them.

Bitwise row invariance. A row's results do not depend on the other rows of the call
(so plain decoding and verification compute identical logits, and so does a prefill):
each lane performs the same operations, in the same order, for a row whatever its
group. This holds because the kernels are compiled without 'reassoc' and 'nsz'
(_FASTMATH) and every addition adds one product to a sum (one way to fuse it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import config, njit, prange, types
from numba.extending import intrinsic

LANES = 96  # outputs per chunk: 6 vectors of 16 floats; 576, 960, 3072 and 49152 are multiples
GROUP = 5  # activation rows per pass over a chunk's weights (a verification of 4 drafts + 1)
BLOCK = 32  # weights per quantization block, Q4_1 and Q8_0
TYPES = ("Q4_1", "Q8_0")
_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
_N_SCALES = {"Q4_1": 2, "Q8_0": 1}

# 'reassoc' would let LLVM reorder a lane's sums, and 'nsz' folds 0 + a * b into a * b,
# after which a * b + c * d may fuse either product depending on the surrounding code:
# both would break bitwise row invariance. 'contract' stays: a sum plus one product
# fuses into a multiply-add in exactly one way.
_FASTMATH = {"nnan", "ninf", "contract"}


@intrinsic
def _f16(typingctx, bits):  # pragma: no cover - compiled
    """fp16 bits (uint16) -> float32, exact (vcvtph2ps)."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _wide_vectors(typingctx):  # pragma: no cover - compiled
    """Let LLVM vectorize the calling function with 512-bit vectors where the CPU has
    them. Its default on recent Intel cores is 256 bits, a whole-program guess against
    the clock penalty of wide vectors on older ones; these loops are nothing but vector
    arithmetic and run 20 to 30% faster with 512 (measured). No effect without
    AVX-512; if llvmlite ever refuses the attribute, nothing happens either."""

    def codegen(context, builder, signature, args):
        try:  # a string attribute: llvmlite's add() knows only the enumerated ones
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        except Exception:  # noqa: BLE001 - a missed optimization, not an error
            pass
        return context.get_dummy_value()

    return types.void(), codegen


@dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """A Q4_1 or Q8_0 weight matrix [n_out, n_in], repacked for `qmatmul_t`.

    Its values are gguf's: `dequantize()` equals gguf.quants.dequantize of the bytes
    it was built from, bit for bit. The last chunk is padded with zero blocks; products
    and lookups never return the padding."""

    type_name: str  # "Q4_1" or "Q8_0"
    shape: tuple[int, int]  # (n_out, n_in)
    quants: np.ndarray  # [n_chunks, n_blocks, 16 | 32, LANES] uint8 (Q4_1) or int8 (Q8_0)
    scales: np.ndarray  # [n_chunks, n_blocks, 2 | 1, LANES] uint16: fp16 d (and m)

    @classmethod
    def from_gguf_bytes(cls, raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> QuantizedMatrix:
        """raw: a GGUF tensor's data, uint8 [n_out, bytes per row]; shape: (n_out, n_in)
        in numpy order."""
        if type_name not in TYPES:
            raise ValueError(f"unsupported quantization type {type_name!r} (supported: {', '.join(TYPES)})")
        n_out, n_in = (int(s) for s in shape)
        if n_out <= 0 or n_in <= 0 or n_in % BLOCK:
            raise ValueError(f"shape {tuple(shape)} is not (n_out, a multiple of {BLOCK})")
        n_blocks, block_bytes = n_in // BLOCK, _BLOCK_BYTES[type_name]
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.size != n_out * n_blocks * block_bytes:
            raise ValueError(f"{type_name} data of dtype {raw.dtype} and shape {raw.shape} is not a {shape} matrix")
        blocks = np.ascontiguousarray(raw).reshape(n_out, n_blocks, block_bytes)
        k = _N_SCALES[type_name]
        scales = blocks[:, :, : 2 * k].copy().view(np.uint16)  # [n_out, n_blocks, k]
        quants = blocks[:, :, 2 * k :]  # [n_out, n_blocks, 16 | 32]
        if type_name == "Q8_0":
            quants = quants.view(np.int8)
        return cls._from_rows(type_name, (n_out, n_in), quants, scales)

    @classmethod
    def concat(cls, parts: list[QuantizedMatrix]) -> QuantizedMatrix:
        """The parts' rows stacked in order (fusing q|k|v or gate|up into one product)."""
        if not parts:
            raise ValueError("nothing to concatenate")
        first = parts[0]
        for p in parts[1:]:
            if p.type_name != first.type_name or p.shape[1] != first.shape[1]:
                raise ValueError(
                    f"cannot stack a {p.type_name} {p.shape} matrix under a {first.type_name} {first.shape} one"
                )
        rows = [p._rows_layout() for p in parts]
        return cls._from_rows(
            first.type_name,
            (sum(p.shape[0] for p in parts), first.shape[1]),
            np.concatenate([q for q, _ in rows]),
            np.concatenate([s for _, s in rows]),
        )

    @property
    def nbytes(self) -> int:
        return self.quants.nbytes + self.scales.nbytes

    def dequantize(self) -> np.ndarray:
        """float32 [n_out, n_in], equal to gguf.quants.dequantize of the original bytes."""
        return self.rows(np.arange(self.shape[0]))

    def dequantize_t(self) -> np.ndarray:
        """The transpose of dequantize(), float32 [n_in, n_out] with the same bits, on
        the calling thread. This is the layout the lanes already have: a chunk's
        outputs for one input sit side by side, so it is written in contiguous runs,
        3 times faster than dequantize(); and BLAS multiplies by it faster than by
        dequantize().T (1.5x faster for a 109-row product with the 3072x576 gate|up)."""
        n_out, n_in = self.shape
        out = np.empty((n_in, self.quants.shape[0] * LANES), dtype=np.float32)
        (_q4_1_columns if self.type_name == "Q4_1" else _q8_0_columns)(self.quants, self.scales, out)
        return out if out.shape[1] == n_out else out[:, :n_out]

    def rows(self, ids) -> np.ndarray:
        """Dequantized rows, float32 [len(ids), n_in] (an embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n_out, n_in = self.shape
        if ids.size and (ids.min() < -n_out or ids.max() >= n_out):
            raise IndexError(f"row ids out of range for a matrix of {n_out} rows")
        out = np.empty((ids.size, n_in), dtype=np.float32)
        lookup = _q4_1_rows if self.type_name == "Q4_1" else _q8_0_rows
        lookup(self.quants, self.scales, ids % n_out, out)
        return out

    def to_gguf_bytes(self) -> np.ndarray:
        """The inverse of from_gguf_bytes: uint8 [n_out, bytes per row], gguf's blocks."""
        quants, scales = self._rows_layout()
        blocks = np.concatenate(
            [np.ascontiguousarray(scales).view(np.uint8), np.ascontiguousarray(quants).view(np.uint8)], axis=2
        )
        return np.ascontiguousarray(blocks.reshape(self.shape[0], -1))

    def select_rows(self, ids) -> QuantizedMatrix:
        """The matrix of rows `ids` only, still quantized: a product with it gives the
        bits that the same rows give in a product with the whole matrix."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not ids.size or ids.min() < 0 or ids.max() >= self.shape[0]:
            raise IndexError(f"row ids out of range for a matrix of {self.shape[0]} rows")
        quants, scales = self._rows_layout()
        return self._from_rows(self.type_name, (ids.size, self.shape[1]), quants[ids], scales[ids])

    @classmethod
    def _from_rows(
        cls, type_name: str, shape: tuple[int, int], quants: np.ndarray, scales: np.ndarray
    ) -> QuantizedMatrix:
        """From gguf's row-major blocks: quants [n_out, n_blocks, bytes], scales [n_out, n_blocks, k]."""
        n_chunks = -(-shape[0] // LANES)
        pad = n_chunks * LANES - shape[0]
        if pad:  # zero blocks (d = m = 0: every value 0) complete the last chunk
            quants = np.concatenate([quants, np.zeros((pad, *quants.shape[1:]), quants.dtype)])
            scales = np.concatenate([scales, np.zeros((pad, *scales.shape[1:]), scales.dtype)])

        def lanes_last(a: np.ndarray) -> np.ndarray:  # [rows, ...] -> [chunk, ..., lane]
            return np.ascontiguousarray(a.reshape(n_chunks, LANES, *a.shape[1:]).transpose(0, 2, 3, 1))

        return cls(type_name, shape, lanes_last(quants), lanes_last(scales))

    def _rows_layout(self) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of _from_rows: (quants, scales) row-major, without the padding."""

        def rows_first(a: np.ndarray) -> np.ndarray:
            a = a.transpose(0, 3, 1, 2)
            return a.reshape(-1, *a.shape[2:])[: self.shape[0]]

        return rows_first(self.quants), rows_first(self.scales)


def qmatmul_t(x: np.ndarray, w: QuantizedMatrix) -> np.ndarray:
    """x [n, n_in] -> x @ w.dequantize().T, float32 [n, n_out], for any n.

    A row's result is bitwise independent of the other rows in the call."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_out, n_in = w.shape
    if x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"activations of shape {x.shape} do not fit a {w.shape} matrix")
    out = np.empty((x.shape[0], w.quants.shape[0] * LANES), dtype=np.float32)
    # One slice of chunks per thread of numba's pool; with fewer active threads (after
    # numba.set_num_threads) the slices are shared out among them.
    product = q4_1_product if w.type_name == "Q4_1" else q8_0_product
    product(x, w.quants, w.scales, out, config.NUMBA_NUM_THREADS)
    return out if out.shape[1] == n_out else np.ascontiguousarray(out[:, :n_out])


# Explicit signatures: compiled at import, and only once per install (cache=True keeps
# the machine code beside this file).
_Q4_1 = "uint8[:, :, :, ::1], uint16[:, :, :, ::1]"
_Q8_0 = "int8[:, :, :, ::1], uint16[:, :, :, ::1]"
_PRODUCT = "void(float32[:, ::1], {}, float32[:, ::1], int64)"
_ROWS = "void({}, int64[::1], float32[:, ::1])"
_COLUMNS = "void({}, float32[:, ::1])"


# Dequantization in gguf's float32 arithmetic, (d * q) + m and q * d, compiled without
# fastmath: nothing fuses into a multiply-add, so the bits are gguf's.
@njit(_ROWS.format(_Q4_1), parallel=True, cache=True, nogil=True)
def _q4_1_rows(quants, scales, ids, out):  # pragma: no cover - compiled
    for i in prange(ids.shape[0]):
        c, lane = ids[i] // LANES, ids[i] % LANES
        for b in range(quants.shape[1]):
            d = _f16(scales[c, b, 0, lane])
            m = _f16(scales[c, b, 1, lane])
            for j in range(16):
                v = quants[c, b, j, lane]
                out[i, b * BLOCK + j] = d * np.float32(v & 0x0F) + m
                out[i, b * BLOCK + 16 + j] = d * np.float32(v >> 4) + m


@njit(_ROWS.format(_Q8_0), parallel=True, cache=True, nogil=True)
def _q8_0_rows(quants, scales, ids, out):  # pragma: no cover - compiled
    for i in prange(ids.shape[0]):
        c, lane = ids[i] // LANES, ids[i] % LANES
        for b in range(quants.shape[1]):
            d = _f16(scales[c, b, 0, lane])
            for j in range(BLOCK):
                out[i, b * BLOCK + j] = np.float32(quants[c, b, j, lane]) * d


# The same arithmetic into the transposed layout, serially: these run between BLAS
# products, and waking numba's threads there sets them spinning against OpenBLAS's.
@njit(_COLUMNS.format(_Q4_1), cache=True, nogil=True)
def _q4_1_columns(quants, scales, out):  # pragma: no cover - compiled
    d = np.empty(LANES, dtype=np.float32)
    m = np.empty(LANES, dtype=np.float32)
    for c in range(quants.shape[0]):
        first = c * LANES
        for b in range(quants.shape[1]):
            for o in range(LANES):
                d[o] = _f16(scales[c, b, 0, o])
                m[o] = _f16(scales[c, b, 1, o])
            for j in range(16):
                low, high = out[b * BLOCK + j], out[b * BLOCK + 16 + j]
                for o in range(LANES):
                    v = quants[c, b, j, o]
                    low[first + o] = d[o] * np.float32(v & 0x0F) + m[o]
                    high[first + o] = d[o] * np.float32(v >> 4) + m[o]


@njit(_COLUMNS.format(_Q8_0), cache=True, nogil=True)
def _q8_0_columns(quants, scales, out):  # pragma: no cover - compiled
    d = np.empty(LANES, dtype=np.float32)
    for c in range(quants.shape[0]):
        first = c * LANES
        for b in range(quants.shape[1]):
            for o in range(LANES):
                d[o] = _f16(scales[c, b, 0, o])
            for j in range(BLOCK):
                column = out[b * BLOCK + j]
                for o in range(LANES):
                    column[first + o] = np.float32(quants[c, b, j, o]) * d[o]


@njit(inline="always")
def _fma4(s, i, w, k):  # pragma: no cover - compiled
    """s[i] += w[0] k[0] + w[1] k[1] + w[2] k[2] + w[3] k[3], one term at a time."""
    t = s[i]
    t += w[0] * k[0]
    t += w[1] * k[1]
    t += w[2] * k[2]
    t += w[3] * k[3]
    s[i] = t


_ONE_BITS = np.uint32(0x3F800000)  # 1.0f
_NIBBLE_BITS = np.uint32(0x00780000)  # the top four bits of a float32's mantissa


@njit(inline="always")
def _nibble_float(bits):  # pragma: no cover - compiled
    """1 + q/16 for a nibble q already shifted onto _NIBBLE_BITS (other bits ignored)."""
    return np.uint32((bits & _NIBBLE_BITS) | _ONE_BITS).view(np.float32)


@njit(inline="always")
def _q4_1_weights(qa, qb, o):  # pragma: no cover - compiled
    """Lane o of two Q4_1 bytes: 1 + q/16 for the low and the high nibble of each."""
    va, vb = np.uint32(qa[o]), np.uint32(qb[o])
    return (
        _nibble_float(va << np.uint32(19)),
        _nibble_float(va << np.uint32(15)),
        _nibble_float(vb << np.uint32(19)),
        _nibble_float(vb << np.uint32(15)),
    )


@njit(inline="always")
def _q4_1_coefs(x, r, i):  # pragma: no cover - compiled
    """Row r's activations for bytes i and i + 1 (of the whole row), in
    _q4_1_weights's order: a block's byte j holds its elements j and j + 16."""
    return x[r, i], x[r, i + 16], x[r, i + 1], x[r, i + 17]


@njit(inline="always")
def _q4_1_sums(q, x, b, r, g, s):  # pragma: no cover - compiled
    """s[k * LANES + o] += sum over block b's weights of (1 + q/16) * x[r + k], for the
    g <= GROUP rows r..: q is the block's [16, LANES] bytes; two bytes per pass over s.
    One loop per group size: LLVM vectorizes over the lanes only when the rows are
    fixed."""
    for j in range(0, 16, 2):
        qa, qb = q[j], q[j + 1]
        i = b * BLOCK + j
        k0 = _q4_1_coefs(x, r, i)
        if g == 1:
            for o in range(LANES):
                w = _q4_1_weights(qa, qb, o)
                _fma4(s, o, w, k0)
            continue
        k1 = _q4_1_coefs(x, r + 1, i)
        if g == 2:
            for o in range(LANES):
                w = _q4_1_weights(qa, qb, o)
                _fma4(s, o, w, k0)
                _fma4(s, LANES + o, w, k1)
            continue
        k2 = _q4_1_coefs(x, r + 2, i)
        if g == 3:
            for o in range(LANES):
                w = _q4_1_weights(qa, qb, o)
                _fma4(s, o, w, k0)
                _fma4(s, LANES + o, w, k1)
                _fma4(s, 2 * LANES + o, w, k2)
            continue
        k3 = _q4_1_coefs(x, r + 3, i)
        if g == 4:
            for o in range(LANES):
                w = _q4_1_weights(qa, qb, o)
                _fma4(s, o, w, k0)
                _fma4(s, LANES + o, w, k1)
                _fma4(s, 2 * LANES + o, w, k2)
                _fma4(s, 3 * LANES + o, w, k3)
            continue
        k4 = _q4_1_coefs(x, r + 4, i)
        for o in range(LANES):
            w = _q4_1_weights(qa, qb, o)
            _fma4(s, o, w, k0)
            _fma4(s, LANES + o, w, k1)
            _fma4(s, 2 * LANES + o, w, k2)
            _fma4(s, 3 * LANES + o, w, k3)
            _fma4(s, 4 * LANES + o, w, k4)


@njit(_PRODUCT.format(_Q4_1), parallel=True, fastmath=_FASTMATH, cache=True, nogil=True)
def q4_1_product(x, quants, scales, out, n_slices):  # pragma: no cover - compiled
    n = x.shape[0]
    n_chunks, n_blocks = quants.shape[0], quants.shape[1]
    x_sum = np.empty((n_blocks, n), dtype=np.float32)  # per block and row, for m - 16d
    for b in range(n_blocks):
        for r in range(n):
            total = np.float32(0.0)
            for j in range(BLOCK):
                total += x[r, b * BLOCK + j]
            x_sum[b, r] = total
    for t in prange(n_slices):
        _wide_vectors()  # the body of a prange is a function of its own
        s = np.empty(GROUP * LANES, dtype=np.float32)  # per row of the group: the block's sums
        acc = np.empty(GROUP * LANES, dtype=np.float32)  # per row of the group: the outputs
        for c in range(t * n_chunks // n_slices, (t + 1) * n_chunks // n_slices):
            for r in range(0, n, GROUP):
                g = min(GROUP, n - r)
                acc[:] = 0.0
                for b in range(n_blocks):
                    s[:] = 0.0
                    _q4_1_sums(quants[c, b], x, b, r, g, s)
                    scale = scales[c, b]
                    for k in range(g):
                        xs = x_sum[b, r + k]
                        for o in range(LANES):
                            i = k * LANES + o
                            d16 = np.float32(16.0) * _f16(scale[0, o])  # exact
                            a = acc[i] + d16 * s[i]
                            acc[i] = a + (_f16(scale[1, o]) - d16) * xs
                for k in range(g):
                    out[r + k, c * LANES : (c + 1) * LANES] = acc[k * LANES : (k + 1) * LANES]


@njit(inline="always")
def _q8_0_weights(q0, q1, q2, q3, o):  # pragma: no cover - compiled
    """Lane o of four Q8_0 bytes, as floats. (Rows of the block taken as 1-D views
    before the loop: indexing the 2-D block inside it made the head 20% slower.)"""
    return np.float32(q0[o]), np.float32(q1[o]), np.float32(q2[o]), np.float32(q3[o])


@njit(inline="always")
def _q8_0_coefs(x, r, i):  # pragma: no cover - compiled
    return x[r, i], x[r, i + 1], x[r, i + 2], x[r, i + 3]


@njit(inline="always")
def _q8_0_sums(q, x, b, r, g, s):  # pragma: no cover - compiled
    """s[k * LANES + o] += sum_j q[j, o] * x[r + k, b * BLOCK + j] for the g <= GROUP
    rows r..: q is block b's [32, LANES] int8; four bytes per pass over s."""
    for j in range(0, BLOCK, 4):
        q0, q1, q2, q3 = q[j], q[j + 1], q[j + 2], q[j + 3]
        i = b * BLOCK + j
        k0 = _q8_0_coefs(x, r, i)
        if g == 1:
            for o in range(LANES):
                w = _q8_0_weights(q0, q1, q2, q3, o)
                _fma4(s, o, w, k0)
            continue
        k1 = _q8_0_coefs(x, r + 1, i)
        if g == 2:
            for o in range(LANES):
                w = _q8_0_weights(q0, q1, q2, q3, o)
                _fma4(s, o, w, k0)
                _fma4(s, LANES + o, w, k1)
            continue
        k2 = _q8_0_coefs(x, r + 2, i)
        if g == 3:
            for o in range(LANES):
                w = _q8_0_weights(q0, q1, q2, q3, o)
                _fma4(s, o, w, k0)
                _fma4(s, LANES + o, w, k1)
                _fma4(s, 2 * LANES + o, w, k2)
            continue
        k3 = _q8_0_coefs(x, r + 3, i)
        if g == 4:
            for o in range(LANES):
                w = _q8_0_weights(q0, q1, q2, q3, o)
                _fma4(s, o, w, k0)
                _fma4(s, LANES + o, w, k1)
                _fma4(s, 2 * LANES + o, w, k2)
                _fma4(s, 3 * LANES + o, w, k3)
            continue
        k4 = _q8_0_coefs(x, r + 4, i)
        for o in range(LANES):
            w = _q8_0_weights(q0, q1, q2, q3, o)
            _fma4(s, o, w, k0)
            _fma4(s, LANES + o, w, k1)
            _fma4(s, 2 * LANES + o, w, k2)
            _fma4(s, 3 * LANES + o, w, k3)
            _fma4(s, 4 * LANES + o, w, k4)


@njit(_PRODUCT.format(_Q8_0), parallel=True, fastmath=_FASTMATH, cache=True, nogil=True)
def q8_0_product(x, quants, scales, out, n_slices):  # pragma: no cover - compiled
    n = x.shape[0]
    n_chunks, n_blocks = quants.shape[0], quants.shape[1]
    for t in prange(n_slices):
        _wide_vectors()
        s = np.empty(GROUP * LANES, dtype=np.float32)
        acc = np.empty(GROUP * LANES, dtype=np.float32)
        for c in range(t * n_chunks // n_slices, (t + 1) * n_chunks // n_slices):
            for r in range(0, n, GROUP):
                g = min(GROUP, n - r)
                acc[:] = 0.0
                for b in range(n_blocks):
                    s[:] = 0.0
                    _q8_0_sums(quants[c, b], x, b, r, g, s)
                    d = scales[c, b, 0]
                    for k in range(g):
                        for o in range(LANES):
                            acc[k * LANES + o] += _f16(d[o]) * s[k * LANES + o]
                for k in range(g):
                    out[r + k, c * LANES : (c + 1) * LANES] = acc[k * LANES : (k + 1) * LANES]

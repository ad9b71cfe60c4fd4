"""Matrix products computed from GGUF's quantized blocks (Q4_1, Q8_0), not float32 copies.

A decode step streams every weight once, so it is bound by memory bandwidth: float32
weights are 4 bytes each, a Q4_1 weight is 0.625 bytes (a block of 32 is fp16 d, fp16 m
and 16 bytes of nibbles; value = d * q + m) and a Q8_0 weight 1.0625 (fp16 d and 32
int8; value = d * q). Reading the blocks directly moves 4 to 6 times fewer bytes.

Layout. GGUF stores each output row's blocks contiguously, which suits a dot product
per output, but a dot product ends in a horizontal sum, and numba (LLVM) only
vectorizes the block's 16-byte inner loop, paying one horizontal sum per block: the
first kernel over GGUF's layout was slower than float32. Here the vector lanes are
*outputs* instead: `from_gguf_bytes` regroups the rows into chunks of LANES outputs and
stores, for each block and each byte position, the LANES outputs' bytes side by side:

    quants[chunk, block, byte, lane]    Q4_1: uint8, byte j = element j (low nibble) and
                                        element j + 16 (high nibble); Q8_0: int8, 32 bytes
    scales[chunk, block, k, lane]       fp16 bits (uint16): k = 0 is d, k = 1 is m (Q4_1)

The inner loop then runs over the LANES outputs with the activations as scalars: pure
elementwise arithmetic that LLVM vectorizes (8 or 16 lanes), with no horizontal sums
and no shuffles; each lane accumulates its own output in a fixed order.

Arithmetic. For one block and one activation row x (float32):
    s      = sum_j q_j * x_j                  per lane, sequentially over j
    out   += d * s + m * sum(x_block)         (Q8_0: out += d * s)
A Q4_1 byte v holds lo + 16 * hi, so lo * x_lo + hi * x_hi = v * x_lo + hi * (x_hi -
16 * x_lo): the kernel converts v and hi to float (never lo) and takes the adjusted
coefficient from a small per-call table: one float conversion fewer per byte.

Bitwise row invariance. A row's outputs do not depend on which other rows share the
call (plain decoding and verification then give identical logits): rows are
processed in groups of up to four, but every lane's computation for a row is the same
sequence of operations whatever the group, and the kernels are compiled without
reassociation (fastmath without 'reassoc'), so LLVM may not reorder it.

Activations are read once per group of four rows; the weights of a chunk (at most a
few tens of KB) stay in L1/L2 between groups, so n rows cost much less than n times
one row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.extending import intrinsic

LANES = 64  # outputs per chunk: the vectorized loop's length
BLOCK = 32  # weights per quantization block (Q4_1 and Q8_0)
_Q4_1_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
_Q8_0_BYTES = 34  # fp16 d, 32 int8
TYPES = ("Q4_1", "Q8_0")

# No 'reassoc': the order of each lane's additions is the order written (bitwise row
# invariance, above); 'contract' still lets a * b + c become one fused multiply-add.
_FASTMATH = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}


@intrinsic
def _f16(typingctx, bits):  # pragma: no cover - compiled
    """fp16 bits (uint16) -> float32, exactly; vectorizes to vcvtph2ps."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """A Q4_1 or Q8_0 weight matrix [n_out, n_in], repacked for `qmatmul_t`.

    Values are GGUF's own: `dequantize()` equals gguf.quants.dequantize of the bytes it
    was built from, bit for bit. Outputs are padded up to a multiple of LANES with
    zero blocks; products and lookups never return the padding.
    """

    type_name: str  # "Q4_1" or "Q8_0"
    shape: tuple[int, int]  # (n_out, n_in)
    quants: np.ndarray  # [n_chunks, n_blocks, 16 | 32, LANES] uint8 (Q4_1) | int8 (Q8_0)
    scales: np.ndarray  # [n_chunks, n_blocks, 2 | 1, LANES] uint16: fp16 d (and m)

    @classmethod
    def from_gguf_bytes(cls, raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> "QuantizedMatrix":
        """raw: a GGUF tensor's data (uint8 [n_out, bytes per row]) of type Q4_1 or
        Q8_0; shape: (n_out, n_in) in numpy order."""
        n_out, n_in = (int(s) for s in shape)
        if type_name not in TYPES:
            raise ValueError(f"unsupported quantization {type_name!r} (supported: {', '.join(TYPES)})")
        if n_in % BLOCK or n_out <= 0 or n_in <= 0:
            raise ValueError(f"shape {shape} is not [n_out, a multiple of {BLOCK}]")
        block_bytes = _Q4_1_BYTES if type_name == "Q4_1" else _Q8_0_BYTES
        n_blocks = n_in // BLOCK
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.size != n_out * n_blocks * block_bytes:
            raise ValueError(
                f"{type_name} data of dtype {raw.dtype} and shape {raw.shape} does not hold a {shape} matrix"
            )
        blocks = np.ascontiguousarray(raw).reshape(n_out, n_blocks, block_bytes)
        n_scales = 2 if type_name == "Q4_1" else 1
        scales = blocks[:, :, : 2 * n_scales].copy().view(np.uint16)  # [n_out, n_blocks, n_scales]
        quants = blocks[:, :, 2 * n_scales :]  # [n_out, n_blocks, 16 | 32]
        if type_name == "Q8_0":
            quants = quants.view(np.int8)
        return cls._from_rows(type_name, (n_out, n_in), quants, scales)

    @classmethod
    def concat(cls, parts: list["QuantizedMatrix"]) -> "QuantizedMatrix":
        """The parts' rows stacked in order (fusing q|k|v or gate|up into one product)."""
        if not parts:
            raise ValueError("nothing to concatenate")
        first = parts[0]
        for p in parts:
            if p.type_name != first.type_name or p.shape[1] != first.shape[1]:
                raise ValueError(
                    f"cannot stack a {p.type_name} {p.shape} matrix under a {first.type_name} {first.shape} one"
                )
        rows = [p._rows_layout() for p in parts]
        n_out = sum(p.shape[0] for p in parts)
        return cls._from_rows(
            first.type_name,
            (n_out, first.shape[1]),
            np.concatenate([q for q, _ in rows]),
            np.concatenate([s for _, s in rows]),
        )

    @property
    def nbytes(self) -> int:
        return self.quants.nbytes + self.scales.nbytes

    def dequantize(self) -> np.ndarray:
        """float32 [n_out, n_in], equal to gguf.quants.dequantize of the original bytes."""
        return self.rows(np.arange(self.shape[0]))

    def rows(self, ids) -> np.ndarray:
        """Dequantized rows [len(ids), n_in] float32 (an embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n_out, n_in = self.shape
        if ids.size and (ids.min() < -n_out or ids.max() >= n_out):
            raise IndexError(f"row ids out of range for {n_out} rows")
        ids = ids % n_out
        chunk, lane = ids // LANES, ids % LANES
        q = self.quants[chunk, :, :, lane]  # [k, n_blocks, 16 | 32]
        s = self.scales[chunk, :, :, lane].view(np.float16).astype(np.float32)  # [k, n_blocks, 1 | 2]
        d = s[:, :, 0:1]
        if self.type_name == "Q8_0":
            values = q.astype(np.float32) * d
        else:
            # The same float32 operations, in the same order, as gguf's Q4_1 dequantization.
            nibbles = np.concatenate([q & np.uint8(0x0F), q >> np.uint8(4)], axis=2).astype(np.float32)
            values = (d * nibbles) + s[:, :, 1:2]
        return values.reshape(ids.size, n_in)

    @classmethod
    def _from_rows(cls, type_name: str, shape: tuple[int, int], quants: np.ndarray, scales: np.ndarray) -> "QuantizedMatrix":
        """From row-major blocks: quants [n_out, n_blocks, bytes], scales [n_out, n_blocks, k]."""
        n_out = shape[0]
        n_chunks = -(-n_out // LANES)
        pad = n_chunks * LANES - n_out
        if pad:  # zero blocks (d = m = 0: value 0) fill the last chunk
            quants = np.concatenate([quants, np.zeros((pad,) + quants.shape[1:], quants.dtype)])
            scales = np.concatenate([scales, np.zeros((pad,) + scales.shape[1:], scales.dtype)])

        def lanes_last(a: np.ndarray) -> np.ndarray:
            a = a.reshape(n_chunks, LANES, *a.shape[1:])
            return np.ascontiguousarray(a.transpose(0, 2, 3, 1))

        return cls(type_name, shape, lanes_last(quants), lanes_last(scales))

    def _rows_layout(self) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of _from_rows: (quants, scales) row-major, padding dropped."""

        def rows_first(a: np.ndarray) -> np.ndarray:
            a = a.transpose(0, 3, 1, 2)
            return a.reshape(-1, *a.shape[2:])[: self.shape[0]]

        return rows_first(self.quants), rows_first(self.scales)


def qmatmul_t(x: np.ndarray, w: QuantizedMatrix) -> np.ndarray:
    """x [n, n_in] float32 -> x @ w.dequantize().T, [n, n_out] float32.

    Any n: rows go in groups of four, and a row's result is bitwise independent of the
    other rows in the call."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_out, n_in = w.shape
    if x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"activations of shape {x.shape} do not fit a {w.shape} matrix")
    out = np.empty((x.shape[0], w.quants.shape[0] * LANES), dtype=np.float32)
    if w.type_name == "Q4_1":
        _q4_1_product(x, w.quants, w.scales, out, get_num_threads())
    else:
        _q8_0_product(x, w.quants, w.scales, out, get_num_threads())
    return out if out.shape[1] == n_out else np.ascontiguousarray(out[:, :n_out])


# Explicit signatures compile at import (cached beside this file after the first run).
_Q4_1_SIG = "void(float32[:, ::1], uint8[:, :, :, ::1], uint16[:, :, :, ::1], float32[:, ::1], int64)"
_Q8_0_SIG = "void(float32[:, ::1], int8[:, :, :, ::1], uint16[:, :, :, ::1], float32[:, ::1], int64)"


@njit(inline="always")
def _add4(t, w0, w1, w2, w3, c0, c1, c2, c3):  # pragma: no cover - compiled
    """t + w0 c0 + w1 c1 + w2 c2 + w3 c3, left to right (four fused multiply-adds)."""
    t += w0 * c0
    t += w1 * c1
    t += w2 * c2
    t += w3 * c3
    return t


@njit(inline="always")
def _q4_1_block(q, cf, r, g, s):  # pragma: no cover - compiled
    """s[k * LANES + o] += sum over the block's bytes of v * cf[r+k, 0, j] + hi * cf[r+k, 1, j],
    for the g <= 4 rows r.., two bytes per pass over s (q: [16, LANES] bytes)."""
    for j in range(0, 16, 2):
        qa = q[j]
        qb = q[j + 1]
        a0, b0, c0, d0 = cf[r, 0, j], cf[r, 1, j], cf[r, 0, j + 1], cf[r, 1, j + 1]
        if g == 1:
            for o in range(LANES):
                va, vb = qa[o], qb[o]
                fa, ha, fb, hb = np.float32(va), np.float32(va >> 4), np.float32(vb), np.float32(vb >> 4)
                s[o] = _add4(s[o], fa, ha, fb, hb, a0, b0, c0, d0)
            continue
        a1, b1, c1, d1 = cf[r + 1, 0, j], cf[r + 1, 1, j], cf[r + 1, 0, j + 1], cf[r + 1, 1, j + 1]
        if g == 2:
            for o in range(LANES):
                va, vb = qa[o], qb[o]
                fa, ha, fb, hb = np.float32(va), np.float32(va >> 4), np.float32(vb), np.float32(vb >> 4)
                s[o] = _add4(s[o], fa, ha, fb, hb, a0, b0, c0, d0)
                s[LANES + o] = _add4(s[LANES + o], fa, ha, fb, hb, a1, b1, c1, d1)
            continue
        a2, b2, c2, d2 = cf[r + 2, 0, j], cf[r + 2, 1, j], cf[r + 2, 0, j + 1], cf[r + 2, 1, j + 1]
        if g == 3:
            for o in range(LANES):
                va, vb = qa[o], qb[o]
                fa, ha, fb, hb = np.float32(va), np.float32(va >> 4), np.float32(vb), np.float32(vb >> 4)
                s[o] = _add4(s[o], fa, ha, fb, hb, a0, b0, c0, d0)
                s[LANES + o] = _add4(s[LANES + o], fa, ha, fb, hb, a1, b1, c1, d1)
                s[2 * LANES + o] = _add4(s[2 * LANES + o], fa, ha, fb, hb, a2, b2, c2, d2)
            continue
        a3, b3, c3, d3 = cf[r + 3, 0, j], cf[r + 3, 1, j], cf[r + 3, 0, j + 1], cf[r + 3, 1, j + 1]
        for o in range(LANES):
            va, vb = qa[o], qb[o]
            fa, ha, fb, hb = np.float32(va), np.float32(va >> 4), np.float32(vb), np.float32(vb >> 4)
            s[o] = _add4(s[o], fa, ha, fb, hb, a0, b0, c0, d0)
            s[LANES + o] = _add4(s[LANES + o], fa, ha, fb, hb, a1, b1, c1, d1)
            s[2 * LANES + o] = _add4(s[2 * LANES + o], fa, ha, fb, hb, a2, b2, c2, d2)
            s[3 * LANES + o] = _add4(s[3 * LANES + o], fa, ha, fb, hb, a3, b3, c3, d3)


@njit(inline="always")
def _q8_0_block(q, xb, r, g, s):  # pragma: no cover - compiled
    """s[k * LANES + o] += sum_j q[j, o] * xb[r + k, j] for the g <= 4 rows r.., four bytes
    per pass over s (q: [32, LANES] int8)."""
    for j in range(0, BLOCK, 4):
        q0, q1, q2, q3 = q[j], q[j + 1], q[j + 2], q[j + 3]
        a0, b0, c0, d0 = xb[r, j], xb[r, j + 1], xb[r, j + 2], xb[r, j + 3]
        if g == 1:
            for o in range(LANES):
                w0, w1, w2, w3 = np.float32(q0[o]), np.float32(q1[o]), np.float32(q2[o]), np.float32(q3[o])
                s[o] = _add4(s[o], w0, w1, w2, w3, a0, b0, c0, d0)
            continue
        a1, b1, c1, d1 = xb[r + 1, j], xb[r + 1, j + 1], xb[r + 1, j + 2], xb[r + 1, j + 3]
        if g == 2:
            for o in range(LANES):
                w0, w1, w2, w3 = np.float32(q0[o]), np.float32(q1[o]), np.float32(q2[o]), np.float32(q3[o])
                s[o] = _add4(s[o], w0, w1, w2, w3, a0, b0, c0, d0)
                s[LANES + o] = _add4(s[LANES + o], w0, w1, w2, w3, a1, b1, c1, d1)
            continue
        a2, b2, c2, d2 = xb[r + 2, j], xb[r + 2, j + 1], xb[r + 2, j + 2], xb[r + 2, j + 3]
        if g == 3:
            for o in range(LANES):
                w0, w1, w2, w3 = np.float32(q0[o]), np.float32(q1[o]), np.float32(q2[o]), np.float32(q3[o])
                s[o] = _add4(s[o], w0, w1, w2, w3, a0, b0, c0, d0)
                s[LANES + o] = _add4(s[LANES + o], w0, w1, w2, w3, a1, b1, c1, d1)
                s[2 * LANES + o] = _add4(s[2 * LANES + o], w0, w1, w2, w3, a2, b2, c2, d2)
            continue
        a3, b3, c3, d3 = xb[r + 3, j], xb[r + 3, j + 1], xb[r + 3, j + 2], xb[r + 3, j + 3]
        for o in range(LANES):
            w0, w1, w2, w3 = np.float32(q0[o]), np.float32(q1[o]), np.float32(q2[o]), np.float32(q3[o])
            s[o] = _add4(s[o], w0, w1, w2, w3, a0, b0, c0, d0)
            s[LANES + o] = _add4(s[LANES + o], w0, w1, w2, w3, a1, b1, c1, d1)
            s[2 * LANES + o] = _add4(s[2 * LANES + o], w0, w1, w2, w3, a2, b2, c2, d2)
            s[3 * LANES + o] = _add4(s[3 * LANES + o], w0, w1, w2, w3, a3, b3, c3, d3)


@njit(_Q4_1_SIG, parallel=True, fastmath=_FASTMATH, cache=True, nogil=True)
def _q4_1_product(x, quants, scales, out, n_threads):  # pragma: no cover - compiled
    n, n_in = x.shape
    n_chunks, n_blocks = quants.shape[0], quants.shape[1]
    # Per row and block: the coefficients of v (x_lo) and of hi (x_hi - 16 x_lo), and
    # the block's sum of x (for m). Computed once here, shared by every chunk.
    coef = np.empty((n_blocks, n, 2, 16), dtype=np.float32)
    x_sum = np.empty((n_blocks, n), dtype=np.float32)
    for b in range(n_blocks):
        for r in range(n):
            total = np.float32(0.0)
            for j in range(BLOCK):
                total += x[r, b * BLOCK + j]
            x_sum[b, r] = total
            for j in range(16):
                lo = x[r, b * BLOCK + j]
                coef[b, r, 0, j] = lo
                coef[b, r, 1, j] = x[r, b * BLOCK + 16 + j] - np.float32(16.0) * lo
    for t in prange(n_threads):
        s = np.empty(4 * LANES, dtype=np.float32)  # per row of the group: the block's sums
        acc = np.empty(4 * LANES, dtype=np.float32)  # per row of the group: the outputs
        for c in range(t * n_chunks // n_threads, (t + 1) * n_chunks // n_threads):
            r = 0
            while r < n:
                g = min(4, n - r)
                acc[:] = 0.0
                for b in range(n_blocks):
                    s[:] = 0.0
                    _q4_1_block(quants[c, b], coef[b], r, g, s)
                    dm = scales[c, b]
                    for k in range(g):
                        xs = x_sum[b, r + k]
                        for o in range(LANES):
                            acc[k * LANES + o] += _f16(dm[0, o]) * s[k * LANES + o] + _f16(dm[1, o]) * xs
                for k in range(g):
                    out[r + k, c * LANES : (c + 1) * LANES] = acc[k * LANES : (k + 1) * LANES]
                r += g


@njit(_Q8_0_SIG, parallel=True, fastmath=_FASTMATH, cache=True, nogil=True)
def _q8_0_product(x, quants, scales, out, n_threads):  # pragma: no cover - compiled
    n = x.shape[0]
    n_chunks, n_blocks = quants.shape[0], quants.shape[1]
    xt = np.empty((n_blocks, n, BLOCK), dtype=np.float32)  # the activations block by block
    for b in range(n_blocks):
        for r in range(n):
            for j in range(BLOCK):
                xt[b, r, j] = x[r, b * BLOCK + j]
    for t in prange(n_threads):
        s = np.empty(4 * LANES, dtype=np.float32)
        acc = np.empty(4 * LANES, dtype=np.float32)
        for c in range(t * n_chunks // n_threads, (t + 1) * n_chunks // n_threads):
            r = 0
            while r < n:
                g = min(4, n - r)
                acc[:] = 0.0
                for b in range(n_blocks):
                    s[:] = 0.0
                    _q8_0_block(quants[c, b], xt[b], r, g, s)
                    d = scales[c, b, 0]
                    for k in range(g):
                        for o in range(LANES):
                            acc[k * LANES + o] += _f16(d[o]) * s[k * LANES + o]
                for k in range(g):
                    out[r + k, c * LANES : (c + 1) * LANES] = acc[k * LANES : (k + 1) * LANES]
                r += g

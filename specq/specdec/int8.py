"""Products on int8 activations: the `int8` precision (issue 14).

Why. With the weights in cache, the float32 kernel (qkernels.py) is bound by
arithmetic: every extra row of a forward cost about 0.4 of a one-row step. Integer
dot-product instructions do 4 multiply-adds per 32-bit lane where a float FMA does
one, so here, as in llama.cpp, each activation row is quantized like Q8_0 (per block
of 32: d = max|x| / 127, q = rint(x / d)) and multiplied by the weights' own integers:

    Q8_0 weights (d_w, q_w):       out += float(sum q_w q_x) * (d_w * d_x)
    Q4_1 weights (d_w, m_w, q_w):  out += float(sum q_w q_x) * (d_w * d_x);  out += m_w * s_x

with s_x = d_x * sum(q_x), the block's sum as the integers see it (llama.cpp's Q8_1):
the float sum of x would leave an error (w - m) dx instead of w dx, measured twice as
large. Both sums are exact integers, each + is one fused multiply-add in block order,
so a row's bits depend only on its own values (bitwise row invariance) and are the
same on every CPU with AVX2 (vec.dot4).

Cost of the numerics: a product differs from float32's by about 0.5% rms (the
rounding of x to 8 bits). `specq bench --quality` measures what that does to the
model's next-token distributions.

Layout, repacked at load from gguf's blocks (8 outputs side by side; each 32-bit lane
holds 4 consecutive inputs of its output, so the instructions reduce along the inputs
within a lane and the activations are a broadcast of 4 bytes: no horizontal sums):
    Q4_1 quants [n_out/8, blocks, 4, 32] uint8: byte 4 * lane + p of vector v holds
         input 4v + p (low nibble) and input 16 + 4v + p (high nibble)
    Q8_0 quants [n_out/8, blocks, 8, 32] int8: byte 4 * lane + p of vector v is input 4v + p
    d (and m) float32 [n_out/8, blocks, 8], converted from fp16 (exact)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import config, njit

from specq.specdec import vec
from specq.specdec.qkernels import BLOCK, QuantizedMatrix

TYPES = ("Q4_1", "Q8_0")
AVAILABLE = vec.has_avx2()  # the kernels need AVX2 and FMA; vec.dot4 says why this suffices

if AVAILABLE:
    from specq.specdec import int8_kernels as _kernels

    _WIDE = "avx512vl" in vec.cpu_features()  # 32 vector registers: the larger micro-kernel fits
    product_q4_1 = _kernels.q4_1_2x3 if _WIDE else _kernels.q4_1_1x4
    product_q8_0 = _kernels.q8_0_2x3 if _WIDE else _kernels.q8_0_1x4


class Int8Unavailable(RuntimeError):
    pass


def require() -> None:
    if not AVAILABLE:
        raise Int8Unavailable("this CPU has no AVX2 with FMA, which the int8 precision needs; use --precision f32")


@dataclass(frozen=True, eq=False)
class Int8Matrix:
    """A Q4_1 or Q8_0 matrix [n_out, n_in] in the int8 kernels' layout (module docstring)."""

    type_name: str
    shape: tuple[int, int]
    quants: np.ndarray  # flat: Q4_1 uint8, Q8_0 int8
    d: np.ndarray  # flat float32
    m: np.ndarray  # flat float32 (Q4_1; empty for Q8_0)

    @classmethod
    def from_quantized(cls, w: QuantizedMatrix) -> "Int8Matrix":
        n_out, n_in = w.shape
        if w.type_name not in TYPES:
            raise ValueError(f"no int8 kernel for {w.type_name}")
        if n_out % 8:
            raise ValueError(f"a {w.shape} matrix: the int8 kernels need a multiple of 8 outputs")
        n8, nb = n_out // 8, n_in // BLOCK
        raw = w.to_gguf_bytes().reshape(n_out, nb, -1)

        def per_lane(a: np.ndarray) -> np.ndarray:  # [n_out, nb] -> flat [n8, nb, 8]
            return np.ascontiguousarray(a.reshape(n8, 8, nb).transpose(0, 2, 1)).reshape(-1)

        d = per_lane(raw[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32))
        if w.type_name == "Q4_1":
            m = per_lane(raw[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32))
            nibbles = raw[:, :, 4:20]  # byte j: element j (low nibble), element j + 16 (high)
            low = (nibbles & 0x0F).reshape(n8, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)
            high = (nibbles >> 4).reshape(n8, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)
            quants = np.ascontiguousarray(low | (high << 4)).astype(np.uint8).reshape(-1)
        else:
            m = np.empty(0, np.float32)
            q = raw[:, :, 2:34].view(np.int8)
            quants = np.ascontiguousarray(q.reshape(n8, 8, nb, 8, 4).transpose(0, 2, 3, 1, 4)).reshape(-1)
        return cls(w.type_name, (n_out, n_in), quants, d, m)

    @property
    def nbytes(self) -> int:
        return self.quants.nbytes + self.d.nbytes + self.m.nbytes

    def dequantize(self) -> np.ndarray:
        """float32 [n_out, n_in], gguf's values (d * q + m, q * d), bit for bit."""
        n_out, n_in = self.shape
        n8, nb = n_out // 8, n_in // BLOCK
        d = self.d.reshape(n8, nb, 8).transpose(0, 2, 1).reshape(n_out, nb, 1)
        if self.type_name == "Q4_1":
            packed = self.quants.reshape(n8, nb, 4, 8, 4).transpose(0, 3, 1, 2, 4).reshape(n_out, nb, 16)
            q = np.concatenate([packed & 0x0F, packed >> 4], axis=2).astype(np.float32)
            m = self.m.reshape(n8, nb, 8).transpose(0, 2, 1).reshape(n_out, nb, 1)
            return (d * q + m).reshape(n_out, n_in)
        q = self.quants.reshape(n8, nb, 8, 8, 4).transpose(0, 3, 1, 2, 4).reshape(n_out, nb, 32)
        return (q.astype(np.float32) * d).reshape(n_out, n_in)

    def rows(self, ids) -> np.ndarray:
        """Dequantized rows [len(ids), n_in] (not a fast path: tests and tools)."""
        return self.dequantize()[np.asarray(ids, dtype=np.int64).reshape(-1)]


@njit("void(float32[:, ::1], int8[::1], float32[::1], float32[::1])", cache=True, nogil=True)
def _quantize_portable(x, q, d, s):  # pragma: no cover - compiled
    """quantize_rows without vector instructions: the same values (for CPUs without AVX2)."""
    n, n_in = x.shape
    nb = n_in // BLOCK
    for r in range(n):
        for b in range(nb):
            largest = np.float32(0.0)
            for j in range(BLOCK):
                largest = max(largest, abs(x[r, b * BLOCK + j]))
            scale = np.float32(127.0) / largest if largest > 0 else np.float32(0.0)
            total = 0
            for j in range(BLOCK):
                v = np.int32(np.rint(x[r, b * BLOCK + j] * scale))
                q[r * n_in + b * BLOCK + j] = v
                total += v
            d[r * nb + b] = largest / np.float32(127.0)
            s[r * nb + b] = np.float32(total) * (largest / np.float32(127.0))


if AVAILABLE:

    @njit("void(float32[:, ::1], int8[::1], float32[::1], float32[::1])", cache=True, nogil=True)
    def quantize_rows(x, q, d, s):  # pragma: no cover - compiled
        """Each row of x [n, n_in], per block of 32: q = rint(x * 127 / max|x|) into
        q [n * n_in], d = max|x| / 127 and s = d * sum(q) into d, s [n * n_in / 32].
        |x * 127 / max|x|| <= 127 up to one rounding, which rint brings back to 127."""
        n, n_in = x.shape
        nb = n_in // BLOCK
        flat = x.reshape(-1)
        for r in range(n):
            for b in range(nb):
                i = r * n_in + b * BLOCK
                v0 = vec.load_f32(flat, i)
                v1 = vec.load_f32(flat, i + 8)
                v2 = vec.load_f32(flat, i + 16)
                v3 = vec.load_f32(flat, i + 24)
                largest = vec.largest_lane(vec.max_abs(vec.max_abs(vec.max_abs(vec.max_abs(vec.zeros_f32(), v0), v1), v2), v3))
                scale = vec.splat_f32(np.float32(127.0) / largest if largest > 0 else np.float32(0.0))
                q0 = vec.round_scaled(v0, scale)
                q1 = vec.round_scaled(v1, scale)
                q2 = vec.round_scaled(v2, scale)
                q3 = vec.round_scaled(v3, scale)
                vec.store_i8(q, i, q0)
                vec.store_i8(q, i + 8, q1)
                vec.store_i8(q, i + 16, q2)
                vec.store_i8(q, i + 24, q3)
                step = largest / np.float32(127.0)
                d[r * nb + b] = step
                s[r * nb + b] = np.float32(vec.lane_sum(q0, q1, q2, q3)) * step

    @njit(nogil=True)
    def product(x, w_type_q4_1, quants, d, m, n_out, n_threads):  # pragma: no cover - compiled
        """x [n, n_in] float32 -> x @ w.T [n, n_out] through int8 activations, from
        inside numba (the layer stack)."""
        n, n_in = x.shape
        nb = n_in // BLOCK
        q = np.empty(n * n_in, dtype=np.int8)
        xd = np.empty(n * nb, dtype=np.float32)
        xs = np.empty(n * nb, dtype=np.float32)
        quantize_rows(x, q, xd, xs)
        out = np.empty((n, n_out), dtype=np.float32)
        if w_type_q4_1:
            product_q4_1(quants, d, m, q, xd, xs, out.reshape(-1), n, nb, n_in, n_out, n_threads)
        else:
            product_q8_0(quants.view(np.int8), d, q, xd, out.reshape(-1), n, nb, n_in, n_out, n_threads)
        return out


def int8_matmul_t(x: np.ndarray, w: Int8Matrix) -> np.ndarray:
    """x [n, n_in] -> about x @ w.dequantize().T, float32 [n, n_out]; a row's result
    is bitwise independent of the other rows."""
    require()
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_out, n_in = w.shape
    if x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"activations of shape {x.shape} do not fit a {w.shape} matrix")
    quants = w.quants if w.type_name == "Q4_1" else w.quants.view(np.uint8)
    m = w.m if w.type_name == "Q4_1" else w.d
    return product(x, w.type_name == "Q4_1", quants, w.d, m, n_out, config.NUMBA_NUM_THREADS)


def quantize_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activation quantization in numpy: (q [n, n_in] int8, d [n, blocks], s [n, blocks])."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, n_in = x.shape
    q = np.empty(n * n_in, np.int8)
    d = np.empty(n * (n_in // BLOCK), np.float32)
    s = np.empty_like(d)
    _quantize_portable(x, q, d, s)
    return q.reshape(n, n_in), d.reshape(n, -1), s.reshape(n, -1)


def int8_matmul_t_reference(x: np.ndarray, w: Int8Matrix) -> np.ndarray:
    """The same arithmetic in numpy (slow; the tests' reference): exact integer block
    sums, then per block the float epilogue in the same order, each step rounded once
    as a fused multiply-add would be (computed in float64, then rounded)."""
    q, xd, xs = quantize_reference(x)
    n_out, n_in = w.shape
    n8, nb = n_out // 8, n_in // BLOCK
    wq = _integers(w)
    sums = np.einsum("rbj,obj->rbo", q.reshape(-1, nb, BLOCK).astype(np.int64), wq.astype(np.int64))
    d = w.d.reshape(n8, nb, 8).transpose(1, 0, 2).reshape(nb, n_out)
    m = w.m.reshape(n8, nb, 8).transpose(1, 0, 2).reshape(nb, n_out) if w.type_name == "Q4_1" else None
    acc = np.zeros((x.shape[0], n_out), np.float32)
    for b in range(nb):
        scale = (d[b][None, :] * xd[:, b : b + 1]).astype(np.float32)  # one rounding: a float32 product
        acc = (sums[:, b, :].astype(np.float64) * scale + acc).astype(np.float32)
        if m is not None:
            acc = (m[b][None, :].astype(np.float64) * xs[:, b : b + 1] + acc).astype(np.float32)
    return acc


def _integers(w: Int8Matrix) -> np.ndarray:
    """The weights' integers [n_out, blocks, 32] (nibbles 0..15, or int8)."""
    n_out, n_in = w.shape
    n8, nb = n_out // 8, n_in // BLOCK
    if w.type_name == "Q4_1":
        packed = w.quants.reshape(n8, nb, 4, 8, 4).transpose(0, 3, 1, 2, 4).reshape(n_out, nb, 16)
        return np.concatenate([packed & 0x0F, packed >> 4], axis=2)
    return w.quants.reshape(n8, nb, 8, 8, 4).transpose(0, 3, 1, 2, 4).reshape(n_out, nb, 32)

"""Products with F16 and BF16 weight matrices, kept in their 2 bytes a weight.

Before, these were converted to float32 at load: twice the memory, and a decode step
that streamed twice the bytes. Here the weights stay 2 bytes, laid out as qkernels
lays out its blocks, with the vector lanes as outputs: `bits[chunk, i, lane]` is
input i's weight for output chunk * LANES + lane. A micro-kernel converts one vector
of weights (vcvtph2ps for F16; BF16 is the top half of a float32) and adds its
product with each of up to ROWS activation rows into that row's accumulators, so the
weights are read once for every ROWS rows. Each lane is one output's sum over the
inputs in order, one fused multiply-add at a time, whatever the row grouping: a
row's bits never depend on its companions. The conversions are exact, so the values
are gguf's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import config, njit, prange

from specq.specdec import vec

TYPES = ("F16", "BF16")
# Outputs per vector: 16 where AVX-512 runs (twice the work per instruction), else 8.
_512 = vec.has_avx2() and {"avx512f", "avx512vl"} <= vec.cpu_features()
LANES = 16 if _512 else 8
if _512:
    _load_f16, _load_bf16, _zeros, _fma = vec.load_f32_w, vec.load_bf16_w, vec.zeros_f32_w, vec.fma_w
    _broadcast, _store = vec.broadcast_f32_w, vec.store_f32_w
else:
    _load_f16, _load_bf16, _zeros, _fma = vec.load_f32, vec.load_bf16, vec.zeros_f32, vec.fma
    _broadcast, _store = vec.broadcast_f32, vec.store_f32
# A pass covers 4 output vectors: for every 4 rows as two 2-vector x 4-row blocks
# (8 accumulators each, in 16 registers), and for each row left as one
# 4-vector block: 4 sums in flight rather than one chain of dependent fused
# multiply-adds, which made a one-row product bound by their latency.
ROWS = 4
CHUNKS = 4


@dataclass(frozen=True, eq=False)
class HalfMatrix:
    type_name: str  # "F16" or "BF16"
    shape: tuple[int, int]
    bits: np.ndarray  # uint16 [n_out / lanes, n_in, lanes] (outputs padded with zeros)
    lanes: int = LANES  # this CPU's kernels' when it was laid out

    @classmethod
    def from_gguf_bytes(cls, data: np.ndarray, type_name: str, shape: tuple[int, int]) -> HalfMatrix:
        """data: uint8 [n_out, 2 n_in], as GGUFFile.raw_tensor gives it."""
        if type_name not in TYPES:
            raise ValueError(f"not a 2-byte float type: {type_name}")
        return cls.from_rows(np.ascontiguousarray(data).view(np.uint16).reshape(shape), type_name)

    @classmethod
    def from_rows(cls, rows: np.ndarray, type_name: str) -> HalfMatrix:
        """rows: uint16 [n_out, n_in], one output's weights a row."""
        n_out, n_in = rows.shape
        padded = np.zeros((-(-n_out // LANES) * LANES, n_in), np.uint16)
        padded[:n_out] = rows
        bits = np.ascontiguousarray(padded.reshape(-1, LANES, n_in).transpose(0, 2, 1))
        return cls(type_name, (n_out, n_in), bits, LANES)

    def row_bits(self) -> np.ndarray:
        """uint16 [n_out, n_in], as the file holds them."""
        return self.bits.transpose(0, 2, 1).reshape(-1, self.shape[1])[: self.shape[0]]

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes

    def dequantize(self) -> np.ndarray:
        """float32 [n_out, n_in], exactly."""
        return _as_float32(self.row_bits(), self.type_name)

    def rows(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Rows [len(ids), n_in] as float32 (an embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1) % self.shape[0]
        chunk, lane = np.divmod(ids, self.lanes)
        return _as_float32(self.bits[chunk, :, lane], self.type_name)

    @classmethod
    def concat(cls, parts: list[HalfMatrix]) -> HalfMatrix:
        return cls.from_rows(np.concatenate([p.row_bits() for p in parts]), parts[0].type_name)


def _as_float32(bits: np.ndarray, type_name: str) -> np.ndarray:
    if type_name == "F16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def half_matmul_t(x: np.ndarray, w: HalfMatrix) -> np.ndarray:
    """x [n, n_in] -> x @ w.dequantize().T, float32 [n, n_out]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"activations of shape {x.shape} do not fit a {w.shape} matrix")
    if w.lanes != LANES:
        raise ValueError(f"a matrix laid out for {w.lanes} lanes; this CPU's kernels take {LANES}")
    out = product(x, w.bits.reshape(-1), w.type_name == "BF16", config.NUMBA_NUM_THREADS)
    return out if out.shape[1] == w.shape[0] else np.ascontiguousarray(out[:, : w.shape[0]])


@njit(nogil=True, cache=True)
def product(x, bits, bf16, n_threads):  # pragma: no cover - compiled
    """x [n, n_in] @ the matrix of flat bits (HalfMatrix.bits) .T -> [n, padded n_out],
    from inside numba too (the layer stack)."""
    n, n_in = x.shape
    n_out = bits.shape[0] // n_in
    out = np.empty((n, n_out), dtype=np.float32)
    _drive(x.reshape(-1), bits, bf16, out.reshape(-1), n, n_in, n_out, n_threads)
    return out


@njit(inline="always")
def _weights(bits, at, bf16):  # pragma: no cover - compiled
    return _load_bf16(bits, at) if bf16 else _load_f16(bits, at)


@njit(inline="always")
def _ask_ahead(bits, c, i, n_in, vectors):  # pragma: no cover - compiled
    """Asks for input i's weights of output vectors c + CHUNKS.. (the driver's next
    chunk) while this one's multiply (vec.prefetch; a line holds several inputs' and
    is asked for once an input: the redundant asks cost less than the waits they
    save). With the weights in memory (120 matrices of the default model's shapes, in
    two runs), the products of 4 and 8 rows took 1.16x to 1.40x less time, of one
    row 1.12x to 1.22x, of 32 rows 1.05x to 1.07x (docs/performance.md)."""
    ahead = ((c + CHUNKS) * n_in + i) * LANES
    for v in range(vectors):
        vec.prefetch(bits, ahead + v * n_in * LANES)


@njit(inline="always")
def _micro_1(bits, bf16, x, out, c, r0, n_in, n_out):  # pragma: no cover - compiled
    """One output vector, one row."""
    a = _zeros()
    for i in range(n_in):
        a = _fma(_weights(bits, (c * n_in + i) * LANES, bf16), _broadcast(x, r0 * n_in + i), a)
    _store(out, r0 * n_out + c * LANES, a)


@njit(inline="always")
def _micro_4x1(bits, bf16, x, out, c, r0, n_in, n_out):  # pragma: no cover - compiled
    """Output vectors c .. c + 3, one row: the same per-lane sums as _micro_1."""
    a0, a1, a2, a3 = _zeros(), _zeros(), _zeros(), _zeros()
    for i in range(n_in):
        _ask_ahead(bits, c, i, n_in, 4)
        xi = _broadcast(x, r0 * n_in + i)
        a0 = _fma(_weights(bits, (c * n_in + i) * LANES, bf16), xi, a0)
        a1 = _fma(_weights(bits, ((c + 1) * n_in + i) * LANES, bf16), xi, a1)
        a2 = _fma(_weights(bits, ((c + 2) * n_in + i) * LANES, bf16), xi, a2)
        a3 = _fma(_weights(bits, ((c + 3) * n_in + i) * LANES, bf16), xi, a3)
    at = r0 * n_out + c * LANES
    _store(out, at, a0)
    _store(out, at + LANES, a1)
    _store(out, at + 2 * LANES, a2)
    _store(out, at + 3 * LANES, a3)


@njit(inline="always")
def _micro_2x4(bits, bf16, x, out, c, r0, n_in, n_out):  # pragma: no cover - compiled
    """Output vectors c and c + 1, rows r0 .. r0 + 3: the same per-lane sums as _micro_1."""
    a00, a01, a02, a03 = _zeros(), _zeros(), _zeros(), _zeros()
    a10, a11, a12, a13 = _zeros(), _zeros(), _zeros(), _zeros()
    for i in range(n_in):
        _ask_ahead(bits, c, i, n_in, 2)
        w0 = _weights(bits, (c * n_in + i) * LANES, bf16)
        w1 = _weights(bits, ((c + 1) * n_in + i) * LANES, bf16)
        x0 = _broadcast(x, r0 * n_in + i)
        a00, a10 = _fma(w0, x0, a00), _fma(w1, x0, a10)
        x1 = _broadcast(x, (r0 + 1) * n_in + i)
        a01, a11 = _fma(w0, x1, a01), _fma(w1, x1, a11)
        x2 = _broadcast(x, (r0 + 2) * n_in + i)
        a02, a12 = _fma(w0, x2, a02), _fma(w1, x2, a12)
        x3 = _broadcast(x, (r0 + 3) * n_in + i)
        a03, a13 = _fma(w0, x3, a03), _fma(w1, x3, a13)
    first, second = r0 * n_out + c * LANES, r0 * n_out + (c + 1) * LANES
    _store(out, first, a00)
    _store(out, second, a10)
    _store(out, first + n_out, a01)
    _store(out, second + n_out, a11)
    _store(out, first + 2 * n_out, a02)
    _store(out, second + 2 * n_out, a12)
    _store(out, first + 3 * n_out, a03)
    _store(out, second + 3 * n_out, a13)


@njit(parallel=True, nogil=True, cache=True)
def _drive(x, bits, bf16, out, n, n_in, n_out, n_slices):  # pragma: no cover - compiled
    """Each thread takes a slice of the output vectors and passes over the rows with
    four of them at a time (CHUNKS), the slice's last few one at a time."""
    chunks = n_out // LANES
    for t in prange(n_slices):
        c, last = t * chunks // n_slices, (t + 1) * chunks // n_slices
        while c < last:
            if c + CHUNKS <= last:
                r0 = 0
                while r0 + ROWS <= n:
                    _micro_2x4(bits, bf16, x, out, c, r0, n_in, n_out)
                    _micro_2x4(bits, bf16, x, out, c + 2, r0, n_in, n_out)
                    r0 += ROWS
                for r in range(r0, n):
                    _micro_4x1(bits, bf16, x, out, c, r, n_in, n_out)
                c += CHUNKS
            else:
                for r in range(n):
                    _micro_1(bits, bf16, x, out, c, r, n_in, n_out)
                c += 1

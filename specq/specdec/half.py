"""Products with F16 and BF16 weight matrices, kept in their 2 bytes a weight.

Before, these were converted to float32 at load: twice the memory, and a decode step
that streamed twice the bytes (the float32 kernel is bound by memory at one row).
Here each output's row of weights is converted into a float32 buffer (vcvtph2ps for
F16; BF16 is the top half of a float32) and every activation row is multiplied with
it while it sits in L1, by the float32 kernel's reduction (kernels.py): one loop
body for every row, so a row's bits never depend on its companions. The conversions
are exact, so the values are gguf's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import config, njit, prange

from specq.specdec import vec

TYPES = ("F16", "BF16")


@dataclass(frozen=True, eq=False)
class HalfMatrix:
    type_name: str  # "F16" or "BF16"
    shape: tuple[int, int]
    bits: np.ndarray  # uint16 [n_out, n_in]: a GGUF tensor's data, memory-mapped where it can be

    @classmethod
    def from_gguf_bytes(cls, data: np.ndarray, type_name: str, shape: tuple[int, int]) -> HalfMatrix:
        """data: uint8 [n_out, 2 n_in], as GGUFFile.raw_tensor gives it."""
        if type_name not in TYPES:
            raise ValueError(f"not a 2-byte float type: {type_name}")
        return cls(type_name, tuple(shape), np.ascontiguousarray(data).view(np.uint16).reshape(shape))

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes

    def dequantize(self) -> np.ndarray:
        """float32 [n_out, n_in], exactly."""
        return _as_float32(self.bits, self.type_name)

    def rows(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Rows [len(ids), n_in] as float32 (an embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1) % self.shape[0]
        return _as_float32(self.bits[ids], self.type_name)

    @classmethod
    def concat(cls, parts: list[HalfMatrix]) -> HalfMatrix:
        rows = sum(p.shape[0] for p in parts)
        return cls(parts[0].type_name, (rows, parts[0].shape[1]), np.concatenate([p.bits for p in parts]))


def _as_float32(bits: np.ndarray, type_name: str) -> np.ndarray:
    if type_name == "F16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def half_matmul_t(x: np.ndarray, w: HalfMatrix) -> np.ndarray:
    """x [n, n_in] -> x @ w.dequantize().T, float32 [n, n_out]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"activations of shape {x.shape} do not fit a {w.shape} matrix")
    return product(x, w.bits, w.type_name == "BF16", config.NUMBA_NUM_THREADS)


@njit(nogil=True, cache=True)
def product(x, bits, bf16, n_threads):  # pragma: no cover - compiled
    """half_matmul_t from inside numba too (the layer stack): bits uint16 [n_out, n_in]."""
    out = np.empty((x.shape[0], bits.shape[0]), dtype=np.float32)
    _rows_times_half(x, bits, bf16, out, n_threads)
    return out


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _rows_times_half(x, bits, bf16, out, n_slices):  # pragma: no cover - compiled
    n, n_in = x.shape
    n_out = bits.shape[0]
    for t in prange(n_slices):
        words = np.empty(n_in, dtype=np.uint32)
        row = words.view(np.float32)
        for o in range(t * n_out // n_slices, (t + 1) * n_out // n_slices):
            if bf16:
                for i in range(n_in):
                    words[i] = np.uint32(bits[o, i]) << np.uint32(16)
            else:
                for i in range(n_in):
                    row[i] = vec.as_f32(bits[o, i])
            # kernels._rows_times_weights's loop: the same body for every row.
            for r in range(n):
                acc = np.float32(0.0)
                for i in range(n_in):
                    acc += row[i] * x[r, i]
                out[r, o] = acc

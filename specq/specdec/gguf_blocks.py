"""GGUF's block types unpacked, without loss, into the int8 kernels' formats.

Every type whose weights are small integers times per-block scales fits one of
int8.FORMATS once a K-quant's two-level scales are multiplied out. The products are
exact in float32: an fp16 scale (11 significant bits) times a sub-block scale of at
most 8 bits, times a weight of at most 6 bits, needs at most 25 bits, and the
weights fit 24 where it matters (the largest case, Q6_K: 11 + 7 + 6).

    GGUF type  its values              format  ints        d per 32 (or 16)  m
    Q4_0       d (q - 8)               Q4_1    q           d                 -8 d
    Q4_1       d q + m                 Q4_1    q           d                 m
    Q4_K       d sc q - dmin mn        Q4_1    q           d sc              -(dmin mn)
    Q5_0       d (q - 16)              Q8_0    q - 16      d
    Q8_0       d q                     Q8_0    q           d
    Q5_1       d q + m                 Q8_M    q           d                 m
    Q5_K       d sc q - dmin mn        Q8_M    q           d sc              -(dmin mn)
    Q6_K       d sc (q - 32)           Q8_H    q - 32      d sc (per 16)     -0
    Q3_K       d (sc - 32) q           Q8_H    q (signed)  d (sc - 32)       -0

`values` computes each format's float32 values with one rounding per operation, and
equals gguf's dequantization bit for bit (tests/specdec/test_gguf_blocks.py); a
missing minimum is -0.0, which leaves every value, -0.0 included, unchanged.
Q2_K (a minimum per 16 values) and the float types have no format here: F16 and BF16
are half.py's, F32 and Q2_K stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32  # values per block of every format
FORMAT_OF = {
    "Q4_0": "Q4_1",
    "Q4_1": "Q4_1",
    "Q4_K": "Q4_1",
    "Q5_0": "Q8_0",
    "Q8_0": "Q8_0",
    "Q5_1": "Q8_M",
    "Q5_K": "Q8_M",
    "Q6_K": "Q8_H",
    "Q3_K": "Q8_H",
}
# The ways a format's matrix is exactly a matrix of another (for stacking the q, k
# and v matrices of one block when their files' types differ): ints fit int8, a
# scale per block is one per half block twice, and no minimum is a minimum of -0.0.
_WIDER = {"Q4_1": ("Q8_M", "Q8_H"), "Q8_0": ("Q8_M", "Q8_H"), "Q8_M": ("Q8_H",), "Q8_H": ()}


def values(fmt: str, ints: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    """float32 [rows, blocks, 32] of a format's ints [rows, blocks, 32], d [rows,
    blocks] (Q8_H: [rows, blocks, 2]) and m [rows, blocks] (None: no minimum)."""
    q = ints.astype(np.float32)
    if fmt == "Q8_H":
        scaled = (q.reshape(*d.shape, BLOCK // 2) * d[..., None]).reshape(q.shape)
    else:
        scaled = q * d[:, :, None]
    return scaled if m is None else scaled + m[:, :, None]


@dataclass(frozen=True, eq=False)
class BlockMatrix:
    """A matrix [n_out, n_in] of one of GGUF's block types, unpacked (module
    docstring): the form the int8 precisions convert to their layout, and the f32
    precision to float32."""

    type_name: str  # the format, one of int8.FORMATS
    shape: tuple[int, int]
    ints: np.ndarray  # [n_out, blocks, 32]: uint8 (Q4_1, Q8_M) or int8
    d: np.ndarray  # float32 [n_out, blocks], Q8_H [n_out, blocks, 2]
    m: np.ndarray | None  # float32 [n_out, blocks] (Q4_1, Q8_M, Q8_H), else None

    def dequantize(self) -> np.ndarray:
        return values(self.type_name, self.ints, self.d, self.m).reshape(self.shape)

    def rows(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Dequantized rows [len(ids), n_in] (an embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1) % self.shape[0]
        m = None if self.m is None else self.m[ids]
        return values(self.type_name, self.ints[ids], self.d[ids], m).reshape(ids.size, self.shape[1])

    @property
    def nbytes(self) -> int:
        return self.ints.nbytes + self.d.nbytes + (0 if self.m is None else self.m.nbytes)

    def widened(self, fmt: str) -> BlockMatrix:
        """This matrix in format fmt, the same values (see _WIDER)."""
        if fmt == self.type_name:
            return self
        if fmt not in _WIDER[self.type_name]:
            raise ValueError(f"a {self.type_name} matrix is not a {fmt} one")
        d = np.repeat(self.d[:, :, None], 2, axis=2) if fmt == "Q8_H" and self.d.ndim == 2 else self.d
        m = self.m if self.m is not None else np.full(self.d.shape[:2], -0.0, np.float32)
        return BlockMatrix(fmt, self.shape, self.ints.astype(np.int8), d, m)

    @classmethod
    def concat(cls, parts: list[BlockMatrix]) -> BlockMatrix:
        """The rows of all parts in one matrix, in the narrowest format that holds
        them all (Q8_H holds every one)."""
        fmt = common_format([p.type_name for p in parts])
        wide = [p.widened(fmt) for p in parts]
        ms = [p.m for p in wide]
        return cls(
            fmt,
            (sum(p.shape[0] for p in wide), parts[0].shape[1]),
            np.concatenate([p.ints for p in wide]),
            np.concatenate([p.d for p in wide]),
            None if any(m is None for m in ms) else np.concatenate(ms),
        )


def common_format(formats: list[str]) -> str:
    """The narrowest format that holds matrices of all these formats."""
    for fmt in ("Q4_1", "Q8_0", "Q8_M"):
        if all(f == fmt or fmt in _WIDER[f] for f in formats):
            return fmt
    return "Q8_H"  # every format widens to it


def _fp16(b: np.ndarray) -> np.ndarray:
    """float32 values of little-endian fp16 bytes [..., 2]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit minimums:
    bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes
    4-7 the same for the minimums, bytes 8-11 the low 4 bits of scales 4-7 (low
    nibble) and of minimums 4-7 (high nibble). -> (scales, minimums), each [n, 8]."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], axis=1)
    mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _low_high(q: np.ndarray) -> np.ndarray:
    """Bytes [n, k, r] -> [n, 2kr/32, 32]: each run of r bytes gives its low
    nibbles, then its high nibbles, in blocks of 32 values."""
    return np.stack([q & 0x0F, q >> 4], axis=2).reshape(q.shape[0], -1, BLOCK)


def _unpack(type_name: str, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Blocks [n, block bytes] of a GGUF type -> ints [n, k, 32], d [n, k] (or [n, k,
    2]) and m [n, k] or None, for the k blocks of 32 in each."""
    n = b.shape[0]
    if type_name in ("Q4_0", "Q4_1"):
        d, rest = _fp16(b[:, 0:2]), b[:, 2:]
        m = -8 * d if type_name == "Q4_0" else _fp16(rest[:, 0:2])
        qs = rest[:, -16:]
        ints = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
        return ints[:, None], d[:, None], m[:, None]
    if type_name in ("Q5_0", "Q5_1"):
        d = _fp16(b[:, 0:2])
        m = _fp16(b[:, 2:4]) if type_name == "Q5_1" else None
        qh = b[:, -20:-16].copy().view("<u4")  # [n, 1]: bit j is element j's fifth bit
        qs = b[:, -16:]
        fifth = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
        ints = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | fifth
        if type_name == "Q5_0":
            return (ints.astype(np.int16) - 16).astype(np.int8)[:, None], d[:, None], None
        return ints[:, None], d[:, None], m[:, None]
    if type_name == "Q8_0":
        return b[:, 2:].view(np.int8)[:, None], _fp16(b[:, 0:2])[:, None], None
    if type_name in ("Q4_K", "Q5_K"):
        d, dmin = _fp16(b[:, 0:2]), _fp16(b[:, 2:4])
        sc, mn = _k_scales(b[:, 4:16])
        if type_name == "Q4_K":
            ints = _low_high(b[:, 16:144].reshape(n, 4, 32))
        else:
            fifth = (b[:, 16:48][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [n, 8, 32]
            ints = _low_high(b[:, 48:176].reshape(n, 4, 32)) | (fifth << 4)
        return ints, d[:, None] * sc, -(dmin[:, None] * mn)
    if type_name == "Q6_K":
        low = _low_high(b[:, 0:128].reshape(n, 2, 64))
        high = (b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
        ints = (low | (high.reshape(n, 8, 32) << 4)).astype(np.int16) - 32
        scales = b[:, 192:208].view(np.int8).astype(np.float32)  # one per 16 values
        d = _fp16(b[:, 208:210])
        return ints.astype(np.int8), (d[:, None] * scales).reshape(n, 8, 2), None
    if type_name == "Q3_K":
        hmask, qs, packed, d = b[:, 0:32], b[:, 32:96], b[:, 96:108], _fp16(b[:, 108:110])
        low = (packed[:, 0:8][:, None, :] >> np.array([0, 4], np.uint8)[None, :, None]).reshape(n, 16) & 0x0F
        top = (packed[:, 8:12][:, None, :] >> np.array([0, 2, 4, 6], np.uint8)[None, :, None]).reshape(n, 16) & 3
        scales = ((low | (top << 4)).astype(np.int16) - 32).astype(np.float32)
        two = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3  # [n, 2, 4, 32]
        bit = (hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [n, 8, 32]
        # Each value is its two low bits less 4 where its mask bit is clear.
        ints = two.reshape(n, 8, 32).astype(np.int16) - 4 * (1 - bit.astype(np.int16))
        return ints.astype(np.int8), (d[:, None] * scales).reshape(n, 8, 2), None
    raise ValueError(f"no block format for {type_name}")


def unpack(type_name: str, data: np.ndarray, shape: tuple[int, int]) -> BlockMatrix:
    """A matrix's GGUF bytes, [n_out, bytes per row], as a BlockMatrix of its
    format (FORMAT_OF)."""
    n_out, n_in = shape
    fmt = FORMAT_OF[type_name]
    blocks = np.ascontiguousarray(data).reshape(n_out * (data.shape[1] // _BLOCK_BYTES[type_name]), -1)
    ints, d, m = _unpack(type_name, blocks)
    nb = n_in // BLOCK
    ints = ints.reshape(n_out, nb, BLOCK)
    d = d.reshape(n_out, nb, 2) if fmt == "Q8_H" else d.reshape(n_out, nb)
    if m is None and fmt != "Q8_0":
        m = np.full((n_out, nb), -0.0, np.float32)
    return BlockMatrix(fmt, (n_out, n_in), ints, d.astype(np.float32), None if m is None else m.reshape(n_out, nb))


_BLOCK_BYTES = {
    "Q4_0": 18,
    "Q4_1": 20,
    "Q5_0": 22,
    "Q5_1": 24,
    "Q8_0": 34,
    "Q4_K": 144,
    "Q5_K": 176,
    "Q6_K": 210,
    "Q3_K": 110,
}


def as_gguf_bytes(bm: BlockMatrix) -> tuple[str, np.ndarray] | None:
    """(type, bytes [n_out, bytes per row]) of a Q4_1 or Q8_0 GGUF tensor holding
    exactly bm's values, for the f32 precision's kernels (qkernels, fp16 scales):
    a Q4_0 matrix is a Q4_1 one, a Q5_0 matrix a Q8_0 one. None where a scale is not
    an fp16 (a K-quant's products of two scales), or for the other formats."""
    if bm.type_name not in ("Q4_1", "Q8_0"):
        return None
    scales = [bm.d] if bm.m is None else [bm.d, bm.m]
    with np.errstate(over="ignore"):
        halves = [s.astype(np.float16) for s in scales]
    if not all(np.array_equal(h.astype(np.float32).view(np.uint32), s.view(np.uint32)) for h, s in zip(halves, scales)):
        return None
    fp16 = [h.view(np.uint8).reshape(*h.shape, 2) for h in halves]
    if bm.type_name == "Q4_1":
        q = bm.ints.astype(np.uint8)
        body = q[:, :, :16] | (q[:, :, 16:] << 4)
    else:
        body = bm.ints.astype(np.int8).view(np.uint8)
    return bm.type_name, np.concatenate([*fp16, body], axis=2).reshape(bm.shape[0], -1)

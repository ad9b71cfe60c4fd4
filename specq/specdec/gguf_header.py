"""A GGUF file's header, metadata and tensor table, read with `struct` from a memory
map; the tensors' bytes are views of the same map (nothing is copied).

gguf's own GGUFReader builds a numpy view for every value it parses: for the default
model's 49,152 tokens and 48,900 merges that took 2.1 to 2.7 s, paid by every command that
opens the model (submit's validation, each worker, generate, serve). This reads the
same file in about 0.1 s. Its values equal gguf's `field.contents()` for every key
of the default model and of the toy models (tests/specdec/test_gguf_header.py).

Format (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64,
key/value count u64; each key/value: key (u64 length + UTF-8), value type u32, value
(arrays: element type u32, count u64, elements); each tensor: name, dimension count
u32, dimensions u64 (innermost first), type u32, offset u64 from the data section,
which starts at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES

_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_DTYPE = {kind: np.dtype(fmt) for kind, fmt in _SCALAR.items()}
DEFAULT_ALIGNMENT = 32


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file this reader understands (said in words)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    ne: tuple[int, ...]  # dimensions as stored, innermost first
    tensor_type: GGMLQuantizationType
    data_offset: int  # from the start of the file
    n_bytes: int


class GGUFHeader:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        with open(path, "rb") as fh:
            try:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                raise GGUFFormatError("the file is empty") from None
        self._pos = 0
        try:
            self._parse()
        except struct.error:
            raise GGUFFormatError("the header runs past the end of the file (truncated)") from None

    def data(self, entry: TensorEntry) -> np.ndarray:
        """The tensor's stored bytes, a read-only view of the file."""
        if entry.data_offset + entry.n_bytes > len(self._map):
            raise GGUFFormatError(f"tensor {entry.name!r} ends past the end of the file (truncated)")
        return np.frombuffer(self._map, dtype=np.uint8, count=entry.n_bytes, offset=entry.data_offset)

    # --- parsing -------------------------------------------------------------------
    def _parse(self) -> None:
        magic, version = self._unpack("<4sI")
        if magic != b"GGUF":
            raise GGUFFormatError("not a GGUF file (its first bytes are not 'GGUF')")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_kv = self._unpack("<QQ")
        self._bounded(n_kv, 12, "metadata entries")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            (kind,) = self._unpack("<I")
            self.metadata[key] = self._value(kind)
        self._bounded(n_tensors, 24, "tensors")
        table = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            self._bounded(n_dims, 8, "dimensions")
            ne = self._unpack(f"<{n_dims}Q")
            type_id, offset = self._unpack("<IQ")
            table.append((name, tuple(int(d) for d in ne), type_id, offset))
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFormatError(f"general.alignment {alignment} is not a power of two")
        start = -(-self._pos // alignment) * alignment
        self.tensors: dict[str, TensorEntry] = {}
        for name, ne, type_id, offset in table:
            try:
                tensor_type = GGMLQuantizationType(type_id)
            except ValueError:
                raise GGUFFormatError(f"tensor {name!r} has an unknown type id {type_id}") from None
            block_size, block_bytes = GGML_QUANT_SIZES[tensor_type]
            n_values = math.prod(ne)  # Python's integers: corrupt dimensions cannot wrap around
            if n_values % block_size:
                raise GGUFFormatError(f"tensor {name!r}: {n_values} values are not whole {tensor_type.name} blocks")
            self.tensors[name] = TensorEntry(
                name, ne, tensor_type, start + offset, n_values // block_size * block_bytes
            )

    def _unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return values

    def _bounded(self, count: int, min_bytes: int, what: str) -> None:
        # A corrupt count must not make the reader loop for hours or allocate the moon.
        if count * min_bytes > len(self._map) - self._pos:
            raise GGUFFormatError(f"the header claims {count} {what}, more than the file can hold (corrupt)")

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        end = self._pos + length
        if end > len(self._map):
            raise GGUFFormatError("a string runs past the end of the file (truncated)")
        text = self._map[self._pos : end].decode("utf-8")
        self._pos = end
        return text

    def _value(self, kind: int) -> Any:
        if kind == GGUFValueType.STRING:
            return self._string()
        if kind == GGUFValueType.ARRAY:
            item_kind, count = self._unpack("<IQ")
            if item_kind == GGUFValueType.STRING:
                self._bounded(count, 8, "strings")
                return [self._string() for _ in range(count)]
            if item_kind in _DTYPE:
                dtype = _DTYPE[item_kind]
                self._bounded(count, dtype.itemsize, "array values")
                values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos)
                self._pos += count * dtype.itemsize
                return values.tolist()
            if item_kind == GGUFValueType.ARRAY:
                self._bounded(count, 12, "nested arrays")
                return [self._value(GGUFValueType.ARRAY) for _ in range(count)]
            raise GGUFFormatError(f"an array of unknown value type {item_kind}")
        if kind in _SCALAR:
            return self._unpack(_SCALAR[kind])[0]
        raise GGUFFormatError(f"unknown metadata value type {kind}")

"""Reading GGUF files: metadata as plain Python values, tensors as float32 arrays or
as their stored bytes (for the kernels that compute from quantized blocks). The
header is parsed by gguf_header (gguf's reader is 20 times slower on a real
vocabulary); dequantization is gguf's.

GGUF lists dimensions innermost first (ne0, ne1, ...); tensors come back in numpy
order, so a weight stored as [n_in, n_out] in GGUF arrives here as an (n_out, n_in)
array.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from specq.errors import ModelFileError
from specq.specdec.gguf_header import GGUFFormatError, GGUFHeader, TensorEntry

# Types this loader accepts; dequantization itself is gguf's, verified by the tests
# on toy models written in each of these types.
SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in (
        "F32",
        "F16",
        "BF16",
        "Q8_0",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
    )
)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first)
    type_name: str


@dataclass(frozen=True)
class RawTensor:
    """A tensor's data exactly as stored: no dequantization, no copy (memory-mapped)."""

    name: str
    type_name: str  # GGML type, e.g. "Q4_1"
    shape: tuple[int, ...]  # numpy order (outermost first), in values
    data: np.ndarray  # uint8 [rows, bytes per row]: rows = product of shape[:-1]


def write_file(writer: gguf.GGUFWriter) -> None:
    """Write a filled-in gguf.GGUFWriter's header, metadata and tensors, and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def file_sha256(path: str) -> str:
    """The file's sha256, remembered per (path, size, modification time): a command
    hashes its model once although it checks the configuration and loads the model."""
    st = os.stat(path)
    return _sha256_of(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


class GGUFFile:
    """A GGUF file opened for reading; tensors are dequantized on request."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ModelFileError(f"model file not found: {self.path}")
        try:
            self._header = GGUFHeader(self.path)
        except (GGUFFormatError, OSError, UnicodeDecodeError) as exc:
            raise ModelFileError(f"not a readable GGUF file (corrupt or truncated): {self.path} ({exc})") from exc
        self.metadata: dict[str, Any] = self._header.metadata
        self._tensors = self._header.tensors
        self._check_extent()

    def _check_extent(self) -> None:
        # A truncated download is the common corruption: the header parses but the
        # tensor data runs past the end of the file.
        size = os.path.getsize(self.path)
        for t in self._tensors.values():
            if t.data_offset + t.n_bytes > size:
                raise ModelFileError(f"GGUF file is truncated: tensor {t.name!r} ends past the end of {self.path}")

    def sha256(self) -> str:
        """Hex digest of the whole file: identifies the exact weights (heads files and
        checkpoints record it so that they are never used with another model)."""
        return file_sha256(self.path)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFileError(f"GGUF file {self.path} lacks metadata key {key!r}")
        return self.metadata[key]

    def number(self, key: str, kind: type = int, default: Any = ...) -> Any:
        """A metadata value as kind (int or float); required unless a default is
        given (returned as it is when the key is absent). A value of another type (a
        string, a list, a fractional count) is a ModelFileError naming the key, not a
        ValueError from deep in the loader."""
        if key not in self.metadata and default is not ...:
            return default
        value = self.require(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN
        if ok and kind is int:
            ok = float(value).is_integer()
        if not ok:
            what = "an integer" if kind is int else "a number"
            raise ModelFileError(f"GGUF file {self.path}: metadata key {key!r} is {value!r}, not {what}")
        return kind(value)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor_info(self, name: str) -> TensorInfo:
        t = self._tensor(name)
        return TensorInfo(name=name, shape=tuple(reversed(t.ne)), type_name=t.tensor_type.name)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as a float32 array in numpy order."""
        raw = self.raw_tensor(name)
        t = self._tensors[name]
        if t.tensor_type == GGMLQuantizationType.F32:
            data = np.array(raw.data.view(np.float32))
        else:
            data = dequantize(raw.data, t.tensor_type).astype(np.float32, copy=False)
        return data.reshape(raw.shape)

    def raw_tensor(self, name: str) -> RawTensor:
        """The tensor's stored bytes, one row of blocks per innermost row of values."""
        t = self._supported_tensor(name)
        shape = tuple(reversed(t.ne))
        block_size, block_bytes = GGML_QUANT_SIZES[t.tensor_type]
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))
        row_bytes = shape[-1] // block_size * block_bytes
        data = self._header.data(t)
        if shape[-1] % block_size or data.size != n_rows * row_bytes:
            raise ModelFileError(
                f"tensor {name!r} in {self.path}: {data.size} bytes are not a {t.tensor_type.name} "
                f"tensor of shape {shape} (whole blocks of {block_size} values, {block_bytes} bytes each)"
            )
        return RawTensor(name=name, type_name=t.tensor_type.name, shape=shape, data=data.reshape(n_rows, row_bytes))

    def _tensor(self, name: str) -> TensorEntry:
        if name not in self._tensors:
            raise ModelFileError(f"GGUF file {self.path} lacks tensor {name!r}")
        return self._tensors[name]

    def _supported_tensor(self, name: str) -> TensorEntry:
        t = self._tensor(name)
        if t.tensor_type not in SUPPORTED_TYPES:
            raise ModelFileError(f"unsupported tensor type {t.tensor_type.name} for {name!r} in {self.path}")
        return t

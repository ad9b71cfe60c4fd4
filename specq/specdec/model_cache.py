"""A loaded model kept on disk in the layout its products read, and memory-mapped.

Loading builds the kernels' layouts from the GGUF blocks (for the default model at
int16, 216 MB of arrays and 1.4 s), and each process held its own copy. Here the
first process to load a (model, precision) writes the built model to one file: the
object structure pickled (protocol 5), the arrays' bytes beside it, out of band,
each at a 64-byte boundary. Later loads map the file copy-on-write and hand pickle
the mapped bytes, so the arrays are views of the page cache: every process on the
machine shares one copy of the weights, and nothing is rebuilt.

The file name carries the model file's sha256, the precision, numpy's version and a
digest of this package's source, so a change to any layout (or to how arrays
pickle) builds a new file, and older ones of the same model are removed. A file
whose checksum does not match (truncated, damaged) is rebuilt. Unpickling accepts
only specq's and numpy's own classes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import mmap
import os
import pickle
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"SPECQMC1"
ALIGN = 64
# magic, sha256 of everything after the header, pickle length, buffer count
HEADER = struct.Struct("<8s32sQQ")
log = logging.getLogger("specq.model_cache")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """This package's source, numpy's version and the CPU's vector features: what the
    layouts (lanes per vector: 8 with AVX2, 16 with AVX-512) and the pickled
    structure depend on, so that a cache directory shared by machines of two kinds
    keeps a file for each."""
    from specq.specdec import vec

    digest = hashlib.sha256(np.__version__.encode())
    digest.update(",".join(sorted(f for f in vec.cpu_features() if f.startswith("avx"))).encode())
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_path(cache_dir: str | os.PathLike[str], model_sha256: str, precision: str) -> Path:
    return Path(cache_dir) / f"{model_sha256[:32]}-{precision}-{code_digest()}.model"


def load_or_build(
    cache_dir: str | os.PathLike[str], model_sha256: str, precision: str, build: Callable[[], Any]
) -> Any:
    """The cached model if its file is whole, else build() (then written for the next
    process; a cache that cannot be written is only slower, never an error)."""
    path = cache_path(cache_dir, model_sha256, precision)
    if path.exists():
        try:
            return read(path)
        except Exception as exc:  # noqa: BLE001 - a cache only saves time: whatever is wrong with it, rebuild
            log.warning("model cache %s unusable (%s: %s); rebuilding it", path, exc.__class__.__name__, exc)
    model = build()
    try:
        write(path, model)
        _remove_stale(path, model_sha256, precision)
    except Exception as exc:  # noqa: BLE001 - a disk full or a model that will not pickle costs time only
        log.warning(
            "cannot write the model cache %s (%s: %s); this process keeps its own copy",
            path,
            exc.__class__.__name__,
            exc,
        )
    return model


def write(path: Path, model: Any) -> None:
    buffers: list[pickle.PickleBuffer] = []
    structure = pickle.dumps(model, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".model-", dir=path.parent)
    try:
        with os.fdopen(fd, "w+b") as fh:
            fh.write(b"\0" * HEADER.size)
            digest = hashlib.sha256()

            def put(data: bytes | memoryview) -> None:
                fh.write(data)
                digest.update(data)

            table = []
            offset = HEADER.size + 16 * len(views) + len(structure)
            for view in views:
                offset = -(-offset // ALIGN) * ALIGN
                table.append((offset, view.nbytes))
                offset += view.nbytes
            put(b"".join(struct.pack("<QQ", *entry) for entry in table))
            put(structure)
            for (start, _), view in zip(table, views):
                put(b"\0" * (start - fh.tell()))
                put(view)
            fh.seek(0)
            fh.write(HEADER.pack(MAGIC, digest.digest(), len(structure), len(views)))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # whole or absent: a concurrent writer's file is as good
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(path: Path) -> Any:
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < HEADER.size:
            raise ValueError("shorter than its header")
        magic, checksum, n_structure, n_buffers = HEADER.unpack(fh.read(HEADER.size))
        if magic != MAGIC:
            raise ValueError("not a model cache file")
        digest = hashlib.sha256()
        while block := fh.read(1 << 22):
            digest.update(block)
        if digest.digest() != checksum:
            raise ValueError("checksum mismatch (damaged or truncated)")
        # Copy-on-write: the arrays are writable for numba's signatures, and never
        # written, so their pages stay the page cache's, shared.
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    table_end = HEADER.size + 16 * n_buffers
    entries = [struct.unpack_from("<QQ", view, HEADER.size + 16 * i) for i in range(n_buffers)]
    if any(start + length > size for start, length in entries) or table_end + n_structure > size:
        raise ValueError("a buffer runs past the end of the file")
    buffers = [view[start : start + length] for start, length in entries]
    return _Unpickler(io.BytesIO(view[table_end : table_end + n_structure]), buffers=buffers).load()


class _Unpickler(pickle.Unpickler):
    """Only the classes a model is made of: a file written by someone else cannot
    name a function to call."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = module.startswith(("specq.specdec.", "numpy.")) or module in ("numpy", "copyreg", "builtins")
        if not allowed or (
            module == "builtins" and name not in ("tuple", "list", "dict", "set", "frozenset", "object")
        ):
            raise pickle.UnpicklingError(f"model cache names {module}.{name}, which a model is not made of")
        return super().find_class(module, name)


def _remove_stale(current: Path, model_sha256: str, precision: str) -> None:
    """Files of the same model and precision from other versions of specq, and the
    half-written files of processes killed while writing (an hour old: not one that
    another process is writing now)."""
    for old in current.parent.glob(f"{model_sha256[:32]}-{precision}-*.model"):
        if old != current:
            old.unlink(missing_ok=True)
    for partial in current.parent.glob(".model-*"):
        with contextlib.suppress(OSError):
            if time.time() - partial.stat().st_mtime > 3600:
                partial.unlink()

"""Uploaded files, under $SPECQ_HOME/files: the bytes as sent, and a small JSON record
beside them. Ids carry 96 random bits, so they cannot be guessed; a file is written
to a temporary name and renamed, so a reader sees it whole or not at all."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

from specq.errors import InputError

# OpenAI's own limit on a batch input file.
MAX_FILE_BYTES = 200 * 2**20
FILE_ID_PREFIX = "file-"
PURPOSES = ("batch",)


class FileTooLarge(InputError):
    pass


@dataclass(frozen=True)
class StoredFile:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str

    def to_api(self) -> dict:
        return {**asdict(self), "object": "file", "status": "processed", "expires_at": None, "status_details": None}


class FileStore:
    def __init__(self, root: Path, max_bytes: int = MAX_FILE_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes
        root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _paths(self, file_id: str) -> tuple[Path, Path] | None:
        # Only ids this store could have made name a path: nothing else reaches the disk.
        body = file_id[len(FILE_ID_PREFIX) :]
        if not file_id.startswith(FILE_ID_PREFIX) or len(body) != 24 or not all(c in "0123456789abcdef" for c in body):
            return None
        return self.root / f"{file_id}.jsonl", self.root / f"{file_id}.json"

    async def add(self, filename: str, purpose: str, chunks: AsyncIterator[bytes]) -> StoredFile:
        file_id = FILE_ID_PREFIX + secrets.token_hex(12)
        data_path, meta_path = self._paths(file_id)
        size = 0
        fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise FileTooLarge(f"file is larger than the limit of {self.max_bytes} bytes")
                    fh.write(chunk)
            stored = StoredFile(file_id, size, int(time.time()), os.path.basename(filename or "upload.jsonl"), purpose)
            _write_atomically(meta_path, json.dumps(asdict(stored)).encode())
            os.replace(tmp, data_path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return stored

    def get(self, file_id: str) -> StoredFile | None:
        paths = self._paths(file_id)
        if paths is None or not paths[0].exists():
            return None
        try:
            return StoredFile(**json.loads(paths[1].read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def path(self, file_id: str) -> Path | None:
        paths = self._paths(file_id)
        return paths[0] if paths is not None and paths[0].exists() else None

    def list(self) -> list[StoredFile]:
        found = [self.get(p.stem) for p in self.root.glob(f"{FILE_ID_PREFIX}*.json")]
        return sorted((f for f in found if f is not None), key=lambda f: (f.created_at, f.id), reverse=True)

    def delete(self, file_id: str) -> bool:
        paths = self._paths(file_id)
        if paths is None or not paths[0].exists():
            return False
        for path in paths:
            path.unlink(missing_ok=True)
        return True


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".meta-", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)

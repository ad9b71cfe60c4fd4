"""Drops numba's cached machine code of the engine once any engine source changes.

Numba keeps each compiled function beside its source file and checks only that
file's contents when it loads it. A function that calls functions of another module
carries their code in its own cached copy: the layer stacks (layer_stack.py,
int8_stack.py) inline block_ops' freezing and attention. After a change to
block_ops.py alone (a `git pull` in an editable install, a branch switch, an image
whose NUMBA_CACHE_DIR outlives it) the stacks kept running the old code, and with a
changed cache layout that wrote out of bounds (`malloc(): corrupted top size`,
docs/performance.md, fifteenth session). So the whole engine's sources are hashed at
import (about 2 ms) and, when the hash moves, the caches of every package under this
one go, in the folders numba uses (__pycache__, or under NUMBA_CACHE_DIR); the next
use compiles afresh (minutes for everything). Every source counts, not only those
with compiled code: compiled code also keeps the module constants it read.

The hash at import is kept: a long-lived process (a worker) asks
`changed_since_import` now and then, and stops once the sources under it changed
(an upgrade in place). Run on, it would mix the old modules it holds with new ones it
imports later, and a signature it compiles after the change would save old code
under the new stamp, where the next process would load it.

Not covered: numba's per-user folder for a read-only install; a compile under way
when the sources change, or begun before the next heartbeat notices, which saves old
code; processes other than workers (`specq generate`, `specq bench`), which never
check: restart them after an upgrade.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

ENGINE = Path(os.path.abspath(__file__)).parent  # as numba names it: symbolic links kept
STAMP = "specq-sources.sha256"
CACHED_SUFFIXES = (".nbi", ".nbc")
_at_import: str | None = None  # the engine's hash when this process imported it


def _sources(root: Path) -> list[Path]:
    """The modules under root, without hidden files (an editor's lock links)."""
    return sorted(p for p in root.rglob("*.py") if not any(part.startswith(".") for part in p.relative_to(root).parts))


def sources_digest(root: Path) -> str:
    """One hash of every module under root: names and contents (a file that cannot
    be read counts by its name)."""
    digest = hashlib.sha256()
    for path in _sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        try:
            digest.update(path.read_bytes() + b"\0")
        except OSError:
            digest.update(b"unreadable\0")
    return digest.hexdigest()


def cache_folders(root: Path, cache_dir: str | None = None) -> Iterator[Path]:
    """Where numba keeps the compiled code of the modules under root: each package's
    __pycache__, or with NUMBA_CACHE_DIR its folder there (numba's name for it: the
    package's name, '_', the sha1 of its absolute path)."""
    cache_dir = os.environ.get("NUMBA_CACHE_DIR") if cache_dir is None else cache_dir
    packages = sorted({path.parent for path in _sources(root)})
    for package in packages:
        if cache_dir:
            absolute = os.path.abspath(package)
            yield Path(cache_dir) / f"{os.path.basename(absolute)}_{hashlib.sha1(absolute.encode()).hexdigest()}"
        else:
            yield package / "__pycache__"


def on_import() -> None:
    """specq.specdec's import: keeps the engine's hash and drops stale kernels."""
    global _at_import
    try:
        _at_import = sources_digest(ENGINE)
    except OSError:
        return
    drop_stale_kernels(ENGINE, digest=_at_import)


def changed_since_import() -> bool:
    """Whether the engine's sources on disk differ from those of this process's
    import (2 to 4 ms). A tree it cannot list now counts as changed: that is an
    upgrade or an uninstall under way."""
    if _at_import is None:
        return False
    try:
        return sources_digest(ENGINE) != _at_import
    except OSError:
        return True


def drop_stale_kernels(root: Path = ENGINE, cache_dir: str | None = None, digest: str | None = None) -> bool:
    """Deletes numba's cache files of the modules under root when their hash differs
    from the one stamped at the last deletion, then stamps the new one; whether it
    deleted. Never raises: a failure leaves the caches as they were, as numba would.
    Several processes may do this at once: numba reads a vanished file as a miss.
    `digest` is root's hash when the caller has it."""
    try:
        digest = digest or sources_digest(root)
        folders = list(cache_folders(root, cache_dir))
        stamp = folders[0] / STAMP if folders else root / "__pycache__" / STAMP
        try:
            if stamp.read_text() == digest:
                return False
        except OSError:
            pass
        for folder in folders:
            if folder.is_dir():
                for path in folder.iterdir():
                    if path.suffix in CACHED_SUFFIXES:
                        path.unlink(missing_ok=True)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=stamp.parent, prefix=STAMP)
        try:
            with os.fdopen(handle, "w") as out:
                out.write(digest)
            os.replace(partial, stamp)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    except OSError:  # a read-only install: numba caches per user then (above)
        return False
    return True

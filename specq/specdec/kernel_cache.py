"""Drops numba's cached machine code of the engine once any engine source changes.

Numba keeps each compiled function beside its source file and checks only that
file's contents when it loads it. A function that calls functions of another module
carries their code in its own cached copy: the layer stacks (layer_stack.py,
int8_stack.py) inline block_ops' freezing and attention. After a change to
block_ops.py alone (a `git pull` in an editable install, a branch switch) the stacks
kept running the old code, and with a changed cache layout that wrote out of bounds
(`malloc(): corrupted top size`, docs/performance.md, fifteenth session). So the
whole engine's sources are hashed at import (about 2 ms) and the caches of every
package under this one go when the hash moves; the next use compiles afresh (a few
minutes for everything). Every source counts, not only those with compiled code:
compiled code also keeps the module constants it read, wherever they live.

Not covered: caches numba keeps elsewhere, as it does when the install is read-only
(a per-user directory) or NUMBA_CACHE_DIR is set; a process that started before the
sources changed and saves its compiled code after.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

ENGINE = Path(__file__).resolve().parent
STAMP = "specq-sources.sha256"
CACHED_SUFFIXES = (".nbi", ".nbc")


def sources_digest(root: Path) -> str:
    """One hash of every .py file under root: names and contents."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def drop_stale_kernels(root: Path = ENGINE) -> bool:
    """Deletes numba's cache files under root when its sources' hash differs from the
    one stamped at the last deletion, then stamps the new one; whether it deleted.
    Several processes may do this at once: numba reads a vanished file as a miss."""
    digest = sources_digest(root)
    stamp = root / "__pycache__" / STAMP
    try:
        if stamp.read_text() == digest:
            return False
    except OSError:
        pass
    try:
        for folder in root.rglob("__pycache__"):
            for path in folder.iterdir():
                if path.suffix in CACHED_SUFFIXES:
                    path.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        partial = stamp.with_name(f"{STAMP}.{os.getpid()}")
        partial.write_text(digest)
        os.replace(partial, stamp)
    except OSError:  # a read-only install: numba caches elsewhere then (above)
        return False
    return True

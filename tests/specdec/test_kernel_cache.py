"""Numba's cached kernels go when any engine source changes (kernel_cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specq.specdec import kernel_cache
from specq.specdec.kernel_cache import STAMP, cache_folders, drop_stale_kernels, sources_digest


@pytest.fixture(autouse=True)
def _no_cache_dir(monkeypatch):
    """Caches in __pycache__ unless a test names a NUMBA_CACHE_DIR itself: the
    Dockerfile sets one, and a run of the suite there must not depend on it."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)


def _tree(root: Path) -> list[Path]:
    (root / "__pycache__").mkdir(parents=True)
    (root / "inner" / "__pycache__").mkdir(parents=True)
    (root / "ops.py").write_text("def f():\n    return 1\n")
    (root / "stack.py").write_text("from ops import f\n")
    (root / "inner" / "kernels.py").write_text("x = 1\n")
    cached = [
        root / "__pycache__" / "stack._run-10.py311.nbi",
        root / "__pycache__" / "stack._run-10.py311.1.nbc",
        root / "inner" / "__pycache__" / "kernels.g-3.py311.nbi",
    ]
    for path in cached:
        path.write_bytes(b"compiled")
    (root / "__pycache__" / "ops.cpython-311.pyc").write_bytes(b"bytecode")
    return cached


def test_a_first_run_drops_the_caches_and_stamps(tmp_path):
    cached = _tree(tmp_path)
    assert drop_stale_kernels(tmp_path)
    assert not any(path.exists() for path in cached)
    assert (tmp_path / "__pycache__" / "ops.cpython-311.pyc").exists()  # Python's own cache stays
    assert (tmp_path / "__pycache__" / STAMP).read_text() == sources_digest(tmp_path)


def test_unchanged_sources_keep_the_caches(tmp_path):
    cached = _tree(tmp_path)
    drop_stale_kernels(tmp_path)
    for path in cached:
        path.write_bytes(b"compiled again")
    assert not drop_stale_kernels(tmp_path)
    assert all(path.exists() for path in cached)


def test_a_change_to_any_module_drops_every_cache(tmp_path):
    # The case that corrupted memory: ops.py changed, stack.py (whose cached code
    # holds ops' old code) did not.
    cached = _tree(tmp_path)
    drop_stale_kernels(tmp_path)
    for path in cached:
        path.write_bytes(b"compiled again")
    (tmp_path / "ops.py").write_text("def f():\n    return 2\n")
    assert drop_stale_kernels(tmp_path)
    assert not any(path.exists() for path in cached)


def test_a_new_or_renamed_module_counts_as_a_change(tmp_path):
    _tree(tmp_path)
    before = sources_digest(tmp_path)
    (tmp_path / "ops.py").rename(tmp_path / "ops2.py")
    renamed = sources_digest(tmp_path)
    (tmp_path / "extra.py").write_text("")
    assert len({before, renamed, sources_digest(tmp_path)}) == 3


def test_a_read_only_tree_is_left_alone(tmp_path, monkeypatch):
    cached = _tree(tmp_path)

    def refuse(self, missing_ok=False):
        raise PermissionError(f"read-only: {self}")

    monkeypatch.setattr(Path, "unlink", refuse)
    assert not drop_stale_kernels(tmp_path)
    assert all(path.exists() for path in cached)
    assert not (tmp_path / "__pycache__" / STAMP).exists()


def test_with_numba_cache_dir_the_caches_there_go(tmp_path):
    """An image's NUMBA_CACHE_DIR may outlive its sources: the folders numba uses
    there (named as numba names them) are dropped and stamped instead."""
    from numba.core.caching import _CacheLocator

    root = tmp_path / "engine"
    _tree(root)
    cache_dir = tmp_path / "numba"
    folders = list(cache_folders(root, str(cache_dir)))
    named = {
        str(cache_dir / _CacheLocator.get_suitable_cache_subpath(str(p)))
        for p in (root / "ops.py", root / "inner" / "kernels.py")
    }
    assert {str(f) for f in folders} == named
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "ops.f-1.py311.nbi").write_bytes(b"compiled")
    assert drop_stale_kernels(root, str(cache_dir))
    assert not any((folder / "ops.f-1.py311.nbi").exists() for folder in folders)
    assert all((p.parent / "__pycache__").exists() for p in (root / "ops.py",))  # the tree's own are left
    assert not drop_stale_kernels(root, str(cache_dir))


def test_an_unreadable_or_hidden_file_never_breaks_the_import(tmp_path):
    """An editor's lock link (.#ops.py, pointing nowhere) or a module deleted mid-
    checkout must not make importing the engine raise."""
    _tree(tmp_path)
    (tmp_path / ".#ops.py").symlink_to(tmp_path / "nowhere")
    before = sources_digest(tmp_path)
    (tmp_path / "broken.py").symlink_to(tmp_path / "gone")
    assert sources_digest(tmp_path) != before  # counted by its name
    assert drop_stale_kernels(tmp_path)


def test_a_failure_leaves_no_partial_stamp(tmp_path, monkeypatch):
    _tree(tmp_path)

    def refuse(source, target):
        raise PermissionError("no")

    monkeypatch.setattr("os.replace", refuse)
    assert not drop_stale_kernels(tmp_path)
    assert [p.name for p in (tmp_path / "__pycache__").iterdir() if p.name.startswith(STAMP)] == []


def test_importing_the_engine_stamps_its_sources():
    stamp = next(cache_folders(kernel_cache.ENGINE)) / STAMP
    assert stamp.read_text() == sources_digest(kernel_cache.ENGINE)
    assert not drop_stale_kernels()  # and a second look finds it fresh


def test_this_process_sees_its_engine_unchanged():
    assert kernel_cache._at_import == sources_digest(kernel_cache.ENGINE)
    assert not kernel_cache.changed_since_import()


def test_a_change_after_import_is_seen(tmp_path, monkeypatch):
    """What a worker asks every heartbeat: an upgrade in place, or an uninstall."""
    cached = _tree(tmp_path)
    monkeypatch.setattr(kernel_cache, "ENGINE", tmp_path)
    monkeypatch.setattr(kernel_cache, "_at_import", None)
    assert not kernel_cache.changed_since_import()  # never imported: nothing to compare with
    kernel_cache.on_import()
    assert not any(path.exists() for path in cached)  # the import dropped this tree's caches
    assert not kernel_cache.changed_since_import()
    (tmp_path / "inner" / "kernels.py").write_text("x = 2\n")
    assert kernel_cache.changed_since_import()
    (tmp_path / "inner" / "kernels.py").write_text("x = 1\n")
    assert not kernel_cache.changed_since_import()
    for path in tmp_path.rglob("*.py"):
        path.unlink()
    assert kernel_cache.changed_since_import()

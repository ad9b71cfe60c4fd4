"""The built model shared through a memory-mapped file: a cached load computes the
very logits a fresh build does, nothing is rebuilt when the file is whole, a damaged
or hostile file is rebuilt (and never run), and old versions' files are removed."""

from __future__ import annotations

import os
import pickle
import struct
import time

import numpy as np
import pytest

from specq.specdec import int8, model_cache
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.head_screen import SCREEN_ROWS
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.model import LlamaModel, Segment

PRECISIONS = ["f32"] + (["int16", "int8"] if int8.AVAILABLE else [])


def logits(model: LlamaModel) -> np.ndarray:
    cache = model.new_cache(64)
    return model.forward([Segment(cache, tuple(range(1, 30)), 0, all_logits=True)])[0].logits


def never() -> LlamaModel:
    raise AssertionError("rebuilt although the cache file is whole")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_cached_load_computes_what_a_fresh_build_does(toy_model_file, tmp_path, precision):
    # Q4_1 blocks, as the default model's: the layer stacks and the int8 layouts are built.
    toy_model_path = toy_model_file(tensor_type="Q4_1", embedding_type="Q8_0")
    fresh = LlamaModel.load(toy_model_path, precision)
    first, _ = load_model_and_tokenizer(toy_model_path, precision, str(tmp_path))
    sha = GGUFFile(toy_model_path).sha256()
    mapped = model_cache.load_or_build(tmp_path, sha, precision, never)
    assert np.array_equal(logits(first), logits(fresh))
    assert np.array_equal(logits(mapped), logits(fresh))
    assert mapped.precision == precision and mapped.fingerprint == fresh.fingerprint
    assert fresh._stack is not None and mapped._stack is not None  # the compiled stacks' path, named not pickled


def test_a_used_model_is_written_without_its_timings_and_reads_back(toy_model_file, tmp_path):
    """A model that has decoded holds its head choice's timings (head_screen.HeadChoice):
    they are this process's moments, not the model's, so a cache file written from it
    keeps none, and the restricted unpickler reads it back."""
    toy_model_path = toy_model_file(tensor_type="Q4_1", embedding_type="Q8_0")
    model = LlamaModel.load(toy_model_path, PRECISIONS[-1])
    for _ in range(3):  # the first call of each path is not counted
        for screened in (True, False):
            model.head_choice.record(SCREEN_ROWS, screened, 0.001 if screened else 0.002)
    assert model.head_choice.cost(SCREEN_ROWS, True) is not None
    path = model_cache.cache_path(tmp_path, GGUFFile(toy_model_path).sha256(), model.precision)
    model_cache.write(path, model)
    mapped = model_cache.read(path)
    assert mapped.head_choice.cost(SCREEN_ROWS, True) is None and mapped.head_choice.screen(SCREEN_ROWS)
    assert model.head_choice.cost(SCREEN_ROWS, True) == 0.001 / SCREEN_ROWS  # the writer's own are kept
    assert np.array_equal(logits(mapped), logits(model))


def test_a_damaged_file_is_rebuilt(toy_model_path, tmp_path, caplog):
    sha = GGUFFile(toy_model_path).sha256()
    build = lambda: LlamaModel.load(toy_model_path)  # noqa: E731
    expected = logits(model_cache.load_or_build(tmp_path, sha, "f32", build))
    path = model_cache.cache_path(tmp_path, sha, "f32")
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # a weight's byte
    path.write_bytes(bytes(data))
    assert np.array_equal(logits(model_cache.load_or_build(tmp_path, sha, "f32", build)), expected)
    assert "checksum" in caplog.text
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    assert np.array_equal(logits(model_cache.load_or_build(tmp_path, sha, "f32", build)), expected)
    assert np.array_equal(logits(model_cache.load_or_build(tmp_path, sha, "f32", never)), expected)


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_file_naming_other_code_is_rebuilt_not_run(toy_model_path, tmp_path, caplog):
    """A cache file written by someone else, checksum and all, that names os.system:
    it reaches the unpickler, which refuses the name."""
    import hashlib

    sha = GGUFFile(toy_model_path).sha256()
    marker = tmp_path / "ran"
    path = model_cache.cache_path(tmp_path, sha, "f32")
    structure = pickle.dumps(_Payload(str(marker)), protocol=5)
    header = model_cache.HEADER.pack(model_cache.MAGIC, hashlib.sha256(structure).digest(), len(structure), 0)
    path.write_bytes(header + structure)
    model = model_cache.load_or_build(tmp_path, sha, "f32", lambda: LlamaModel.load(toy_model_path))
    assert "UnpicklingError" in caplog.text and "system" in caplog.text
    assert not marker.exists()
    assert isinstance(model, LlamaModel)
    assert np.array_equal(logits(model), logits(LlamaModel.load(toy_model_path)))


def test_files_of_other_versions_are_removed_and_an_unwritable_cache_only_costs_time(toy_model_path, tmp_path):
    sha = GGUFFile(toy_model_path).sha256()
    stale = tmp_path / f"{sha[:32]}-f32-0000000000000000.model"
    stale.write_bytes(b"old")
    killed_writer, busy_writer = tmp_path / ".model-killed", tmp_path / ".model-busy"
    killed_writer.write_bytes(b"half")
    busy_writer.write_bytes(b"half")
    os.utime(killed_writer, (time.time() - 7200, time.time() - 7200))
    other_precision = tmp_path / f"{sha[:32]}-int8-0000000000000000.model"
    other_precision.write_bytes(b"old")
    model_cache.load_or_build(tmp_path, sha, "f32", lambda: LlamaModel.load(toy_model_path))
    assert not stale.exists() and other_precision.exists()
    assert not killed_writer.exists() and busy_writer.exists()
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    model = model_cache.load_or_build(blocked / "sub", sha, "f32", lambda: LlamaModel.load(toy_model_path))
    assert isinstance(model, LlamaModel)


def test_the_header_bounds_are_checked(toy_model_path, tmp_path):
    sha = GGUFFile(toy_model_path).sha256()
    model_cache.load_or_build(tmp_path, sha, "f32", lambda: LlamaModel.load(toy_model_path))
    path = model_cache.cache_path(tmp_path, sha, "f32")
    data = path.read_bytes()
    magic, checksum, n_structure, n_buffers = model_cache.HEADER.unpack_from(data)
    forged = model_cache.HEADER.pack(magic, checksum, 2**40, n_buffers) + data[model_cache.HEADER.size :]
    path.write_bytes(forged)
    with pytest.raises((ValueError, struct.error)):
        model_cache.read(path)


class _BadStructure:
    def __reduce__(self):
        from specq.specdec.model_config import LlamaConfig

        return (LlamaConfig, ())  # allowed class, wrong arguments: a TypeError when read


def test_any_fault_of_the_cache_costs_time_only(toy_model_path, tmp_path, caplog):
    import hashlib

    sha = GGUFFile(toy_model_path).sha256()
    path = model_cache.cache_path(tmp_path, sha, "f32")
    structure = pickle.dumps(_BadStructure(), protocol=5)
    path.write_bytes(
        model_cache.HEADER.pack(model_cache.MAGIC, hashlib.sha256(structure).digest(), len(structure), 0) + structure
    )
    build = lambda: LlamaModel.load(toy_model_path)  # noqa: E731
    assert isinstance(model_cache.load_or_build(tmp_path, sha, "f32", build), LlamaModel)
    assert "TypeError" in caplog.text
    # A model that will not pickle is built and used all the same.
    other = tmp_path / "other"
    unpicklable = lambda: lambda: None  # noqa: E731
    assert callable(model_cache.load_or_build(other, sha, "f32", unpicklable))
    assert "this process keeps its own copy" in caplog.text

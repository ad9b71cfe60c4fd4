"""A batch's configuration: the precision it is decoded at survives the round trip
through Redis's JSON, is refused when unknown, defaults to f32 for batches written
before it existed, and keeps a worker's engines of two precisions apart."""

from __future__ import annotations

import json

import pytest

from specq.errors import ParameterError
from specq.requests.config import BatchConfig
from specq.requests.inputs import GenerationDefaults
from specq.specdec import int8
from specq.worker.context import load_for_batch


def config(**fields) -> BatchConfig:
    return BatchConfig(
        **{
            "model_path": "/m.gguf",
            "model_sha256": "ab" * 32,
            "proposer": "ngram",
            "defaults": GenerationDefaults(max_tokens=9, stop=("x",)),
            **fields,
        }
    )


def test_the_precision_survives_the_round_trip_through_json():
    c = config(precision="int8")
    stored = json.loads(json.dumps(c.to_dict()))
    assert stored["precision"] == "int8"
    assert BatchConfig.from_dict(stored) == c


def test_a_config_written_before_the_precision_existed_loads_as_f32():
    old = config().to_dict()
    del old["precision"]
    assert BatchConfig.from_dict(old) == config() and BatchConfig.from_dict(old).precision == "f32"


@pytest.mark.parametrize("bad", ["fp16", "F32", "", "int4"])
def test_an_unknown_precision_is_refused_naming_it_and_the_choices(bad):
    with pytest.raises(ParameterError) as excinfo:
        config(precision=bad)
    assert repr(bad) in str(excinfo.value) and "f32" in str(excinfo.value) and "int8" in str(excinfo.value)
    stored = {**config().to_dict(), "precision": bad}
    with pytest.raises(ParameterError):
        BatchConfig.from_dict(stored)


def test_the_engine_key_differs_by_precision():
    # A worker caches one engine per key: an f32 model must never serve an int8 batch.
    assert config(precision="f32").engine_key() != config(precision="int8").engine_key()
    assert config().engine_key() == config(precision="f32").engine_key()


def test_a_worker_without_avx2_refuses_an_int8_batch_before_reading_the_model(monkeypatch, tmp_path):
    # The model path does not exist: the CPU check comes first, with the one-line message.
    monkeypatch.setattr(int8.vec, "has_avx2", lambda: False)  # what such a CPU reports
    with pytest.raises(ParameterError, match="AVX2"):
        load_for_batch(config(model_path=str(tmp_path / "absent.gguf"), precision="int8"))


def test_sizes_parse_or_fail_in_one_line():
    from specq.requests.config import parse_size

    assert parse_size("4GiB") == parse_size("4 gib") == parse_size("4G") == 4 * 2**30
    assert parse_size("512MiB") == 512 * 2**20 and parse_size("1000000") == 1_000_000
    for bad in ("", "lots", "4 parsecs", "nan", "inf", "1e400", "-5", "0.5KiB"):
        with pytest.raises(ParameterError):
            parse_size(bad)

"""A checkpoint records the version of its precision's arithmetic: one made by other
numbers is sound but must not be continued (NumericsChanged carries what it had
done); one made before versions were recorded counts as version 1."""

from __future__ import annotations

import hashlib
import json

import pytest

from specq.requests import checkpoint
from specq.specdec.precision import NUMERICS_VERSIONS, numerics
from specq.specdec.state import DecodeState, GenerationRequest


def _state() -> DecodeState:
    return DecodeState(request=GenerationRequest(prompt_ids=(1, 2, 3), max_tokens=8), output_ids=(4, 5))


def _legacy(state: DecodeState, fp: str) -> str:
    """A checkpoint as written before numerics were recorded."""
    body = {"state": state.to_dict(), "fingerprint": fp}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({**body, "checksum": hashlib.sha256(canonical.encode()).hexdigest()})


def test_a_checkpoint_resumes_only_under_the_numerics_that_made_it():
    state = _state()
    text = checkpoint.encode(state, "fp", "int16.2")
    assert checkpoint.decode(text, "fp", "int16.2").output_ids == (4, 5)
    assert checkpoint.decode(text, "fp").output_ids == (4, 5)  # a reader that only shows progress
    with pytest.raises(checkpoint.NumericsChanged, match="'int16.2'.*'int16.3'.*starts again") as caught:
        checkpoint.decode(text, "fp", "int16.3")
    assert caught.value.state.output_ids == (4, 5)
    with pytest.raises(checkpoint.CheckpointError, match="another model or proposer"):
        checkpoint.decode(text, "other", "int16.2")  # the fingerprint is checked first


def test_the_numerics_are_covered_by_the_checksum():
    doc = json.loads(checkpoint.encode(_state(), "fp", "int16.1"))
    doc["numerics"] = "int16.2"  # edited by hand to pass as this worker's
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.decode(json.dumps(doc), "fp", "int16.2")


def test_a_checkpoint_from_before_numerics_were_recorded_is_version_1():
    state = _state()
    legacy = _legacy(state, "fp")
    assert checkpoint.decode(legacy, "fp", "f32.1").output_ids == (4, 5)
    with pytest.raises(checkpoint.NumericsChanged):
        checkpoint.decode(legacy, "fp", "int16.2")
    # int16's cache changed its values to 8 bits: its checkpoints from before start again.
    assert numerics("int16") == f"int16.{NUMERICS_VERSIONS['int16']}" != "int16.1"

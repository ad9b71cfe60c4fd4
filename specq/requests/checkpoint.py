"""A request's checkpoint: its decode state (committed output ids, whose length is the
random generator's counter, the adaptive draft statistics and the metrics), a
fingerprint of what decoded it, the version of its precision's arithmetic
(precision.numerics), and a checksum over them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from specq.errors import SpecqError
from specq.specdec.state import DecodeState


class CheckpointError(SpecqError):
    """A checkpoint that cannot be resumed here: corrupt, or made with another model."""


class NumericsChanged(CheckpointError):
    """A sound checkpoint made by arithmetic other than this worker's (another version
    of specq changed the precision's bits): the request must start again, and
    `state` is what it had done."""

    def __init__(self, message: str, state: DecodeState) -> None:
        super().__init__(message)
        self.state = state


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def fingerprint(model_sha256: str, proposer: str, proposer_file_sha256: str = "") -> str:
    """What must not change across a resume for the output to stay identical: the
    weights, and (for seeded sampling, whose draws depend on the drafts) the proposer."""
    return hashlib.sha256(_canonical([model_sha256, proposer, proposer_file_sha256]).encode()).hexdigest()


def encode(state: DecodeState, fp: str, numerics: str) -> str:
    body = {"state": state.to_dict(), "fingerprint": fp, "numerics": numerics}
    return _canonical({**body, "checksum": hashlib.sha256(_canonical(body).encode()).hexdigest()})


def decode(text: str, expected_fp: str | None, expected_numerics: str | None = None) -> DecodeState:
    """The state a checkpoint holds, checksum verified; with expected_fp, only if it
    was made by that model and proposer (None: a reader that only shows progress);
    with expected_numerics, only if made by that arithmetic, else NumericsChanged.
    A checkpoint without numerics (made before they were recorded) was made by
    version 1 of the precision."""
    try:
        doc = json.loads(text)
        body = {"state": doc["state"], "fingerprint": doc["fingerprint"]}
        if "numerics" in doc:
            body["numerics"] = doc["numerics"]
        checksum = doc["checksum"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointError("checkpoint is not valid JSON with state, fingerprint and checksum") from None
    if hashlib.sha256(_canonical(body).encode()).hexdigest() != checksum:
        raise CheckpointError("checkpoint checksum does not match its contents (corrupted)")
    if expected_fp is not None and body["fingerprint"] != expected_fp:
        raise CheckpointError(
            f"checkpoint was made with another model or proposer (fingerprint {body['fingerprint'][:12]}, "
            f"this worker's is {expected_fp[:12]}); refusing to resume it"
        )
    try:
        state = DecodeState.from_dict(body["state"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint state is malformed ({exc.__class__.__name__}: {exc})") from None
    if expected_numerics is not None:
        made = body.get("numerics", expected_numerics.rpartition(".")[0] + ".1")
        if made != expected_numerics:
            raise NumericsChanged(
                f"checkpoint was decoded with arithmetic {made!r}, this worker's is {expected_numerics!r} "
                "(another version of specq): the request starts again",
                state,
            )
    return state

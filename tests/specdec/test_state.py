from __future__ import annotations

import json

import pytest

from specq.errors import InputError, ParameterError
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import DecodeState, GenerationRequest, Metrics
from specq.specdec.stops import held_back, truncate_at_stop


def test_state_round_trips_through_json():
    state = DecodeState(
        request=GenerationRequest(
            prompt_ids=(1, 2, 3),
            max_tokens=9,
            sampling=SamplingParams(0.7, 5, 0.9, 11),
            accept="sample",
            stop=("END",),
            k=4,
        ),
        output_ids=(7, 8),
        metrics=Metrics().after_round(n_drafted=3, n_accepted=1, n_emitted=2, propose_s=0.1, verify_s=0.2),
    )
    back = DecodeState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state
    assert back.to_dict()["rng"] == {"seed": 11, "position": 2}


def test_inconsistent_or_foreign_state_is_refused():
    d = DecodeState(request=GenerationRequest(prompt_ids=(1,)), output_ids=(4,)).to_dict()
    d["rng"]["position"] = 0
    with pytest.raises(InputError, match="inconsistent"):
        DecodeState.from_dict(d)
    d["version"] = 99
    with pytest.raises(InputError, match="version"):
        DecodeState.from_dict(d)


def test_metrics_count_per_position():
    m = Metrics()
    m = m.after_round(n_drafted=3, n_accepted=2, n_emitted=3, propose_s=0, verify_s=0)
    m = m.after_round(n_drafted=2, n_accepted=0, n_emitted=1, propose_s=0, verify_s=0)
    assert m.drafted_per_position == (2, 2, 1)
    assert m.accepted_per_position == (1, 1, 0)
    assert (m.drafted, m.accepted, m.target_forwards, m.tau) == (5, 2, 2, 2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt_ids": ()},
        {"prompt_ids": (1,), "max_tokens": 0},
        {"prompt_ids": (1,), "k": 0},
        {"prompt_ids": (1,), "stop": ("",)},
    ],
)
def test_request_validation(kwargs):
    with pytest.raises((InputError, ParameterError)):
        GenerationRequest(**kwargs)


def test_held_back_is_the_longest_stop_prefix_suffix():
    assert held_back("hello wor", ("world",)) == 3
    assert held_back("hello", ("xyz",)) == 0
    assert held_back("abab", ("abc", "baba")) == 3  # "bab" begins "baba"


def test_truncate_at_stop_keeps_the_fewest_tokens():
    pieces = ["He", "llo", " wo", "rld", "!"]
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    assert truncate_at_stop([0, 1, 2, 3, 4], 2, ("o w",), decode) == (3, 4)
    assert truncate_at_stop([0, 1, 2], 1, ("xyz",), decode) is None
    # A stop straddling the previous round's text and the new tokens.
    assert truncate_at_stop([0, 1, 2, 3], 3, ("world",), decode) == (4, 6)

"""Prompts prefilled in pieces (Engine.prefill_rows): at the integer precisions a
prompt enters the cache a piece a round, the pieces of all prompts in a round
sharing one budget of rows, so that a long prompt joining a batch does not stall the
requests decoding beside it. A piece's rows get the bits the whole prompt would give
them (the compiled stack's rows depend on no split), so batched == single == resumed
stays exact; f32, whose prompts are BLAS's, keeps every prompt whole.

The toy prompts are a hundred-odd tokens, so the pieces are made small here
(PREFILL_PIECE_ROWS, 256 on the real model) to cut them into several."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specq.specdec import int8
from specq.specdec import model as model_module
from specq.specdec.engine import DecodeGroup, Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.proposers import NgramProposer, NoProposer
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import DecodeState, GenerationRequest

PIECE = 16


@pytest.fixture(scope="module")
def q4_path(toy_model_file):
    return toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0")


@pytest.fixture(scope="module", params=["int16", "int8"])
def integer(q4_path, request):
    if not int8.AVAILABLE:
        pytest.skip("the integer precisions need AVX2")
    return load_model_and_tokenizer(q4_path, request.param)


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    monkeypatch.setattr(model_module, "PREFILL_PIECE_ROWS", PIECE)


def prompt(n: int, seed: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(3, 300, size=n))


def whole_prompt_engine(model, tokenizer, proposer=None) -> Engine:
    engine = Engine(model, tokenizer, proposer or NoProposer())
    engine.prefill_rows = None  # every prompt in one forward, as before pieces
    return engine


class Recorder:
    """The segments of every forward (`method`: the model's forward, or _forward,
    which rebuild_cache calls): (rows, all_logits) each."""

    def __init__(self, model, monkeypatch, method: str = "forward") -> None:
        self.rounds: list[list[tuple[int, bool]]] = []
        real = getattr(type(model), method)

        def forward(this, segments):
            self.rounds.append([(seg.n, seg.all_logits) for seg in segments])
            return real(this, segments)

        monkeypatch.setattr(type(model), method, forward)


def test_a_long_prompt_joins_decoding_requests_a_piece_a_round(integer, monkeypatch):
    model, tokenizer = integer
    engine = Engine(model, tokenizer, NoProposer())
    assert engine.prefill_rows == PIECE
    short = GenerationRequest(prompt_ids=prompt(9, 1), max_tokens=40, adaptive=False, k=1)
    long = GenerationRequest(prompt_ids=prompt(121, 2), max_tokens=12, adaptive=False, k=1)
    whole = whole_prompt_engine(model, tokenizer)
    alone = [whole.run(short), whole.run(long)]

    group = DecodeGroup(engine)
    group.add("short", engine.start(short))
    for _ in range(3):
        group.round()
    group.add("long", engine.start(long))
    recorder = Recorder(model, monkeypatch)
    rounds_to_first_token = 0
    while not group.sessions["long"].state.output_ids:
        n_short = len(group.sessions["short"].state.output_ids)
        taken = dict(group.round())
        rounds_to_first_token += 1
        # The decoding request emits its token every round while the prompt goes in.
        assert len(taken["short"].output_ids) == n_short + 1
    assert rounds_to_first_token == math.ceil(len(long.prompt_ids) / PIECE)
    assert all(rows <= PIECE for r in recorder.rounds for rows, logits in r if not logits)
    assert [len(r) for r in recorder.rounds] == [2] * rounds_to_first_token  # one forward each round
    while not all(s.state.finished for s in group.sessions.values()):
        group.round()
    together = [group.sessions["short"].state, group.sessions["long"].state]
    assert [s.output_ids for s in together] == [s.output_ids for s in alone]
    assert together[1].metrics.target_forwards == alone[1].metrics.target_forwards
    assert together[1].metrics.prefill_seconds > 0


def test_the_prompts_of_a_round_share_one_budget_first_come_first_served(integer, monkeypatch):
    model, tokenizer = integer
    engine = Engine(model, tokenizer, NgramProposer())
    requests = [
        GenerationRequest(prompt_ids=prompt(n, 10 + n), max_tokens=14, k=3, sampling=SamplingParams(seed=n))
        for n in (40, 23, 7, 50)
    ]
    alone = [whole_prompt_engine(model, tokenizer, NgramProposer()).run(r) for r in requests]
    lone_pieces = [engine.run(r) for r in requests]  # a lone request's step takes every piece at once
    assert [s.output_ids for s in lone_pieces] == [s.output_ids for s in alone]

    recorder = Recorder(model, monkeypatch)
    states = engine.run_many(requests, group_size=4)
    assert [s.output_ids for s in states] == [s.output_ids for s in alone]
    prompt_rows = [sum(rows for rows, logits in r if not logits) for r in recorder.rounds]
    assert max(prompt_rows) == PIECE
    # 120 prompt rows: every round full until the last, nothing of a later prompt
    # before an earlier one is in.
    assert prompt_rows[: math.ceil(120 / PIECE)] == [PIECE] * 7 + [120 - 7 * PIECE]
    first = [sum(r[0][0] for r in recorder.rounds[:i]) for i in range(1, 4)]
    assert first == [16, 32, 40]  # the first prompt's pieces take the first rounds' budget whole


def test_a_resumed_request_rebuilds_its_cache_in_pieces_with_the_same_bits(integer, monkeypatch):
    """The prompt here is long enough that whole it would leave the stack (lowered
    to 64 rows, as a prompt of 1,024 does on the real model) and round differently."""
    model, tokenizer = integer
    monkeypatch.setattr(model_module, "_INTEGER_STACK_ROWS", 64)
    engine = Engine(model, tokenizer, NoProposer())
    req = GenerationRequest(prompt_ids=prompt(70, 3), max_tokens=30, adaptive=False, k=1)
    session = engine.session(engine.start(req))
    saved = {}
    while not session.state.finished:
        state = session.step()
        saved[len(state.output_ids)] = (state, session.last_hidden.copy())
    recorder = Recorder(model, monkeypatch, "_forward")
    for cut in (1, 17, len(session.state.output_ids) - 1):
        state, want = saved[cut]
        recorder.rounds.clear()
        resumed = engine.session(DecodeState.from_dict(json.loads(json.dumps(state.to_dict()))))
        n = len(state.all_ids) - 1
        assert [rows for ((rows, _),) in recorder.rounds] == [PIECE] * (n // PIECE) + [n % PIECE] * (n % PIECE > 0)
        assert resumed.last_hidden.view(np.uint32).tolist() == want.view(np.uint32).tolist(), cut
        for resumed_part, part in zip(resumed.cache.stored(n), session.cache.stored(n), strict=True):
            np.testing.assert_array_equal(resumed_part, part)


def test_a_request_dropped_mid_prefill_starts_its_prompt_again_and_decodes_the_same(integer):
    model, tokenizer = integer
    engine = Engine(model, tokenizer, NoProposer())
    req = GenerationRequest(prompt_ids=prompt(60, 4), max_tokens=10, adaptive=False, k=1)
    want = engine.run(req).output_ids
    group = DecodeGroup(engine)
    group.add(0, engine.start(req))
    group.round()
    group.round()
    state = group.drop(0)  # paused or handed back two pieces in: nothing was committed
    assert not state.output_ids
    group.add(0, DecodeState.from_dict(json.loads(json.dumps(state.to_dict()))))
    while not group.sessions[0].state.finished:
        group.round()
    assert group.sessions[0].state.output_ids == want


def test_f32_prefills_every_prompt_whole(q4_path, monkeypatch):
    model, tokenizer = load_model_and_tokenizer(q4_path, "f32")
    engine = Engine(model, tokenizer, NoProposer())
    assert engine.prefill_rows is None
    requests = [GenerationRequest(prompt_ids=prompt(n, n), max_tokens=4, adaptive=False, k=1) for n in (70, 30)]
    recorder = Recorder(model, monkeypatch)
    engine.run_many(requests, group_size=2)
    assert recorder.rounds[0] == [(70, False), (30, False)]


def test_a_rounds_costs_are_those_of_its_decoding_requests_not_of_prompts_waiting(integer):
    """A round's draft costs are asked for the requests decoding in it: prompts still
    going in have no plain round to share, and counting them made a few decoding
    requests look like many (and draft as if in a large round)."""
    from specq.specdec.draft_costs import MeasuredCosts

    class Asked(MeasuredCosts):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[tuple[int, int]] = []

        def for_round(self, rows: int, requests: int):
            self.asked.append((rows, requests))
            return None

    model, tokenizer = integer
    costs = Asked()
    engine = Engine(model, tokenizer, NgramProposer(), costs)
    group = DecodeGroup(engine)
    for i in range(4):
        group.add(i, engine.start(GenerationRequest(prompt_ids=prompt(40, 20 + i), max_tokens=30, k=2)))
    seen = set()
    while not all(s.state.finished for s in group.sessions.values()):
        decoding = sum(1 for s in group.sessions.values() if s.state.output_ids and not s.state.finished)
        before = len(costs.asked)
        group.round()
        assert costs.asked[before:] == ([(decoding, decoding)] if decoding > 1 else [])
        seen.add(decoding)
    assert {2, 3} <= seen, "rounds with prompts still waiting beside two or three decoding requests"

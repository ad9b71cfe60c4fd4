from __future__ import annotations

import json

import pytest

from specq.specdec.adaptive import ROW_COST, AcceptanceStats, choose_k
from specq.specdec.engine import Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.proposers import NgramProposer
from specq.specdec.proposers.base import Draft
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import DecodeState, GenerationRequest


def test_fresh_requests_draft_and_the_choice_follows_acceptance():
    # Prior 0.5 per position: k=1 emits 1.5 tokens for 1.4 steps (1.07 a step); k=2
    # emits 1.75 for 1.8 (0.97): one draft pays best until acceptance is measured.
    assert ROW_COST == 0.40
    assert choose_k(AcceptanceStats(), 6, 0.0) == 1
    good, bad = AcceptanceStats(), AcceptanceStats()
    for _ in range(30):
        good = good.after_round(6, 6)
        bad = bad.after_round(2, 0)
    # Always accepted: the decayed counts put c_0 at 10.58 / 11.58 = 0.914, and each
    # later position's prior is the estimate before it, so c_1 .. c_5 climb from 0.985
    # towards 1: all 6 drafts pay.
    assert [round(c, 3) for c in good.rates(3)] == [0.914, 0.985, 0.997]
    assert choose_k(good, 6, 0.0) == 6
    assert choose_k(bad, 6, 0.0) == 0
    # An expensive proposer needs better acceptance to be worth drafting.
    assert choose_k(AcceptanceStats(), 6, 1.0) == 0


def test_a_cheaper_plain_round_and_dearer_rows_need_better_drafts():
    """`base` and `row_cost` model other costs (scripts/replay_drafts.py): a request's
    share of a round of 8 is 0.5625 of a lone step, measured."""
    stats = AcceptanceStats()
    for i in range(30):
        stats = stats.after_round(1, 1 if i % 4 else 0)  # draft 0 right 3 times in 4
    # The decayed counts put c_0 at 0.70. Alone, one draft pays: 1.70 tokens for 1.4
    # steps, 1.21 a step against plain's 1. With a plain round of 0.5625 (1.78 tokens a
    # step), one draft with the head's cost gives 1.70 tokens for 1.02 steps, 1.66 a
    # step: not worth it. Nor alone at a row cost of 1.
    assert choose_k(stats, 4, 0.0) >= 1
    assert choose_k(stats, 4, 0.06, base=0.5625) == 0
    assert choose_k(stats, 4, 0.0, row_cost=1.0) == 0
    always = AcceptanceStats()
    for _ in range(30):
        always = always.after_round(4, 4)
    assert choose_k(always, 4, 0.06, base=0.5625) >= 1  # drafts that are always right still pay


def test_a_second_draft_is_tried_once_first_drafts_are_mostly_right():
    """An unexplored position's prior is the estimate of the position before it:
    after rounds whose single draft was right 9 times in 10, a second draft is tried,
    and a second draft that then keeps failing is dropped again."""
    stats = AcceptanceStats()
    for i in range(30):
        stats = stats.after_round(1, 0 if i % 10 == 0 else 1)
    assert stats.reached[1:] == ()  # position 1 never judged
    assert choose_k(stats, 4, 0.0) >= 2
    for _ in range(10):
        stats = stats.after_round(2, 1)  # first right, second wrong
    assert choose_k(stats, 4, 0.0) == 1


def test_only_judged_positions_count():
    stats = AcceptanceStats().after_round(4, 1)  # draft 0 accepted, draft 1 rejected, 2-3 never judged
    assert stats.reached == (1.0, 1.0, 0.0, 0.0)
    assert stats.accepted == (1.0, 0.0, 0.0, 0.0)


def test_a_request_that_stopped_drafting_tries_again_later():
    stats = AcceptanceStats()
    for _ in range(30):
        stats = stats.after_round(2, 0)
    assert choose_k(stats, 4, 0.0) == 0
    rounds = 0
    while choose_k(stats, 4, 0.0) == 0:
        stats = stats.after_round(0, 0)
        rounds += 1
    # Probes again, but not every round: one draft pays once its estimated acceptance
    # passes ROW_COST; from 1 / 11.58 after 30 failures, the idle decay takes the
    # count of judged rounds, 9.58, below 0.5 in 58 rounds (0.95 ** 58 = 0.051).
    assert 45 <= rounds <= 75


class WrongProposer:
    """Drafts tokens the toy model essentially never picks."""

    name = "wrong"
    draft_cost = 0.0

    def session(self):
        return self

    def propose(self, ctx, k):
        return Draft(tokens=tuple([0] * k))  # <|endoftext|>, never the argmax of the toy model


@pytest.fixture(scope="module")
def toy(toy_model_path):
    return load_model_and_tokenizer(toy_model_path)


def _req(tokenizer, **kwargs):
    ids = tuple(tokenizer.encode_chat([{"role": "user", "content": "the cat sat on the mat and the cat"}]))
    return GenerationRequest(prompt_ids=ids, max_tokens=60, k=4, **kwargs)


def test_adaptive_stops_paying_for_useless_drafts_and_keeps_the_output(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, WrongProposer())
    fixed = engine.run(_req(tokenizer, adaptive=False))
    adaptive = engine.run(_req(tokenizer, adaptive=True))
    assert adaptive.output_ids == fixed.output_ids
    assert fixed.metrics.accepted == 0 and fixed.metrics.drafted > 200
    assert adaptive.metrics.drafted < fixed.metrics.drafted / 4


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_adaptive_resume_equals_uninterrupted(toy, temperature):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, NgramProposer())
    req = _req(tokenizer, adaptive=True, sampling=SamplingParams(temperature=temperature, seed=9))
    whole = engine.run(req)
    state = engine.start(req)
    while not state.finished:
        state = engine.session(DecodeState.from_dict(json.loads(json.dumps(state.to_dict())))).step()
    assert state.output_ids == whole.output_ids
    assert state.metrics.drafted_per_position == whole.metrics.drafted_per_position
    assert state.acceptance == whole.acceptance


def test_the_integer_precisions_draft_on_their_cheaper_rows(toy_model_file):
    """A verification row costs 0.20 of a step at int16 and 0.16 at int8, against 0.40
    at f32: at the same measured acceptance, an integer-precision request drafts
    further (the engine reads the cost of its model's precision)."""
    from specq.specdec import int8
    from specq.specdec.adaptive import ROW_COSTS

    if not int8.AVAILABLE:
        pytest.skip("the integer precisions need AVX2")
    stats = AcceptanceStats()
    for i in range(30):
        stats = stats.after_round(3, 1 if i % 2 else 2)  # the first draft right, the second half the time
    assert [choose_k(stats, 4, 0.0, row_cost=ROW_COSTS[p]) for p in ("f32", "int16", "int8")] == [1, 2, 2]
    path = toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0")
    chosen = {}
    for precision in ("f32", "int16"):
        model, tokenizer = load_model_and_tokenizer(path, precision)
        engine = Engine(model, tokenizer, NgramProposer())
        state = engine.start(GenerationRequest(prompt_ids=(1, 42, 267), max_tokens=20, k=4))
        session = engine.session(DecodeState(request=state.request, acceptance=stats))
        chosen[precision] = session._draft_budget()
    assert chosen == {"f32": 1, "int16": 2}

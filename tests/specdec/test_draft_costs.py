"""Drafting by measured costs: the engine times its forwards and drafts, and a greedy
or race-rule request drafts by what rows cost in its round, its tokens unchanged; a
sample-rule request keeps the lone, constant figures, bit for bit; a fresh request explores; a
recurrent head's gate follows the row cost, and stays off where no gate pays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from model_helpers import random_recurrent_head

from specq.errors import ModelFileError
from specq.specdec.adaptive import AcceptanceStats
from specq.specdec.draft_costs import MAX_ROWS, REFIT_EVERY, MeasuredCosts, RoundCosts, prior_round_costs
from specq.specdec.engine import Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.proposers import DraftModelProposer, NoProposer, RecurrentHeadProposer
from specq.specdec.proposers.base import ProposeContext
from specq.specdec.proposers.recurrent import GateAtCost, format_gate_table, parse_gate_table
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import DecodeState, GenerationRequest

PROMPT = "the cat sat on the mat and the cat"


@pytest.fixture(scope="module")
def toy(toy_model_path):
    return load_model_and_tokenizer(toy_model_path)


class SaidCosts(MeasuredCosts):
    """Costs as a test says they are (real timings are the machine's), recording
    what the engine timed."""

    def __init__(self, row: float, draft: float = 0.0) -> None:
        super().__init__()
        self.said = RoundCosts(row=row, draft=draft)
        self.asked: list[tuple[int, int]] = []

    def for_round(self, rows: int, requests: int) -> RoundCosts | None:
        self.asked.append((rows, requests))
        return self.said


def _request(tokenizer, **kwargs) -> GenerationRequest:
    ids = tuple(tokenizer.encode_chat([{"role": "user", "content": PROMPT}]))
    kwargs.setdefault("max_tokens", 60)
    return GenerationRequest(prompt_ids=ids, k=4, adaptive=True, **kwargs)


def test_the_costs_are_the_slope_of_the_forward_time_over_a_requests_share():
    costs = MeasuredCosts()
    assert costs.for_round(8, 8) is None
    for _ in range(3):
        costs.record_forward(8, 0.026)
    costs.record_draft(2, 0.001)
    assert costs.for_round(8, 8) is None, "one row count gives no slope"
    for rows in range(1, 25):  # 10 ms + 2 ms a row
        for _ in range(3):
            costs.record_forward(rows, 0.010 + 0.002 * rows)
    round_of_8 = costs.for_round(8, 8)
    assert round_of_8.row == pytest.approx(0.002 / (0.026 / 8))  # 0.62 of a request's share
    assert round_of_8.draft == pytest.approx(0.0005 / (0.026 / 8))
    alone = costs.for_round(1, 1)
    assert alone.row == pytest.approx(0.002 / 0.012)
    # A request in a round of 8 pays a row far more dearly than one alone.
    assert round_of_8.row > 3 * alone.row


def test_timings_follow_the_machine_and_ignore_what_says_nothing():
    costs = MeasuredCosts()
    for _ in range(10):
        costs.record_draft(1, 0.0)
    for _ in range(2):
        costs.record_forward(4, 1.0)
        costs.record_forward(5, 1.2)
    assert costs.for_round(4, 4) is None, "two timings of a row count are not enough"
    for _ in range(20):
        costs.record_forward(4, 1.0)
        costs.record_forward(5, 1.2)
    assert costs.for_round(4, 4).row == pytest.approx(0.2 / 0.25)
    for _ in range(10):  # the machine got twice as slow
        costs.record_forward(4, 2.0)
        costs.record_forward(5, 2.4)
    assert costs.for_round(4, 4).row == pytest.approx(0.4 / 0.5)
    for _ in range(3):  # a few slow forwards (another process's burst) change nothing
        costs.record_forward(5, 60.0)
    costs.record_draft(1, 5.0)  # nor does one slow draft (a first call compiling)
    measured = costs.for_round(4, 4)
    assert measured.row == pytest.approx(0.4 / 0.5) and measured.draft == 0.0
    # Drafts cost their mean: free lookups and dearer head steps alternate.
    for seconds in (0.0, 0.3) * 15:
        costs.record_draft(1, seconds)
    refitted = costs.for_round(4, 4)  # after REFIT_EVERY timings: the bursts are in the medians' windows
    assert refitted.draft == pytest.approx(0.15 / 0.5, rel=0.05)
    assert refitted.row == pytest.approx(0.4 / 0.5)
    costs.record_forward(MAX_ROWS + 1, 1.0)  # a long prompt's forward
    costs.record_forward(3, -1.0)
    assert costs._samples[MAX_ROWS] == 0 and costs._samples[3] == 0
    noisy = MeasuredCosts()
    noisy.record_draft(1, 0.0)
    for _ in range(3):
        noisy.record_forward(6, 2.0)
        noisy.record_forward(7, 1.0)  # more rows, less time: noise, not a cost
    assert noisy.for_round(6, 6) is None


def test_an_engine_times_its_rounds_but_not_a_prefill(toy):
    model, tokenizer = toy
    costs = MeasuredCosts()
    engine = Engine(model, tokenizer, DraftModelProposer(model, draft_cost=0.0), costs)
    request = _request(tokenizer)
    engine.run_many([request] * 3, group_size=3)
    timed = set(np.flatnonzero(costs._samples))
    assert timed and min(timed) >= 3, "every round has a row of each of the 3 requests"
    assert len(request.prompt_ids) not in timed and 3 * len(request.prompt_ids) not in timed
    assert costs.draft_seconds() > 0
    assert all(costs._recent[rows, 0] > 0 for rows in timed)
    # (Whether a toy's sub-millisecond forwards show a slope is the machine's noise.)


RACE = {"accept": "race", "sampling": SamplingParams(temperature=0.8, top_p=0.95, seed=5)}


@pytest.mark.parametrize("requests", [2, 4])
@pytest.mark.parametrize("rule", [{}, RACE], ids=["greedy", "race"])
def test_requests_free_of_their_drafts_draft_by_the_costs_and_emit_the_same_tokens(toy, requests, rule):
    """Greedy requests, and sampled ones under the race rule, whose tokens are plain
    decoding's whatever they draft."""
    model, tokenizer = toy
    # The target itself, free: every draft is right (under the race rule too: the
    # draft runs the target's own race).
    proposer = DraftModelProposer(model, draft_cost=0.0)
    plain = Engine(model, tokenizer, NoProposer()).run(_request(tokenizer, **rule))
    # Dear: a draft must be right 90% of the time to pay; hopeless: none can.
    cheap, dear, hopeless = SaidCosts(row=0.01), SaidCosts(row=0.9), SaidCosts(row=50.0)
    drafted = {}
    for name, costs in (("cheap", cheap), ("dear", dear), ("hopeless", hopeless), ("lone", None)):
        states = Engine(model, tokenizer, proposer, costs).run_many(
            [_request(tokenizer, **rule)] * requests, group_size=4
        )
        assert all(s.output_ids == plain.output_ids for s in states), name
        drafted[name] = sum(s.metrics.drafted for s in states)
        if name == "dear":
            # Drafting only to explore: the first decode round, then once in 14 or more.
            for s in states:
                assert 1 <= s.metrics.drafted_per_position[0] <= 1 + s.metrics.target_forwards // 14
    assert (requests, requests) in dear.asked, "the round's rows and requests were asked about"
    assert drafted["cheap"] > drafted["lone"] > drafted["dear"] > drafted["hopeless"] == 0


class Untimed(MeasuredCosts):
    """Timings that never say enough (a group's first rounds; rounds with prompt
    pieces, which are not timed)."""

    def for_round(self, rows: int, requests: int) -> RoundCosts | None:
        return None


def test_until_timed_a_group_decides_by_the_constant_row_cost_over_a_share(toy, monkeypatch):
    """Without timings, a greedy request sharing its round decides by
    prior_round_costs, not by the lone figures: the round taken as one step plus the
    precision's constant row cost for each other request. At f32 (0.40 a row) with
    drafts costing 0.05 of a step, a draft in a round of 16 costs more than the
    request's share, so nobody drafts, not even to explore; in a round of 2 drafts
    still pay; by the lone figures all 16 drafted."""
    from specq.specdec import engine as engine_module

    prior = prior_round_costs(8, 0.2, 0.05)
    assert prior.row == pytest.approx(0.2 / 0.3) and prior.draft == pytest.approx(0.05 / 0.3)
    assert prior_round_costs(28, 0.2, 0.0).row == pytest.approx(0.875)
    model, tokenizer = toy
    assert model.precision == "f32"
    proposer = DraftModelProposer(model, draft_cost=0.05)
    plain = Engine(model, tokenizer, NoProposer()).run(_request(tokenizer, max_tokens=20))

    def drafted(n: int) -> int:
        engine = Engine(model, tokenizer, proposer, Untimed())
        states = engine.run_many([_request(tokenizer, max_tokens=20)] * n, group_size=n)
        assert all(s.output_ids == plain.output_ids for s in states)
        return sum(s.metrics.drafted for s in states)

    assert drafted(16) == 0
    assert drafted(2) > 0
    monkeypatch.setattr(engine_module, "prior_round_costs", lambda *args: None)
    assert drafted(16) >= 16


def test_a_request_alone_drafts_by_the_lone_figures(toy):
    model, tokenizer = toy
    proposer = DraftModelProposer(model, draft_cost=0.0)
    lone = Engine(model, tokenizer, proposer).run(_request(tokenizer))
    costs = SaidCosts(row=50.0)
    engine = Engine(model, tokenizer, proposer, costs)
    for state in (engine.run(_request(tokenizer)), engine.run_many([_request(tokenizer)], group_size=4)[0]):
        assert state.metrics.drafted_per_position == lone.metrics.drafted_per_position
        assert state.acceptance == lone.acceptance
    assert not costs.asked and costs._samples.sum() > 0, "timed, not asked"


def test_a_sample_rule_request_keeps_the_lone_figures_bit_for_bit(toy):
    model, tokenizer = toy
    proposer = DraftModelProposer(model, draft_cost=0.0)
    request = _request(tokenizer, accept="sample", sampling=SamplingParams(temperature=0.8, seed=5))
    other = replace(request, sampling=SamplingParams(temperature=0.8, seed=6))
    lone = Engine(model, tokenizer, proposer).run_many([request, other], group_size=2)
    for costs in (SaidCosts(row=0.01), SaidCosts(row=50.0)):
        states = Engine(model, tokenizer, proposer, costs).run_many([request, other], group_size=2)
        for state, alone in zip(states, lone):
            assert state.output_ids == alone.output_ids
            assert state.metrics.drafted_per_position == alone.metrics.drafted_per_position
            assert state.acceptance == alone.acceptance
        assert costs.asked, "asked, and not followed"


def test_a_request_explores_at_first_and_again_after_rounds_without_drafts(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, NoProposer(), SaidCosts(row=0.9))
    state = DecodeState(request=_request(tokenizer), output_ids=(42,))
    session = engine.session(state)
    dear = engine.costs.for_round(1, 1)
    assert session._draft_budget(dear) == 1, "fresh: drafts at the lone figures"
    stats = AcceptanceStats().after_round(1, 1)
    idle = 0
    while True:
        session.state = replace(state, acceptance=stats)
        if session._draft_budget(dear):
            break
        stats = stats.after_round(0, 0)
        idle += 1
    # One accepted draft puts c_0 at 0.67, short of the 0.9 a draft must be right to
    # pay; from there the idle decay (0.95 a round) takes 14 rounds below 0.5.
    assert idle == 14
    # Where a draft costs a plain round, not even one always right pays: no exploring.
    session.state = state
    assert session._draft_budget(RoundCosts(row=0.8, draft=0.2)) == 0
    assert session._draft_budget(RoundCosts(row=0.8, draft=0.1)) == 1


def test_a_recurrent_heads_gate_follows_the_row_cost(toy):
    model, _ = toy
    table = (GateAtCost(0.2, (0.3, 0.6), 1.12), GateAtCost(0.4, (0.7, 0.9), 1.01), GateAtCost(0.8, (0.95,), 0.8))
    head = random_recurrent_head(model)
    head = replace(head, metadata={**head.metadata, "gate_by_row_cost": format_gate_table(table)})
    proposer = RecurrentHeadProposer(model, head)
    assert proposer.gate_at(0.18) == (0.3, 0.6)
    assert proposer.gate_at(0.5) == (0.7, 0.9)  # nearer 0.4 than 0.8 on a log scale
    assert proposer.gate_at(0.7) is None  # the best gate there loses to plain decoding
    assert proposer.gate_at(None) == proposer.gate  # the lone gate of the file (none stored: 0.0)
    ctx = ProposeContext(
        tokens=(1, 5, 9),
        n_output=1,
        last_hidden=np.ones(model.config.d_model, np.float32),
        params=SamplingParams(),
        stochastic=False,
        want_p_draft=False,
    )
    assert proposer.propose(replace(ctx, row_cost=0.7), 4).tokens == ()
    assert len(proposer.propose(ctx, 4).tokens) == 4  # ungated
    # A gate the caller gives holds at every cost.
    assert RecurrentHeadProposer(model, head, gate=(0.0,)).gate_at(0.7) == (0.0,)


def test_a_gate_table_reads_back_and_a_broken_one_is_refused():
    table = (GateAtCost(0.1, (0.25, 0.55), 1.2372), GateAtCost(1.5, (0.95, 0.95), 0.6626))
    assert parse_gate_table(format_gate_table(table)) == table
    for text in ("", "0.2", "0.2:", "x:0.5,1.0", "0.2:1.5,1.1", "-1:0.5,1.0", "0.2:1.1"):
        with pytest.raises(ModelFileError, match="gate table"):
            parse_gate_table(text)


def test_a_fit_is_kept_for_a_few_timings_then_redone():
    costs = MeasuredCosts()
    costs.record_draft(1, 0.0)
    for rows in (4, 5):
        for _ in range(3):
            costs.record_forward(rows, 0.1 * rows)
    first = costs.for_round(4, 4)
    assert first.row == pytest.approx(0.1 / 0.1)
    for _ in range(REFIT_EVERY - 1):
        costs.record_forward(5, 0.7)
    assert costs.for_round(4, 4) is first, "kept"
    costs.record_forward(5, 0.7)
    assert costs.for_round(4, 4).row == pytest.approx(0.3 / 0.1), "redone after REFIT_EVERY timings"

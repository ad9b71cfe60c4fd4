"""Acceptance rules. The sample rule is checked statistically: over many seeded
trials, the tokens it emits must follow the target's distribution, whatever the
draft distribution (including adversarial ones)."""

from __future__ import annotations

import numpy as np
import pytest
from stats import chi_square, chi_square_critical

from specq.errors import ParameterError
from specq.specdec.acceptance import Verdict, accept, accept_greedy, accept_sample, accept_typical, resolve_rule
from specq.specdec.sampling import SamplingParams, probabilities, sample

V = 6  # a small vocabulary keeps every cell of the joint distribution well populated
TEMP1 = SamplingParams(temperature=1.0)


def _logits(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(p)


# A two-step "model": p_target(x0) = P0, p_target(x1 | x0) = P1[x0]; likewise for the draft.
RNG = np.random.default_rng(1234)
P0 = RNG.dirichlet(np.ones(V))
P1 = RNG.dirichlet(np.ones(V), size=V)


def _draft_cases() -> dict[str, tuple[np.ndarray, np.ndarray] | None]:
    rng = np.random.default_rng(99)
    disjoint = np.zeros(V)
    disjoint[:2] = [0.5, 0.5]
    target_support_0 = P0.copy()
    target_support_0[[2, 3]] = 0.0  # draft zero where target positive
    target_support_0 /= target_support_0.sum()
    return {
        "equal": (P0, P1),
        "random": (rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V), size=V)),
        "peaked": (rng.dirichlet(np.full(V, 0.1)), rng.dirichlet(np.full(V, 0.1), size=V)),
        "draft_zero_where_target_positive": (target_support_0, np.tile(target_support_0, (V, 1))),
        "disjoint_supports": None,  # built below from a target with restricted support
        "one_hot": None,
    }


def _run_two_tokens(q0, q1, trials: int, seed: int, *, one_hot: bool = False, p0=P0, p1=P1, rule=accept_sample):
    """Decode two tokens per trial with k=2 drafts a round, exactly as the engine
    does: the round starts at the first undecided position; its target rows are the
    target's conditionals given the drafted prefix."""
    gen = np.random.default_rng(seed)
    counts = np.zeros((V, V))
    for _ in range(trials):
        emitted: list[int] = []
        while len(emitted) < 2:
            if not emitted:
                if one_hot:
                    d0 = int(gen.integers(V))  # a deterministic guess, arbitrary per trial
                    d1 = int(gen.integers(V))
                    p_draft = None
                else:
                    d0 = sample(q0, gen.random())
                    d1 = sample(q1[d0], gen.random())
                    p_draft = np.stack([q0, q1[d0]])
                target_rows = np.stack([p0, p1[d0], np.full(V, 1.0 / V)])
                draft = (d0, d1)
            else:
                x0 = emitted[0]
                if one_hot:
                    d1, p_draft = int(gen.integers(V)), None
                else:
                    d1 = sample(q1[x0], gen.random())
                    p_draft = np.stack([q1[x0]])
                target_rows = np.stack([p1[x0], np.full(V, 1.0 / V)])
                draft = (d1,)
            verdict = rule(draft, p_draft, _logits(target_rows), TEMP1, lambda i, d: gen.random())
            emitted += list(draft[: verdict.n_accepted]) + [verdict.next_token]
        counts[emitted[0], emitted[1]] += 1
    return counts


@pytest.mark.parametrize("case", list(_draft_cases()))
def test_sample_rule_preserves_the_target_distribution(case):
    p0, p1 = P0, P1
    one_hot = case == "one_hot"
    if case == "disjoint_supports":
        # The target lives on tokens 3..5, the draft on tokens 0..2.
        p0 = np.r_[np.zeros(3), P0[3:] / P0[3:].sum()]
        p1 = np.tile(p0, (V, 1))
        q0 = np.r_[np.ones(3) / 3, np.zeros(3)]
        q1 = np.tile(q0, (V, 1))
    elif one_hot:
        q0 = q1 = None
    else:
        q0, q1 = _draft_cases()[case]
    counts = _run_two_tokens(q0, q1, trials=12000, seed=7, one_hot=one_hot, p0=p0, p1=p1)
    joint = p0[:, None] * p1  # [V, V]: the target's distribution of the first two tokens
    stat, dof = chi_square(counts.ravel(), joint.ravel())
    assert stat < chi_square_critical(dof), f"{case}: chi-square {stat:.1f} on {dof} dof"


def test_the_distribution_check_detects_a_biased_rule():
    """The statistical check has power: a rule that always accepts the draft (and
    so emits the draft's distribution) fails it."""

    def always_accept(draft, p_draft, logits, params, uniforms):
        bonus = sample(probabilities(logits[-1:], params)[0], uniforms(len(draft), 1))
        return Verdict(len(draft), bonus)

    q0 = np.random.default_rng(5).dirichlet(np.ones(V))
    q1 = np.tile(q0, (V, 1))
    counts = _run_two_tokens(q0, q1, trials=12000, seed=7, rule=always_accept)
    stat, dof = chi_square(counts.ravel(), (P0[:, None] * P1).ravel())
    assert stat > chi_square_critical(dof)


def test_identical_draft_is_always_accepted():
    gen = np.random.default_rng(0)
    for _ in range(200):
        rows = gen.dirichlet(np.ones(V), size=4)
        draft = tuple(sample(rows[i], gen.random()) for i in range(3))
        verdict = accept_sample(draft, rows[:3], _logits(rows), TEMP1, lambda i, d: gen.random())
        assert verdict.n_accepted == 3


def test_greedy_accepts_the_matching_prefix_then_emits_the_target_argmax():
    logits = np.full((4, V), -1.0)
    for row, best in enumerate([2, 4, 1, 5]):
        logits[row, best] = 3.0
    assert accept_greedy((2, 4, 1), logits).__dict__ == {"n_accepted": 3, "next_token": 5}
    assert accept_greedy((2, 0, 1), logits).__dict__ == {"n_accepted": 1, "next_token": 4}
    assert accept_greedy((0, 4, 1), logits).__dict__ == {"n_accepted": 0, "next_token": 2}
    assert accept_greedy((), logits[:1]).__dict__ == {"n_accepted": 0, "next_token": 2}


def test_sample_rule_at_temperature_zero_is_greedy():
    gen = np.random.default_rng(3)
    greedy = SamplingParams(temperature=0.0)
    for _ in range(100):
        logits = gen.normal(size=(4, V)) * 3
        draft = tuple(int(t) for t in gen.integers(V, size=3))
        expected = accept_greedy(draft, logits)
        got = accept_sample(draft, None, logits, greedy, lambda i, d: gen.random())
        assert got == expected


def test_typical_acceptance_keeps_plausible_tokens_and_rejects_implausible_ones():
    logits = np.log(np.array([[0.7, 0.2, 0.05, 0.05, 1e-9, 1e-9]] * 3))
    params = SamplingParams(temperature=1.0)
    assert accept_typical((0, 1), logits, params, lambda i, d: 0.0).n_accepted == 2
    assert accept_typical((0, 4), logits, params, lambda i, d: 0.0).n_accepted == 1
    assert accept_typical((4,), logits[:2], params, lambda i, d: 0.0).n_accepted == 0
    # At temperature 0 it is greedy.
    greedy = SamplingParams()
    assert accept_typical((0, 1), logits, greedy, lambda i, d: 0.0) == accept_greedy((0, 1), logits)


def test_resolve_rule():
    assert resolve_rule("auto", SamplingParams()) == "greedy"
    assert resolve_rule("auto", SamplingParams(temperature=0.8)) == "race"
    assert resolve_rule("sample", SamplingParams(temperature=0.8)) == "sample"
    assert resolve_rule("typical", SamplingParams(temperature=0.8)) == "typical"
    with pytest.raises(ParameterError, match="takes no temperature"):
        resolve_rule("greedy", SamplingParams(temperature=0.8))
    with pytest.raises(ParameterError, match="unknown acceptance rule 'fast'"):
        resolve_rule("fast", SamplingParams())


def test_accept_dispatch_checks_row_count():
    with pytest.raises(AssertionError):
        accept("greedy", (1, 2), None, np.zeros((2, V)), SamplingParams(), lambda i, d: 0.0)

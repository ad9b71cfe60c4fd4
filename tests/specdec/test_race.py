"""The race rule's sampling (sampling.race_index, sampling_kernels.race): the winner is
the least E(v) / w(v) of the whole row, whatever shortcut found it; it is distributed
as the warped distribution; a draft over part of the vocabulary races its tokens
with the target's noise; and acceptance keeps drafts exactly while they are the
target's winners."""

from __future__ import annotations

import numpy as np
import pytest
from stats import chi_square, chi_square_critical

from specq.specdec.acceptance import Verdict, accept, accept_race, drafts_free, resolve_rule
from specq.specdec.rng import race_key
from specq.specdec.sampling import SamplingParams, probabilities, race_index, race_indexes
from specq.specdec.sampling_kernels import race, race_uniforms

V = 4096
EMPTY = np.empty(0, dtype=np.int64)


def peaked_logits(seed: int, vocab: int = V) -> np.ndarray:
    """A model-like row: a flat mass of unlikely tokens and a few likely ones."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(vocab) * 2).astype(np.float32)
    logits[rng.integers(0, vocab, 12)] += 9
    return logits


def brute_force(w: np.ndarray, key: int, ids: np.ndarray | None = None) -> int:
    """The definition: the least -log U(v) / w(v) over every token of positive
    weight, the lowest index on ties."""
    u = race_uniforms(np.uint64(key), np.arange(len(w)) if ids is None else ids)
    ratio = np.full(len(w), np.inf)
    positive = w > 0
    ratio[positive] = -np.log(u[positive]) / w[positive]
    return int(np.argmin(ratio))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=20),
        SamplingParams(temperature=1.0, top_k=5, top_p=0.8),
    ],
)
def test_the_winner_is_the_least_ratio_over_the_whole_row(params):
    """The bound that settles most tokens with a hash and a compare, and the kept set
    of top_p and top_k, never change the winner."""
    rng = np.random.default_rng(1)
    for trial in range(60):
        logits = peaked_logits(trial)
        w = probabilities(logits[None], params)[0]
        key = int(rng.integers(0, 2**64, dtype=np.uint64))
        assert race_index(logits, params, key) == brute_force(w, key), trial


def test_a_draft_vocabulary_races_with_its_token_ids_noise():
    """Entry j of a row over part of the vocabulary is token ids[j] and gets that
    token's noise: when the draft's distribution is the target's (all of the target's
    mass inside the draft vocabulary), the draft's winner is the target's token, for
    every key."""
    rng = np.random.default_rng(2)
    ids = np.sort(rng.choice(V, size=V // 8, replace=False)).astype(np.int64)
    logits = np.full(V, -np.inf, dtype=np.float32)
    logits[ids] = peaked_logits(3, len(ids))
    params = SamplingParams(temperature=0.9)
    for trial in range(200):
        key = int(rng.integers(0, 2**64, dtype=np.uint64))
        target = race_index(logits, params, key)
        draft = race_index(logits[ids], params, key, ids)
        assert ids[draft] == target, trial
    w = probabilities(logits[ids][None], params)[0]
    assert race(w, np.uint64(7), ids, EMPTY) == brute_force(w, 7, ids)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=1.2, top_k=6),
    ],
)
def test_race_winners_follow_the_warped_distribution(params):
    """Over the keys of consecutive positions of a few seeds, as requests use them."""
    logits = np.array([2.0, 1.5, 1.4, 0.3, -0.5, 0.0, 1.0, -2.0, 0.7, 0.1], dtype=np.float32)
    p = probabilities(logits[None], params)[0]
    counts = np.zeros(len(p))
    for seed in range(4):
        for position in range(5000):
            counts[race_index(logits, params, race_key(seed, position))] += 1
    stat, dof = chi_square(counts, p)
    assert stat < chi_square_critical(dof), f"chi-square {stat:.1f} on {dof} dof"


def test_the_race_noise_is_uniform_and_differs_between_keys():
    u = race_uniforms(np.uint64(race_key(5, 0)), np.arange(200_000))
    assert 0 < u.min() and u.max() < 1
    counts = np.histogram(u, bins=32, range=(0, 1))[0]
    stat, dof = chi_square(counts.astype(float), np.full(32, 1 / 32))
    assert stat < chi_square_critical(dof)
    # Neighbouring keys (as hand-made keys are) give unrelated noise.
    a, b = (race_uniforms(np.uint64(k), np.arange(50_000)) for k in (1000, 1001))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02
    assert len({race_key(0, 0), race_key(0, 1), race_key(1, 0)}) == 3


def test_acceptance_keeps_drafts_while_they_are_the_targets_winners():
    params = SamplingParams(temperature=0.8, seed=3)
    rows = np.stack([peaked_logits(10 + i) for i in range(4)])

    def keys(i):
        return race_key(params.seed, 20 + i)

    winners = [race_index(rows[i], params, keys(i)) for i in range(4)]
    # All three right: every draft kept, then the bonus row's winner.
    assert accept_race(winners[:3], rows, params, keys) == Verdict(3, winners[3])
    # Wrong at the second: one kept, the target's own winner emitted in its place.
    wrong = (winners[1] + 1) % V
    verdict = accept("race", [winners[0], wrong, winners[2]], None, rows, params, None, keys)
    assert verdict == Verdict(1, winners[1])
    # No drafts: plain race sampling.
    assert accept_race([], rows[:1], params, keys) == Verdict(0, winners[0])


def test_the_race_rule_resolves_and_frees_the_drafts():
    sampled = SamplingParams(temperature=0.7)
    assert resolve_rule("race", sampled) == "race"
    assert resolve_rule("race", SamplingParams()) == "greedy"
    assert resolve_rule("auto", sampled) == "race"
    assert drafts_free("race", sampled) and drafts_free("greedy", SamplingParams())
    assert not drafts_free("sample", sampled) and not drafts_free("typical", sampled)


@pytest.mark.parametrize("n_rows", [1, 2, 3, 17])
def test_rows_raced_together_win_as_each_alone(n_rows):
    """sampling.race_indexes shares the rows among numba's threads, each with its own
    warp and key: every winner is race_index's for that row."""
    rng = np.random.default_rng(n_rows)
    choices = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.2, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=7),
        SamplingParams(temperature=0.5, top_k=40, top_p=0.8),
    ]
    rows = [peaked_logits(100 + i) for i in range(n_rows)]
    params = [choices[i % len(choices)] for i in range(n_rows)]
    keys = [int(k) for k in rng.integers(0, 2**64, n_rows, dtype=np.uint64)]
    assert race_indexes(rows, params, keys) == [race_index(r, p, k) for r, p, k in zip(rows, params, keys)]


def test_a_precomputed_first_winner_is_what_acceptance_would_race():
    """accept's first_race stands in for the first row's race: the verdicts agree
    whenever it is that row's winner."""
    params = SamplingParams(temperature=0.8)
    logits = np.stack([peaked_logits(200 + i) for i in range(3)])
    keys = [race_key(5, 40 + i) for i in range(3)]
    winners = [race_index(logits[i], params, keys[i]) for i in range(3)]
    for draft in ([], [winners[0]], [winners[0], winners[1]], [winners[0] + 1, 3]):
        rows = logits[: len(draft) + 1]
        plain = accept("race", draft, None, rows, params, None, keys.__getitem__)
        given = accept("race", draft, None, rows, params, None, keys.__getitem__, winners[0])
        assert given == plain

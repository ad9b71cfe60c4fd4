"""Choosing a recurrent head's confidence gate from held-out drafts and measured costs.

A round at a position computes the head's first step (draft_cost), drafts its guess
if the head's own probability for it reaches gate[0] (a verification row, row_cost),
then the next step, gated by gate[1], and so on; it emits 1 + the drafts accepted
before the first wrong one. The gate kept is the one with the most tokens per unit
of cost over the held-out positions. Deeper steps see the true earlier tokens (as
chain_ranks does): after a wrong draft the rest is rejected anyway, only its cost is
approximated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = tuple(round(0.05 * i, 2) for i in range(20))  # 0.0 .. 0.95


@dataclass(frozen=True)
class GateChoice:
    gate: tuple[float, float]  # for the first draft, and for each later one
    tokens_per_round: float  # expected, bonus included
    tokens_per_cost: float  # per unit of a one-row step
    ungated_tokens_per_cost: float  # the best fixed chain length without a gate, for comparison


def rate(
    confidence: np.ndarray, right: np.ndarray, gate: tuple[float, float], row_cost: float, draft_cost: float, depth: int
) -> tuple[float, float]:
    """(tokens per round, tokens per unit of cost) of rounds drafting up to `depth`."""
    n = len(confidence)
    tokens, cost = np.ones(n), np.ones(n)
    going = np.ones(n, bool)  # still drafting
    accepted = np.ones(n, bool)  # every draft so far right
    for j in range(depth):
        cost[going] += draft_cost
        going &= confidence[:, j] >= gate[min(j, 1)]
        cost[going] += row_cost
        accepted &= going & right[:, j]
        tokens[accepted] += 1
    return float(tokens.mean()), float(tokens.sum() / cost.sum())


def choose_gate(confidence: np.ndarray, right: np.ndarray, row_cost: float, draft_cost: float) -> GateChoice:
    """confidence, right: [positions, depth] from chain_ranks (the head's probability
    for its guess, and whether the guess is the label)."""
    depth = confidence.shape[1]
    best, best_rate, best_tokens = (0.0, 0.0), 0.0, 1.0
    for g1 in GRID:
        for g2 in GRID:
            tokens, r = rate(confidence, right, (g1, g2), row_cost, draft_cost, depth)
            if r > best_rate:
                best, best_rate, best_tokens = (g1, g2), r, tokens
    ungated = max(rate(confidence, right, (0.0, 0.0), row_cost, draft_cost, d)[1] for d in range(1, depth + 1))
    return GateChoice(best, best_tokens, best_rate, ungated)


# Row costs relative to a request's plain round at which the table picks a gate:
# alone a row costs 0.16 to 0.4 of a step (int8 to f32); in a decode group of 8 at
# int16 about 0.7 of a request's share of the round, of 32 about 0.9.
ROW_COST_GRID = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5)
# A head step's cost as a share of a row's: 0.06 against 0.20 alone at int16, and
# about 0.21 against 0.72 of a request's share in a round of 8 (measured,
# docs/performance.md), so one figure serves at every cost.
DRAFT_PER_ROW = 0.3


def gate_table(confidence: np.ndarray, right: np.ndarray) -> list[tuple[float, GateChoice]]:
    """The best gate at each row cost of ROW_COST_GRID, with what it expects: where
    even the best expects fewer tokens per unit of cost than plain decoding (1.0), a
    proposer reading the table does not draft with the head at that cost."""
    return [(cost, choose_gate(confidence, right, cost, DRAFT_PER_ROW * cost)) for cost in ROW_COST_GRID]

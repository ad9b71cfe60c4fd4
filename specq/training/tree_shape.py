"""Choosing the Medusa tree from measured ranks and the measured cost of a row.

For each held-out position, the path that verification would accept is the list of
ranks at which heads 0, 1, ... put the true tokens. A tree accepts, at a position,
as many tokens as its nodes on that path, so the expected number accepted is the sum
over its nodes of how often the node lies on the path: additive, so the best tree
of n nodes is the n most frequent paths (each path's parents are at least as
frequent, so that set is a tree). The size is then the one with the most tokens per
unit of cost, a round costing 1 + ROW_COST per node (specq.specdec.adaptive) plus
the heads' own products.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from specq.specdec.proposers.medusa import Path
from specq.training.features import NO_LABEL


@dataclass(frozen=True)
class TreeChoice:
    paths: list[Path]
    tokens_per_round: float  # expected: 1 + accepted drafts
    tokens_per_cost: float  # per unit of a one-row step
    chain_tokens_per_cost: float  # the best chain (top-1 guesses only), for comparison


def path_frequencies(ranks: np.ndarray, max_rank: int) -> Counter:
    """How often each path (ranks at depth 1, 2, ...) is a prefix of the true one."""
    counts: Counter = Counter()
    for row in ranks:
        path: tuple[int, ...] = ()
        for r in row:
            if r == NO_LABEL or r >= max_rank:
                break
            path += (int(r),)
            counts[path] += 1
    return counts


def choose_tree(
    ranks: np.ndarray, row_cost: float, head_cost: float, max_nodes: int = 24, max_rank: int = 8
) -> TreeChoice:
    """The tree of at most max_nodes nodes with the most expected tokens per unit of
    cost; head_cost is the cost of one head's product, per depth level used."""
    n = len(ranks)
    counts = path_frequencies(ranks, max_rank)
    ordered = sorted(counts, key=lambda p: (-counts[p], len(p), p))

    def rate(paths: list[Path]) -> tuple[float, float]:
        tokens = 1.0 + sum(counts[p] for p in paths) / n
        depth = max((len(p) for p in paths), default=0)
        return tokens, tokens / (1.0 + row_cost * len(paths) + head_cost * depth)

    best: list[Path] = []
    best_tokens, best_rate = rate(best)
    for size in range(1, min(max_nodes, len(ordered)) + 1):
        tokens, r = rate(ordered[:size])
        if r > best_rate:
            best, best_tokens, best_rate = ordered[:size], tokens, r
    chain_rate = max(rate([(0,) * d for d in range(1, m + 1)])[1] for m in range(0, ranks.shape[1] + 1))
    return TreeChoice(sorted(best, key=lambda p: (len(p), p)), best_tokens, best_rate, chain_rate)

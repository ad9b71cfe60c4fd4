"""The proposer protocol shared by every way of drafting tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specq.specdec.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """k proposed tokens and, for a stochastic proposer, the distribution each was
    drawn from. `p_draft` None means one-hot: the proposer was deterministic.

    A tree draft (`parents` given) holds alternatives: token i continues token
    parents[i], or the committed text when that is -1; parents come before their
    children. Only the greedy rule verifies trees."""

    tokens: tuple[int, ...] = ()
    p_draft: np.ndarray | None = None  # [k, V], or None
    parents: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        assert self.p_draft is None or self.p_draft.shape[0] == len(self.tokens)
        assert self.parents is None or (len(self.parents) == len(self.tokens) and self.p_draft is None)

    @property
    def depth(self) -> int:
        """The most tokens this draft can add: its length, or its tree's depth."""
        if self.parents is None:
            return len(self.tokens)
        depths: list[int] = []
        for parent in self.parents:
            depths.append(depths[parent] + 1 if parent >= 0 else 1)
        return max(depths, default=0)


@dataclass(frozen=True)
class ProposeContext:
    """What a proposer may look at. `tokens` is the prompt plus the committed output;
    its last token has been emitted but not yet fed to the target, so the first
    draft token is a guess for output position `n_output`."""

    tokens: Sequence[int]
    n_output: int
    last_hidden: np.ndarray  # [d]: the target's final hidden state that predicted tokens[-1]
    params: SamplingParams
    stochastic: bool  # draw drafts from the draft distribution (the sample rule's uniforms) rather than argmax
    want_p_draft: bool  # the acceptance rule needs p_draft
    # Draft each position's race winner over the draft's distribution, keyed as the
    # target's race there (the race rule; rng.race_key): drafts coupled to the draw
    # the target will make, so they match it as often as the coupling allows.
    race: bool = False
    tree_ok: bool = False  # the rule is greedy, which verifies tree drafts
    max_rows: int = 0  # a tree may have at most this many tokens (cache and context room); 0: k
    # A verification row's cost relative to the request's share of this round, when
    # the engine measured it (greedy requests, specdec/draft_costs.py); None: the
    # proposer drafts by the lone figures its gate was chosen for.
    row_cost: float | None = None


class ProposerSession(Protocol):
    """Per-sequence proposing: may hold state (a draft model's KV cache) that is a
    cache only. A fresh session given the same context proposes the same draft, so
    a resumed decode needs nothing from the interrupted one."""

    def propose(self, ctx: ProposeContext, k: int) -> Draft: ...


class Proposer(Protocol):
    """Shared, read-only resources (weights); one session per sequence."""

    name: str
    draft_cost: float  # cost of drafting one token, relative to one target step

    def session(self) -> ProposerSession: ...

"""The proposer protocol shared by every way of drafting tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from specq.specdec.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """k proposed tokens and, for a stochastic proposer, the distribution each was
    drawn from. `p_draft` None means one-hot: the proposer was deterministic."""

    tokens: tuple[int, ...] = ()
    p_draft: np.ndarray | None = None  # [k, V], or None

    def __post_init__(self) -> None:
        assert self.p_draft is None or self.p_draft.shape[0] == len(self.tokens)


@dataclass(frozen=True)
class ProposeContext:
    """What a proposer may look at. `tokens` is the prompt plus the committed output;
    its last token has been emitted but not yet fed to the target, so the first
    draft token is a guess for output position `n_output`."""

    tokens: Sequence[int]
    n_output: int
    last_hidden: np.ndarray  # [d]: the target's final hidden state that predicted tokens[-1]
    params: SamplingParams
    stochastic: bool  # draw drafts from the draft distribution (the sample rule) rather than argmax
    want_p_draft: bool  # the acceptance rule needs p_draft


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

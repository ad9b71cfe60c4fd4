"""No proposals: plain autoregressive decoding through the speculative code path."""

from __future__ import annotations

from specq.specdec.proposers.base import Draft, ProposeContext


class NoProposer:
    name = "none"
    draft_cost = 0.0

    def session(self) -> NoProposer:
        return self

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        return Draft()

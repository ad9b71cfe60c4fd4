"""Prompt lookup where the text repeats, heads (recurrent or Medusa) elsewhere.

Lookup proposes long, nearly free, runs when the output copies its context
(summaries, answers over a given text, code edits); the heads cost a little and
guess a few tokens of new text. A lookup match of at least MIN_MATCH tokens is
taken: a single matching token is too weak a sign of copying, and the heads usually
do better there (docs/performance.md has the measurements).
"""

from __future__ import annotations

from specq.specdec.proposers.base import Draft, ProposeContext
from specq.specdec.proposers.medusa import MedusaProposer
from specq.specdec.proposers.ngram import NgramProposer, lookup

MIN_MATCH = 2


class HybridProposer:
    name = "hybrid"

    def __init__(self, ngram: NgramProposer, medusa: MedusaProposer, min_match: int = MIN_MATCH) -> None:
        self.ngram, self.medusa = ngram, medusa
        self.min_match = max(min_match, ngram.min_ngram)
        # Charged as Medusa: the adaptive length must not assume free drafts when most
        # rounds of open text draft with the heads.
        self.draft_cost = medusa.draft_cost

    def session(self) -> HybridProposer:
        return self

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        copied = lookup(ctx.tokens, k, self.ngram.max_ngram, self.min_match)
        if copied:
            return Draft(tokens=tuple(copied))
        return self.medusa.propose(ctx, k)

"""A smaller model with the same vocabulary drafts k tokens autoregressively."""

from __future__ import annotations

import numpy as np

from specq.specdec.model import LlamaModel, Segment
from specq.specdec.proposers.base import Draft, ProposeContext
from specq.specdec.rng import DRAW_PROPOSE, race_key, uniform
from specq.specdec.sampling import probabilities, race_index, sample


class DraftModelProposer:
    name = "draft"

    def __init__(self, model: LlamaModel, draft_cost: float = 0.5) -> None:
        """`draft_cost`: one draft step relative to one target step (the loader passes
        the ratio of the two models' parameter counts)."""
        self.model = model
        self.draft_cost = draft_cost

    def session(self) -> DraftModelSession:
        return DraftModelSession(self.model)


class DraftModelSession:
    """Keeps the draft model's KV cache for one sequence. The cache is only an
    optimisation: `fed` records which tokens its positions hold, and whatever no
    longer matches the committed tokens (rejected drafts) is simply overwritten."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.cache = model.new_cache()
        self.fed: list[int] = []

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        tokens = list(ctx.tokens)
        k = min(k, self.model.config.context_length - len(tokens))
        if k <= 0:
            return Draft()
        # Re-feed at least the last token: its logits give the first draft.
        start = min(_common_prefix(self.fed, tokens), len(tokens) - 1)
        logits = self._feed(tokens[start:], start)
        drafted: list[int] = []
        rows: list[np.ndarray] = []
        for i in range(k):
            if ctx.race:
                token = race_index(logits[0], ctx.params, race_key(ctx.params.seed, ctx.n_output + i))
            elif ctx.want_p_draft or ctx.stochastic:
                dist = probabilities(logits, ctx.params)[0]  # [V]
                rows.append(dist)
                if ctx.stochastic:
                    token = sample(dist, uniform(ctx.params.seed, ctx.n_output + i, DRAW_PROPOSE))
                else:
                    token = int(np.argmax(logits))
            else:
                token = int(np.argmax(logits))
            drafted.append(token)
            if i + 1 < k:
                logits = self._feed([token], len(self.fed))
        p_draft = np.stack(rows) if ctx.want_p_draft else None
        return Draft(tokens=tuple(drafted), p_draft=p_draft)

    def _feed(self, tokens: list[int], start: int) -> np.ndarray:
        out = self.model.forward([Segment(self.cache, tokens, start, all_logits=False)])[0]
        self.fed = self.fed[:start] + tokens
        return out.logits  # [1, V]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n

"""Prompt lookup (Saxena 2023): find the latest earlier occurrence of the last n
tokens in prompt plus output and propose what followed it. Deterministic, so its
draft distribution is one-hot."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from specq.errors import ParameterError
from specq.specdec.proposers.base import Draft, ProposeContext


class NgramProposer:
    name = "ngram"
    draft_cost = 0.0  # a lookup takes well under 1% of a target step

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ParameterError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_ngram}..{max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def session(self) -> NgramProposer:
        return self

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        return Draft(tokens=tuple(lookup(ctx.tokens, k, self.max_ngram, self.min_ngram)))


def lookup(tokens: Sequence[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k tokens that followed the latest earlier match of the longest suffix
    of `tokens` (longest n first, from max_ngram down to min_ngram)."""
    seq = np.asarray(tokens, dtype=np.int64)
    length = len(seq)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # Windows over seq[:-1] start at 0..length-1-n, so every match is strictly
        # earlier than the suffix itself and has at least one token after it.
        windows = sliding_window_view(seq[:-1], n)  # [length - n, n]
        hits = np.flatnonzero((windows == seq[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start : start + k].tolist()
    return []

"""Prompt lookup (Saxena 2023): find the latest earlier occurrence of the last n
tokens in prompt plus output and propose what followed it. Deterministic, so its
draft distribution is one-hot."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

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
    start = _latest_match(seq, max_ngram, min_ngram)
    return seq[start : start + k].tolist() if start >= 0 else []


# Compiled: numpy's version (a sliding window compared whole for each n) took 60 to
# 90 us a round at a few hundred tokens when nothing matched, about 2% of a step;
# searching back from the end stops at the latest match and compares a window only
# while it agrees.
@njit("int64(int64[::1], int64, int64)", cache=True, nogil=True)
def _latest_match(seq: np.ndarray, max_ngram: int, min_ngram: int) -> int:  # pragma: no cover - compiled
    """Where the tokens after the latest earlier match of seq's longest suffix begin
    (-1: none). A match of n tokens starts at 0..len - 1 - n, strictly before the
    suffix, so at least one token follows it."""
    length = seq.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        for s in range(length - 1 - n, -1, -1):
            j = 0
            while j < n and seq[s + j] == seq[length - n + j]:
                j += 1
            if j == n:
                return s + n
    return -1

"""Sampling parameters and the warping of logits into target/draft distributions.

The same warp (temperature, then top-k, then top-p) is applied to the target's and
the draft's logits: the sample rule is exact with respect to the *warped* target
distribution, which is what plain sampling would have drawn from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specq.errors import ParameterError

SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy: the distribution is the argmax, one-hot
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t) or t < 0:
            raise ParameterError(f"temperature must be a finite number >= 0, got {t!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ParameterError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0 < p <= 1:
            raise ParameterError(f"top_p must be in (0, 1], got {p!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= SEED_MAX:
            raise ParameterError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict) -> SamplingParams:
        return cls(temperature=d["temperature"], top_k=d["top_k"], top_p=d["top_p"], seed=d["seed"])


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Warped distributions, one per row of `logits` [n, V] -> [n, V] float64 rows
    summing to 1. Greedy parameters give the one-hot argmax (lowest id on ties)."""
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    n, vocab = logits.shape
    if params.greedy:
        out = np.zeros((n, vocab))
        out[np.arange(n), logits.argmax(axis=1)] = 1.0
        return out
    z = logits / params.temperature
    if 0 < params.top_k < vocab:
        kth = np.partition(z, vocab - params.top_k, axis=1)[:, vocab - params.top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max(axis=1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    return probs


# Far above the rounding of a cumulative sum of probabilities (about 1e-16 a term).
_TOP_P_MARGIN = 1e-9


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p: in the
    order of decreasing probability (lower id first on ties), every token whose mass
    before it is below top_p (so the token that crosses top_p is kept)."""
    keep = np.zeros(probs.shape, dtype=bool)
    for row, out in zip(probs, keep):
        out[_top_p_ids(row, top_p)] = True
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=1, keepdims=True)


def _top_p_ids(row: np.ndarray, top_p: float) -> np.ndarray:
    """The kept ids of one row. Sorting all 49,152 probabilities of every row at every
    step cut a batch of 32 sampled requests to a third of its tokens/s; the kept set is nearly
    always small, so only the most likely m tokens are sorted, m growing until
    their mass passes top_p. The result is the full sort's: the candidates are every
    token at least as likely as the m-th, so their order and cumulative sums are the
    full order's first ones, term for term, and a token outside them has at least
    their whole mass before it (less a rounding the margin covers)."""
    vocab = len(row)
    m = 64
    while m < vocab:
        kth = np.partition(row, vocab - m)[vocab - m]
        candidates = np.flatnonzero(row >= kth)  # ascending ids: the stable sort keeps ties so
        order = candidates[np.argsort(-row[candidates], kind="stable")]
        ids = _kept_prefix(row[order], order, top_p)
        if ids is not None:
            return ids
        m *= 8
    order = np.argsort(-row, kind="stable")
    return order[np.cumsum(row[order]) - row[order] < top_p]


def _kept_prefix(sorted_probs: np.ndarray, order: np.ndarray, top_p: float) -> np.ndarray | None:
    cumulative = np.cumsum(sorted_probs)
    if cumulative[-1] < top_p + _TOP_P_MARGIN:
        return None  # tokens beyond these might be kept too
    return order[cumulative - sorted_probs < top_p]


def sample(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from one distribution [V] with a uniform u in [0, 1)."""
    cdf = np.cumsum(probs)
    idx = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    idx = min(idx, len(probs) - 1)
    # Only rounding can push u * total past the last step of the CDF; the clamp may
    # then land on a zero-probability tail, so step back to the token owning the mass.
    while probs[idx] == 0 and idx > 0:
        idx -= 1
    return idx

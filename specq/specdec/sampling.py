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


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p."""
    order = np.argsort(-probs, axis=1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=1)
    mass_before = np.cumsum(sorted_probs, axis=1) - sorted_probs
    keep_sorted = mass_before < top_p  # the token that crosses top_p is kept
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=1, keepdims=True)


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

"""Sampling parameters, the warping of logits into target/draft distributions, and
the two ways of drawing from them: the race (race_index; the race rule's, and so
auto's) and the inverse-CDF draw (sample; the sample and typical rules').

The same warp (temperature, then top-k, then top-p) is applied to the target's and
the draft's logits: both rules are exact with respect to the *warped* target
distribution, which is what plain sampling would have drawn from.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
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
    summing to 1. Greedy parameters give the one-hot argmax (lowest id on ties).
    Sampled ones: logits / temperature, those below the top_k-th largest dropped,
    softmax, then the smallest set of most likely tokens (lower id first on ties)
    whose mass before each is below top_p, renormalized (sampling_kernels: compiled,
    each row alone, so a row's bits never depend on the rows beside it)."""
    logits = _rows(np.atleast_2d(logits))
    out = np.empty(logits.shape)
    _warp(logits, params, out)
    return out


def warped_row(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """probabilities() of one row [V], in this thread's scratch row: valid until the
    thread's next call, for a caller that reads it at once (acceptance, a draw)."""
    row = _rows(np.asarray(logits).reshape(1, -1))
    out = _scratch(row.shape[1])[2]
    _warp(row, params, out)
    return out[0]


def _rows(logits: np.ndarray) -> np.ndarray:
    """The logits as the kernel takes them: float32 (the model's) or float64, C-ordered.
    float32 rows are not copied to float64 here: the kernel widens each value as it
    reads it, exactly, so the bits are the same (a copy measured no slower, but is a
    pass and a row of memory for nothing)."""
    if logits.dtype not in (np.float32, np.float64):
        logits = logits.astype(np.float64)
    return np.ascontiguousarray(logits)


def _warp(logits: np.ndarray, params: SamplingParams, out: np.ndarray) -> None:
    if params.greedy:
        out[:] = 0.0
        out[np.arange(len(logits)), logits.argmax(axis=1)] = 1.0
        return
    # Imported here: SamplingParams is read by the queue and the command line, which
    # must not load numba (tests/test_architecture.py).
    from specq.specdec.sampling_kernels import warp_rows

    z, pow2, _ = _scratch(logits.shape[1])
    warp_rows(logits, float(params.temperature), int(params.top_k), float(params.top_p), out, z, pow2)


_buffers = threading.local()  # per thread: a server's threads may decode side by side


def _scratch(vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's (z, pow2, row) for rows of `vocab` values, made once: a target's
    rows and a head's draft vocabulary alternate in speculative sampling."""
    kept = getattr(_buffers, "arrays", None)
    if kept is None:
        kept = _buffers.arrays = {}
    if vocab not in kept:
        kept[vocab] = (np.empty(vocab), np.empty(vocab, dtype=np.int64), np.empty((1, vocab)))
    return kept[vocab]


_IDENTITY = np.empty(0, dtype=np.int64)


def race_index(logits: np.ndarray, params: SamplingParams, key: int, ids: np.ndarray | None = None) -> int:
    """The winner of the exponential race keyed by `key` over one row of logits [n],
    warped by `params` (sampling_kernels.race): a draw from the warped distribution,
    decided by the row and the key alone. The noise of entry j is token ids[j]'s
    (default: j's), so a draft over a part of the vocabulary races its tokens with
    the noise the target's race gives them. Returns the entry's index."""
    if params.greedy:
        return int(np.argmax(logits))
    from specq.specdec.sampling_kernels import warp_race  # numba: see _warp

    row = _rows(np.asarray(logits).reshape(1, -1))[0]
    z, pow2, out = _scratch(row.shape[0])
    chosen = warp_race(
        row,
        float(params.temperature),
        int(params.top_k),
        float(params.top_p),
        np.uint64(key),
        _IDENTITY if ids is None else ids,
        out[0],
        z,
        pow2,
    )
    return int(chosen)


def race_indexes(rows: Sequence[np.ndarray], params: Sequence[SamplingParams], keys: Sequence[int]) -> list[int]:
    """race_index of each row (of the same vocabulary) with its own params (not
    greedy) and key, the rows shared among numba's threads (a round's first rows:
    0.17 ms each on one core, 32 of them beside a 35 ms forward). Each winner is
    race_index's, whichever thread computes it."""
    from numba import get_num_threads, typed

    from specq.specdec.sampling_kernels import warp_races  # numba: see _warp

    assert not any(p.greedy for p in params), "a greedy row's winner is its argmax"
    winners = np.empty(len(rows), dtype=np.int64)
    warp_races(
        typed.List([_rows(np.asarray(r).reshape(1, -1))[0] for r in rows]),
        np.array([p.temperature for p in params], dtype=np.float64),
        np.array([p.top_k for p in params], dtype=np.int64),
        np.array([p.top_p for p in params], dtype=np.float64),
        np.array(keys, dtype=np.uint64),
        winners,
        max(1, min(get_num_threads(), len(rows))),
    )
    return [int(w) for w in winners]


def sample(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from one distribution [V] with a uniform u in [0, 1): the first
    token whose cumulative probability passes u times the total. Only rounding can
    push u * total past the last step of the CDF; the draw then steps back to the
    token owning the mass, never a zero-probability one."""
    from specq.specdec.sampling_kernels import draw  # numba: see _warp

    return int(draw(np.ascontiguousarray(probs, dtype=np.float64), float(u)))

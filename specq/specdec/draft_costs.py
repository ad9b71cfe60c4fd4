"""What a draft costs where it is decided: measured by the engine as it runs.

A draft pays when the tokens it is expected to add are worth the rows it adds to
the target's forward. Alone, a request's plain round is a whole one-row forward and
a draft row about 0.2 of it at int16 (`adaptive.ROW_COSTS`). In a decode group the
weights are streamed once for every request: a request's share of a round of 8 is
about a third of a lone step while a draft row still adds about a fifth of one, so a
draft must be right far more often to pay, and the lone figures draft at a loss.

`MeasuredCosts` times every forward the engine runs (by its row count) and every
draft, and gives a round's costs relative to a request's share of it: the slope of
the forward time around the round's rows, over the round's time divided among its
requests. Only greedy requests use it (the engine sees to that): their outputs are
the target's argmax whatever the drafts, so a length chosen from this machine's
timings changes how fast they come, never which tokens. A sampled request's draft
length decides which of its seeded draws pick which tokens, so it keeps the lone,
constant figures, and batched == single == resumed stays exact for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_ROWS = 256  # forwards of more rows (long prompts) say nothing about a decode round
SMOOTHING = 0.1  # weight of a new timing once a row count has a few: follows a machine's load
SPAN = 16  # the slope is fitted over forwards of the round's rows up to this many more
MIN_SAMPLES = 3  # timings of at least two row counts in the span before the fit is trusted


@dataclass(frozen=True)
class RoundCosts:
    """Costs relative to a request's share of a plain round (the unit choose_k's
    `base` = 1 stands for)."""

    row: float  # one more verification row
    draft: float  # proposing one draft token


class MeasuredCosts:
    """Forward times by row count and draft times, smoothed; one per engine (its
    model's timings), shared by every decode of that engine."""

    def __init__(self) -> None:
        self._seconds = np.zeros(MAX_ROWS + 1)
        self._samples = np.zeros(MAX_ROWS + 1, dtype=np.int64)
        self._draft_seconds = 0.0  # per drafted token
        self._drafts = 0

    def record_forward(self, rows: int, seconds: float) -> None:
        if 1 <= rows <= MAX_ROWS and seconds > 0:
            self._samples[rows] += 1
            weight = max(SMOOTHING, 1.0 / self._samples[rows])
            self._seconds[rows] += weight * (seconds - self._seconds[rows])

    def record_draft(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds >= 0:
            self._drafts += 1
            weight = max(SMOOTHING, 1.0 / self._drafts)
            self._draft_seconds += weight * (seconds / tokens - self._draft_seconds)

    def for_round(self, rows: int, requests: int) -> RoundCosts | None:
        """The costs in a round of `rows` plain rows shared by `requests` requests;
        None until the timings around that row count say enough."""
        lo, hi = max(1, rows - 1), min(MAX_ROWS, rows + SPAN)
        counts = self._samples[lo : hi + 1]
        seen = np.flatnonzero(counts)
        if len(seen) < 2 or counts.sum() < MIN_SAMPLES or not self._drafts:
            return None
        x = (lo + seen).astype(np.float64)
        y = self._seconds[lo + seen]
        w = np.minimum(counts[seen], 10).astype(np.float64)  # a row count timed often is no truer
        x_mean, y_mean = np.average(x, weights=w), np.average(y, weights=w)
        slope = np.sum(w * (x - x_mean) * (y - y_mean)) / np.sum(w * (x - x_mean) ** 2)
        share = (y_mean + slope * (rows - x_mean)) / max(requests, 1)
        if not (slope > 0 and share > 0):
            return None  # noise on a busy machine: decide as if alone this round
        return RoundCosts(row=float(slope / share), draft=float(self._draft_seconds / share))

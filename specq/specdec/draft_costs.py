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
requests; until those timings say enough (a group's first rounds, and the rounds in
which prompts go in, which are not timed), the precision's constant row cost over
the request's share (`prior_round_costs`). Only requests whose tokens do not depend
on their drafts (greedy, and the race rule's sampling: acceptance.drafts_free) use
it, and only when they share their round (the engine sees to that; alone, a request
drafts by the constant figures, engine.DecodeSession.step says why): a length chosen
from this machine's timings changes how fast their tokens come, never which. Under
the sample rule a request's draft length decides which of its seeded draws pick
which tokens, so it keeps the lone, constant figures, and batched == single ==
resumed stays exact for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_ROWS = 256  # forwards of more rows (long prompts) say nothing about a decode round
# A row count's time is the median of its last WINDOW timings: it follows the
# machine's load, and one slow forward (a first call compiling, another process's
# burst) moves it little. Measured: a first 3-row forward of 56 ms against 11.5 ms
# once warm made a lone request's rows look 5x their cost, and it stopped drafting.
WINDOW = 15
MIN_SAMPLES = 3  # timings a row count needs before its median counts
SPAN = 16  # the slope is fitted over forwards of the round's rows up to this many more
# A fit is kept for this many timings: fitting takes about 0.2 ms, 1% of a round of 8.
REFIT_EVERY = 16


@dataclass(frozen=True)
class RoundCosts:
    """Costs relative to a request's share of a plain round (the unit choose_k's
    `base` = 1 stands for)."""

    row: float  # one more verification row, on the slope of the forward time
    draft: float  # proposing one draft token


def prior_round_costs(requests: int, row_cost: float, draft_cost: float) -> RoundCosts:
    """A round's costs before the timings say anything (a group's first rounds, and
    every round while prompts go in a piece a round, which are not timed): a round
    of `requests` one-row requests taken as 1 + row_cost x (requests - 1) lone steps,
    the constant row cost of the precision for each extra row; a request's share is
    that over `requests`, and a draft row and a drafted token cost their lone figures
    over the share. At int16 (row cost 0.20) a row costs 0.67 of the share at 8
    requests and 0.87 at 28, where the timings measured about 0.67 and 0.9. Deciding
    by the lone figures instead drafted a whole row a request in rounds where
    nothing pays."""
    share = (1.0 + row_cost * (requests - 1)) / requests
    return RoundCosts(row=row_cost / share, draft=draft_cost / share)


class MeasuredCosts:
    """Forward times by row count (recent medians) and draft times (a recent mean);
    one per engine (its model's timings), shared by every decode of that engine."""

    def __init__(self) -> None:
        self._recent = np.zeros((MAX_ROWS + 1, WINDOW))  # the last timings of each row count
        self._samples = np.zeros(MAX_ROWS + 1, dtype=np.int64)
        self._recent_drafts = np.zeros(2 * WINDOW + 1)  # seconds per drafted token
        self._drafts = 0
        self._timings = 0  # forwards and drafts recorded, for the age of a fit
        self._fits: dict[tuple[int, int], tuple[int, RoundCosts]] = {}

    def record_forward(self, rows: int, seconds: float) -> None:
        if 1 <= rows <= MAX_ROWS and seconds > 0:
            self._recent[rows, self._samples[rows] % WINDOW] = seconds
            self._samples[rows] += 1
            self._timings += 1

    def record_draft(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds >= 0:
            self._recent_drafts[self._drafts % len(self._recent_drafts)] = seconds / tokens
            self._drafts += 1
            self._timings += 1

    def seconds(self, rows: int) -> float | None:
        """The median time of a forward of `rows` rows, once timed MIN_SAMPLES times."""
        n = int(self._samples[rows])
        return float(np.median(self._recent[rows, : min(n, WINDOW)])) if n >= MIN_SAMPLES else None

    def draft_seconds(self) -> float | None:
        """The mean of the recent drafts' times per token, the slowest left out: the
        mean, since lookups that cost nothing and head steps that cost 0.06 of a
        step alternate (a median would take one of them for all); without the
        slowest, since a first call compiles."""
        n = min(self._drafts, len(self._recent_drafts))
        if not n:
            return None
        recent = np.sort(self._recent_drafts[:n])
        return float(recent[: max(1, n - 1)].mean())

    def for_round(self, rows: int, requests: int) -> RoundCosts | None:
        """The costs in a round of `rows` plain rows shared by `requests` requests;
        None until the timings around that row count say enough."""
        fitted = self._fits.get((rows, requests))
        if fitted is not None and self._timings - fitted[0] < REFIT_EVERY:
            return fitted[1]
        costs = self._fit(rows, requests)
        if costs is not None:
            self._fits[(rows, requests)] = (self._timings, costs)
        return costs

    def _fit(self, rows: int, requests: int) -> RoundCosts | None:
        lo, hi = max(1, rows - 1), min(MAX_ROWS, rows + SPAN)
        timed = [r for r in range(lo, hi + 1) if self._samples[r] >= MIN_SAMPLES]
        draft = self.draft_seconds()
        if len(timed) < 2 or draft is None:
            return None
        x = np.array(timed, dtype=np.float64)
        y = np.array([self.seconds(r) for r in timed])
        w = np.minimum(self._samples[timed], WINDOW).astype(np.float64)
        x_mean, y_mean = np.average(x, weights=w), np.average(y, weights=w)
        slope = np.sum(w * (x - x_mean) * (y - y_mean)) / np.sum(w * (x - x_mean) ** 2)
        plain = self.seconds(rows)  # the round without drafts: timed, else on the fitted line
        share = (plain if plain is not None else y_mean + slope * (rows - x_mean)) / max(requests, 1)
        if not (slope > 0 and share > 0):
            return None  # noise on a busy machine: decide as if alone this round
        return RoundCosts(row=float(slope / share), draft=float(draft / share))

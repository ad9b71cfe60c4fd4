"""Adaptive draft length: per request, draft as many tokens as pay for themselves.

A round that drafts k tokens emits on average E(k) = 1 + c0 + c0*c1 + ... tokens,
where c_i is the chance that draft i is accepted once drafts 0..i-1 were, and costs
about base + k * (row_cost + draft_cost) plain steps. The engine picks the k in
0..k_max with the most tokens per unit of cost; k = 0 is plain decoding.

Alone, base is 1 (a request's one row streams all the weights) and a row costs
ROW_COSTS of its precision. In a batched round the weights are streamed once for
every request, so a request's share of the round is about a third of a step at 8
requests at int16 while a draft row still adds about a fifth of one: drafts pay
there only where they are right most of the time. A greedy request decides by the
costs the engine measures for its round (draft_costs.py, in units of its share of
the round: base 1), once it has judged a draft or two; a fresh request, and one
whose evidence has faded while it did not draft, decides as if alone, so that it
learns where drafts pay. A sampled request always decides as if alone (below).

The estimates are counts decayed every round towards a prior, so that a request whose
drafts stopped paying (k = 0, nothing measured) drifts back to the prior and tries
again now and then. Everything is a deterministic function of the decode state, which
carries the counts: a resumed decode chooses the same k as the uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.9  # weight of the past per drafting round: about the last 10 of them count
# Per round without drafts: the evidence fades more slowly, so that a request whose
# drafts stopped paying probes again every few rounds, not every other one.
IDLE_DECAY = 0.95
PRIOR_ACCEPTED = 1.0  # pseudo-counts: a fresh request assumes c_i = 0.5
PRIOR_REACHED = 2.0
# A verification row's cost relative to a one-row forward, per precision, measured by
# `specq bench --row-curve` on the default model on the 2-core AMD EPYC
# (docs/performance.md). f32: 2 rows 1.40x, 3 rows 1.86x, 5 rows 2.47x of a 1-row step,
# about 0.4 a row: its float32 products are bound by arithmetic at a few rows, and
# every speedup of the 1-row step (bound by streaming the weights) made a row
# relatively dearer (0.1 with the first float32 products, 0.33 before the layer stack;
# at 0.33 with the layer stack, prompt lookup fell to 0.89x plain decoding on code).
# The integer products make rows cheap: 5 rows cost 1.80x one at int16 (0.20 a row)
# and 1.62x at int8 (0.16). At int16 drafting on 0.20 rather than 0.40 took the
# default configuration from 1.17x to 1.27x plain decoding (tau 1.28 to 1.51), in two
# runs of `specq bench --proposers auto --k 4 --repeat 2`.
#
# A constant per precision, not a figure the engine times as it goes: under the
# sample rule the draft length changes which tokens the seeded draws pick (the
# distribution is exact either way), so a length that depended on a machine's timings
# would make a request resumed on another worker, or decoded by `specq generate`,
# part from the same request decoded in one go. (Greedy and race-rule requests, whose
# tokens are the same whatever they draft, draft by the engine's timings when they
# share a round: draft_costs.py.)
ROW_COSTS = {"f32": 0.40, "int16": 0.20, "int8": 0.16}
ROW_COST = ROW_COSTS["f32"]  # what the shipped heads' trees and gates were chosen for (specq.training)


@dataclass(frozen=True)
class AcceptanceStats:
    reached: tuple[float, ...] = ()  # decayed count of rounds in which draft i was judged
    accepted: tuple[float, ...] = ()  # ... and in which it was accepted

    def rates(self, k_max: int) -> list[float]:
        """Estimated c_0 .. c_{k_max-1}. A draft position's prior is the estimate of
        the position before it (the first one's: PRIOR_ACCEPTED / PRIOR_REACHED).
        With 0.5 for every unexplored position, a request whose first drafts were
        right 90% of the time never tried a second one (1.9 tokens for 1.4 steps
        beat 2.35 for 1.8), so it never learned whether the second paid: on the
        bench mix, scripts/replay_drafts.py models 1.083x plain for this against
        1.070x."""
        rates, prior = [], PRIOR_ACCEPTED / PRIOR_REACHED
        for i in range(k_max):
            prior = (self._at(self.accepted, i) + PRIOR_REACHED * prior) / (self._at(self.reached, i) + PRIOR_REACHED)
            rates.append(prior)
        return rates

    def after_round(self, n_drafted: int, n_accepted: int) -> AcceptanceStats:
        width = max(len(self.reached), n_drafted)
        decay = DECAY if n_drafted else IDLE_DECAY
        reached = [decay * self._at(self.reached, i) for i in range(width)]
        accepted = [decay * self._at(self.accepted, i) for i in range(width)]
        # Draft i is judged only when every draft before it was accepted.
        for i in range(min(n_drafted, n_accepted + 1)):
            reached[i] += 1.0
            accepted[i] += 1.0 if i < n_accepted else 0.0
        return AcceptanceStats(reached=tuple(reached), accepted=tuple(accepted))

    @staticmethod
    def _at(values: tuple[float, ...], i: int) -> float:
        return values[i] if i < len(values) else 0.0

    def to_dict(self) -> dict:
        return {"reached": list(self.reached), "accepted": list(self.accepted)}

    @classmethod
    def from_dict(cls, d: dict) -> AcceptanceStats:
        return cls(reached=tuple(d["reached"]), accepted=tuple(d["accepted"]))


def choose_k(
    stats: AcceptanceStats, k_max: int, draft_cost: float, base: float = 1.0, row_cost: float = ROW_COST
) -> int:
    """The draft length in 0..k_max with the most expected tokens per unit of cost,
    for a request whose plain round costs `base` steps and a draft row `row_cost`."""
    best_k, best_rate = 0, 1.0 / base
    expected, reach = 1.0, 1.0
    for k, c in enumerate(stats.rates(k_max), start=1):
        reach *= c
        expected += reach
        rate = expected / (base + k * (row_cost + draft_cost))
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k

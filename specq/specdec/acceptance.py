"""Acceptance rules: given k draft tokens and the target's k+1 rows of logits from one
verification forward, decide how many drafts to keep and which token to emit next.

Row i of the target logits is the target's prediction for the position of draft
token i; row k follows the last draft (the bonus position). Every rule returns
(n_accepted, next_token): the committed tokens are draft[:n_accepted] + [next_token].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specq.errors import ParameterError
from specq.specdec.rng import DRAW_ACCEPT, DRAW_SAMPLE
from specq.specdec.sampling import SamplingParams, probabilities, race_index, sample, warped_row

ACCEPT_RULES = ("greedy", "race", "sample", "typical")

# Medusa's typical acceptance (Cai et al. 2024, section 2.3.1): accept x when
# p_target(x) > min(epsilon, delta * exp(-H(p_target))).
TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3

# uniform(position_offset, draw) for the round: position_offset i is the output
# position of draft token i (the caller adds the committed length).
Uniforms = Callable[[int, int], float]
# race_key(position_offset) for the round, as Uniforms' offsets.
RaceKeys = Callable[[int], int]


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    next_token: int


def accept_greedy(draft: Sequence[int], target_logits: np.ndarray) -> Verdict:
    """Keep drafts while each equals the target's argmax; then emit the target's own
    argmax. The committed tokens are exactly those plain greedy decoding emits."""
    target_argmax = target_logits.argmax(axis=1)  # [k+1]
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return Verdict(n, int(target_argmax[n]))


def accept_tree_greedy(
    draft: Sequence[int], parents: Sequence[int], target_logits: np.ndarray
) -> tuple[list[int], int]:
    """The longest root path of a tree draft whose every token is the target's argmax
    after its ancestors, and the target's argmax after the path. Row 0 of the logits
    is the root (the committed text), row i + 1 is draft token i. As with a chain,
    the committed tokens are exactly those plain greedy decoding emits."""
    target_argmax = target_logits.argmax(axis=1)
    path: list[int] = []
    at = -1  # the node whose row's argmax is the next token to match
    while True:
        wanted = target_argmax[at + 1]
        child = next((i for i, p in enumerate(parents) if p == at and draft[i] == wanted), None)
        if child is None:
            return path, int(wanted)
        path.append(child)
        at = child


def accept_sample(
    draft: Sequence[int],
    p_draft: np.ndarray | None,
    target_logits: np.ndarray,
    params: SamplingParams,
    uniforms: Uniforms,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023).

    Draft token x at row i is kept with probability min(1, p_target(x) / p_draft(x));
    on the first rejection the next token is drawn from norm(max(0, p_target - p_draft));
    if every draft is kept a bonus token is drawn from p_target at row k. The
    emitted tokens are distributed exactly as plain sampling from p_target.
    `p_draft` [k, V] is None for a deterministic (one-hot) proposer.
    """
    k = len(draft)
    # Row by row, as far as the drafts are kept: a row's distribution does not depend
    # on the others (sampling.probabilities), and half the rounds stop at the first.
    for i, x in enumerate(draft):
        p_target = warped_row(target_logits[i], params)
        pd_x = 1.0 if p_draft is None else float(p_draft[i, x])
        assert pd_x > 0, "a proposer drafted a token it gave zero probability"
        if uniforms(i, DRAW_ACCEPT) < min(1.0, p_target[x] / pd_x):
            continue
        if p_draft is None:
            residual = p_target.copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p_target - p_draft[i], 0.0)
        if residual.sum() <= 0:
            # Only reachable through rounding when p_target == p_draft; then the
            # residual's limit is p_target itself.
            residual = p_target
        return Verdict(i, sample(residual, uniforms(i, DRAW_SAMPLE)))
    return Verdict(k, sample(warped_row(target_logits[k], params), uniforms(k, DRAW_SAMPLE)))


def accept_race(
    draft: Sequence[int],
    target_logits: np.ndarray,
    params: SamplingParams,
    keys: RaceKeys,
    first: int | None = None,
) -> Verdict:
    """The race rule: the target's token at each position is the winner of the
    exponential race keyed by that position (sampling.race_index), a draw from the
    warped target distribution; drafts are kept while each equals it, and the
    target's own winner is emitted after them, as greedy verification keeps argmaxes.

    The committed tokens are exactly those plain race sampling emits, whatever was
    drafted: speculative == plain and batched == single hold for sampled requests as
    for greedy ones, and a request may draft as much or as little as pays. The price
    is acceptance: a draft drawn from q by the same race matches the target's draw
    with the coupling's probability, at least (1 - d) / (1 + d) for d = TV(p, q),
    where the sample rule keeps it with 1 - d.

    `first`: the first row's winner, where the caller raced it already (a round's
    first rows race together, sampling.race_indexes).
    """
    for i, x in enumerate(draft):
        winner = first if i == 0 and first is not None else race_index(target_logits[i], params, keys(i))
        if winner != x:
            return Verdict(i, winner)
    k = len(draft)
    if k == 0 and first is not None:
        return Verdict(0, first)
    return Verdict(k, race_index(target_logits[k], params, keys(k)))


def accept_typical(
    draft: Sequence[int],
    target_logits: np.ndarray,
    params: SamplingParams,
    uniforms: Uniforms,
) -> Verdict:
    """Medusa's typical acceptance: faster than `sample`, NOT distribution-preserving.

    A draft token is kept when the target finds it typical enough; the emitted token
    after the kept prefix is sampled from the target. At temperature 0 this is greedy.
    """
    if params.greedy:
        return accept_greedy(draft, target_logits)
    z = target_logits.astype(np.float64) / params.temperature
    z -= z.max(axis=1, keepdims=True)
    p_plain = np.exp(z)
    p_plain /= p_plain.sum(axis=1, keepdims=True)  # [k+1, V]
    entropy = -np.sum(p_plain * np.log(np.maximum(p_plain, 1e-300)), axis=1)  # [k+1]
    threshold = np.minimum(TYPICAL_EPSILON, TYPICAL_DELTA * np.exp(-entropy))
    n = 0
    while n < len(draft) and p_plain[n, draft[n]] > threshold[n]:
        n += 1
    p_target = probabilities(target_logits[n : n + 1], params)[0]
    return Verdict(n, sample(p_target, uniforms(n, DRAW_SAMPLE)))


def resolve_rule(accept: str, params: SamplingParams) -> str:
    """The rule to run for the user's choice; 'auto' picks greedy at temperature 0
    and race otherwise: then a request's tokens, sampled or not, are a function of its
    prompt, parameters and seed alone, whatever drafts them, and it drafts as much as
    pays where it runs (the sample rule keeps drafts more often, in theory; on the
    bench mix the two kept the same share, docs/performance.md). Greedy with a
    temperature is a contradiction, not a default."""
    if accept == "auto":
        return "greedy" if params.greedy else "race"
    if accept == "race" and params.greedy:
        return "greedy"  # the race of a one-hot distribution is its argmax
    if accept not in ACCEPT_RULES:
        raise ParameterError(f"unknown acceptance rule {accept!r} (choose from auto, {', '.join(ACCEPT_RULES)})")
    if accept == "greedy" and not params.greedy:
        raise ParameterError(
            f"acceptance 'greedy' decodes the argmax and takes no temperature (got {params.temperature}); "
            "use 'race' (auto's), 'sample' or temperature 0"
        )
    return accept


def drafts_free(rule: str, params: SamplingParams) -> bool:
    """The committed tokens do not depend on what was drafted (greedy decoding, and
    the race rule's sampling): speculative outputs are plain decoding's, and a draft
    length may follow a machine's timings."""
    return params.greedy or rule == "race"


def accept(
    rule: str,
    draft: Sequence[int],
    p_draft: np.ndarray | None,
    target_logits: np.ndarray,
    params: SamplingParams,
    uniforms: Uniforms,
    keys: RaceKeys | None = None,
    first_race: int | None = None,
) -> Verdict:
    """`first_race`: the race rule's winner of the first row, where the caller raced it already."""
    assert target_logits.shape[0] == len(draft) + 1, "the target gives k+1 rows for k drafts"
    if rule == "greedy":
        return accept_greedy(draft, target_logits)
    if rule == "sample":
        return accept_sample(draft, p_draft, target_logits, params, uniforms)
    if rule == "race":
        assert keys is not None, "the race rule needs the positions' keys"
        return accept_race(draft, target_logits, params, keys, first_race)
    if rule == "typical":
        return accept_typical(draft, target_logits, params, uniforms)
    raise AssertionError(f"unresolved acceptance rule {rule!r}")

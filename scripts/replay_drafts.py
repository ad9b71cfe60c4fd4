#!/usr/bin/env python3
"""Drafting policies replayed against a trace, without timing anything.

Greedy output does not depend on what is drafted, and neither do the target's
hidden states (every row gets the same bits in any round). So one plain decode can
record, at every position, what prompt lookup and the shipped recurrent head would
propose there (the head ungated, 4 deep, with its confidence at each depth), and any
drafting policy can then be replayed against the known output: which drafts it would
make, which would be accepted, and what the rounds would cost at a given row cost.
Noise-free, and seconds a policy instead of a benchmark run each.

  record   decode the prompts plainly and write the trace (about a minute for the
           bench mix at 128 tokens)
  replay   print each policy's modeled speedup over plain decoding, per category,
           prefill aside; --batch B models rounds that B requests share. Policies:
           the engine's choice; batch-aware (deciding with a batched request's share of
           a round); per-source (lookup and head drafts estimated apart); flat-prior
           (every unexplored draft position at 0.5, as before); perfect (the right
           prefix of the better source, known); tree-P (the engine's choice where
           lookup drafts, elsewhere a tree of the head's guesses whose path
           probability is at least P, at most TREE_NODES of them, as EAGLE-2's
           dynamic trees choose); with --store RESULTS, store (the engine's choice,
           and where lookup does not draft, the continuation that most often
           followed the context's last 4 to 6 tokens in those answers)

Cost model: a lone round costs 1 + row_cost per draft row + 0.06 per head step (a
tree's level of up to BEAM rows counted as one step); in a batch, a request's plain
share is base_cost(B).

The trace also holds, at every position, the head's beam: from its first step's
BEAM best guesses, each level expands the BEAM likeliest paths (the product of the
head's probabilities along them) by their BEAM best guesses, K_MAX levels deep.

Usage:  python scripts/replay_drafts.py record [--input F] [--max-tokens 128] [--trace T]
            [--precision auto]
        python scripts/replay_drafts.py replay [--trace T] [--row-cost 0.4] [--batch 1]
            [--store RESULTS.jsonl]
"""

from __future__ import annotations

import argparse
import collections
import os
import pickle

import numpy as np

from specq.errors import InputError
from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.adaptive import PRIOR_ACCEPTED, PRIOR_REACHED, ROW_COST, AcceptanceStats, choose_k
from specq.specdec.loader import load_engine, make_proposer
from specq.specdec.matmul import embed, linear
from specq.specdec.precision import resolve
from specq.specdec.proposers.hybrid import MIN_MATCH
from specq.specdec.proposers.ngram import lookup
from specq.specdec.proposers.recurrent import RecurrentHeadProposer
from specq.specdec.proposers.recurrent_kernels import draft_confidence
from specq.training.distill import read_results

K_MAX = 4
BEAM = 4
TREE_NODES = 8
TREE_THRESHOLDS = (0.1, 0.2, 0.3)
STORE_SHORTEST, STORE_LONGEST = 4, 6  # shorter matches measured worse on the bench mix
HEAD_STEP = RecurrentHeadProposer.draft_cost
# A further request's row in a batched round, relative to a lone one-row step:
# `specq bench --batch-size 8` measured a round of 8 requests at 4.56x a lone step,
# (4.56 - 1) / 7 = 0.51, and a draft per request in it adding 0.40 per request: the
# row cost holds there too.
BATCH_ROW_COST = 0.5


def base_cost(batch: int) -> float:
    """A request's share, in lone one-row steps, of a round that `batch` requests share."""
    return (1.0 + (max(batch, 1) - 1) * BATCH_ROW_COST) / max(batch, 1)


def record(args) -> None:
    engine = load_engine(proposer="none", precision=resolve(args.precision))
    hybrid = make_proposer("hybrid", engine.model, engine.tokenizer)
    head, rows = hybrid.medusa.head, hybrid.medusa.rows
    table = engine.model.weights.token_embedding
    traces, prompts = [], []
    for spec in read_jsonl(args.input):
        req = to_request(spec, engine.tokenizer, GenerationDefaults(max_tokens=args.max_tokens, k=1, adaptive=False))
        session = engine.session(engine.start(req))
        positions = {}
        while not session.state.finished:
            if session.state.output_ids:
                ids = session.state.all_ids
                copied = lookup(ids, K_MAX, hybrid.ngram.max_ngram, 1)
                max_n = hybrid.ngram.max_ngram
                match = next((n for n in range(max_n, 0, -1) if lookup(ids, 1, max_n, n)), 0)  # longest
                state, token, guesses, confidence = np.asarray(session.last_hidden)[None, :], ids[-1], [], []
                for _ in range(K_MAX):
                    state, logits = hybrid.medusa.step_logits(state, token)  # the proposer's own arithmetic
                    best, sure = draft_confidence(logits)
                    confidence.append(float(sure))
                    token = int(head.vocab[best])
                    guesses.append(token)
                beam = _beam(head, rows, table, session.last_hidden, ids[-1])
                positions[len(session.state.output_ids)] = (copied, match, guesses, confidence, beam)
            session.step()
        traces.append((spec.category or "all", list(session.state.output_ids), positions))
        prompts.append(list(req.prompt_ids))
    with open(args.trace, "wb") as f:
        pickle.dump({"gate": hybrid.medusa.gate, "traces": traces, "prompts": prompts}, f)
    print(f"{len(traces)} decodes, {sum(len(t[1]) for t in traces)} tokens -> {args.trace}")


def _beam(head, rows, table, hidden, token) -> list[tuple[int, int, float]]:
    """The head's beam from one position: (parent node or -1, token, path probability)
    per node, parents first."""
    nodes: list[tuple[int, int, float]] = []
    frontier = [(-1, np.asarray(hidden, np.float32), token, 1.0)]
    for _ in range(K_MAX):
        states = head.step(np.stack([f[1] for f in frontier]), embed(table, np.array([f[2] for f in frontier])))
        logits = linear(states, rows).astype(np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        children = []
        for i, (_, _, _, path_p) in enumerate(frontier):
            for j in np.argsort(-p[i], kind="stable")[:BEAM]:
                nodes.append((frontier[i][0], int(head.vocab[j]), path_p * float(p[i, j])))
                children.append((len(nodes) - 1, states[i], int(head.vocab[j]), nodes[-1][2]))
        frontier = sorted(children, key=lambda c: -c[3])[:BEAM]
    return nodes


def tree_draft(beam, threshold: float, k_max: int) -> tuple[set[tuple[int, ...]], int]:
    """The paths (as token tuples) of the beam's nodes whose path probability is at
    least `threshold`, the TREE_NODES likeliest, at most k_max deep, and the head's
    levels run to find them (one more than the deepest, which found nothing above the
    threshold, unless K_MAX deep)."""
    chosen = sorted((i for i, n in enumerate(beam) if n[2] >= threshold), key=lambda i: -beam[i][2])[:TREE_NODES]
    paths, deepest = set(), 0
    for i in chosen:
        path = []
        while i >= 0:
            path.append(beam[i][1])
            i = beam[i][0]
        if len(path) <= k_max:
            paths.add(tuple(reversed(path)))
            deepest = max(deepest, len(path))
    return paths, min(deepest + 1, K_MAX) if k_max else 0


def _tree_accepted(paths: set[tuple[int, ...]], truth) -> int:
    n = 0
    while n < len(truth) and tuple(truth[: n + 1]) in paths:
        n += 1
    return n


class AnswerStore:
    """Retrieval drafts (REST's datastore, SuffixDecoding's tree): the continuation that
    most often followed the context's last n tokens (n from STORE_LONGEST down to
    STORE_SHORTEST) in earlier answers of the same model."""

    def __init__(self, answers) -> None:
        self.next: dict[tuple[int, ...], collections.Counter] = collections.defaultdict(collections.Counter)
        for _, prompt, output in answers:
            seq = list(prompt) + list(output)
            for t in range(len(prompt), len(seq)):
                for n in range(STORE_SHORTEST, min(STORE_LONGEST, t) + 1):
                    self.next[tuple(seq[t - n : t])][tuple(seq[t : t + K_MAX])] += 1

    def draft(self, context) -> list[int]:
        for n in range(STORE_LONGEST, STORE_SHORTEST - 1, -1):
            found = self.next.get(tuple(context[-n:])) if len(context) >= n else None
            if found:
                return list(found.most_common(1)[0][0])
        return []


def flat_rates(stats: AcceptanceStats, k_max: int) -> list[float]:
    """The estimator before the chained prior: 0.5 for every unexplored position."""
    return [
        ((stats.accepted[i] if i < len(stats.accepted) else 0.0) + PRIOR_ACCEPTED)
        / ((stats.reached[i] if i < len(stats.reached) else 0.0) + PRIOR_REACHED)
        for i in range(k_max)
    ]


class _Rates:
    """What choose_k reads of AcceptanceStats, for rates computed here."""

    def __init__(self, rates: list[float]) -> None:
        self._rates = rates

    def rates(self, k_max: int) -> list[float]:
        return self._rates[:k_max]


def replay(policy: str, data: dict, row_cost: float, batch: int, store: AnswerStore | None = None) -> dict[str, float]:
    gate, base = data["gate"], base_cost(batch)
    tokens, costs = collections.Counter(), collections.Counter()
    for number, (category, output, positions) in enumerate(data["traces"]):
        # The engine keeps one estimate for both sources; "per-source" one for each.
        stats = {name: AcceptanceStats() for name in ("lookup", "store", "head", "shared")}
        t = 1
        while t < len(output):
            copied, match, guesses, confidence, *beam = positions[t]
            k_max, truth = min(K_MAX, len(output) - t - 1), output[t:]
            source = "lookup" if copied and match >= MIN_MATCH else "head"
            stored = []
            if policy == "store" and source == "head":
                stored = store.draft(data["prompts"][number] + output[:t])
                source = "store" if stored else source
            if policy.startswith("tree-") and source == "head":
                paths, levels = tree_draft(beam[0], float(policy[5:]), k_max)
                accepted = _tree_accepted(paths, truth)
                tokens[category] += accepted + 1
                costs[category] += base + row_cost * len(paths) + HEAD_STEP * levels
                t += accepted + 1
                continue
            if policy == "perfect":  # drafts exactly the right prefix of the better source
                right = [sum(1 for _ in _prefix(d[:k_max], truth)) for d in (copied if match else [], guesses)]
                n_lookup, n_head = right
                gains = [(0, 0), (n_lookup, 0), (n_head, n_head + (n_head < k_max) if n_head else 0)]
                n, steps = max(gains, key=lambda g: (g[0] + 1) / (base + row_cost * g[0] + HEAD_STEP * g[1]))
                draft = truth[:n]
            else:
                key = source if policy.startswith("per-source") else "shared"
                rates = flat_rates(stats[key], K_MAX) if policy == "flat-prior" else stats[key].rates(K_MAX)
                # The hybrid is charged as the head, lookup drafts included (HybridProposer).
                decide_as = base if policy == "batch-aware" else 1.0  # the engine decides as alone
                k = min(choose_k(_Rates(rates), K_MAX, HEAD_STEP, decide_as, row_cost), k_max)
                draft, steps = [], 0
                if k and source == "lookup":
                    draft = copied[:k]
                elif k and source == "store":
                    draft = stored[:k]
                elif k:
                    for i in range(k):
                        steps += 1
                        if confidence[i] < gate[min(i, len(gate) - 1)]:
                            break
                        draft.append(guesses[i])
                accepted = sum(1 for _ in _prefix(draft, truth))
                stats[key] = stats[key].after_round(len(draft), accepted)
            accepted = sum(1 for _ in _prefix(draft, truth))
            tokens[category] += accepted + 1
            costs[category] += base + row_cost * len(draft) + HEAD_STEP * steps
            t += accepted + 1
    speedup = {c: tokens[c] / costs[c] * base for c in sorted(tokens)}
    speedup["all"] = sum(tokens.values()) / sum(costs.values()) * base
    return speedup


def _prefix(draft, truth):
    for a, b in zip(draft, truth):
        if a != b:
            return
        yield a


# batch-aware: the engine's choice with a batched request's share of a round as its
# base cost (base_cost); the same as engine for --batch 1.
# flat-prior: the engine's estimator before an unexplored position's prior became the
# estimate of the position before it.
POLICIES = ("engine", "batch-aware", "per-source", "flat-prior", "perfect")
TREE_POLICIES = tuple(f"tree-{p:g}" for p in TREE_THRESHOLDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("record", "replay"))
    parser.add_argument("--input", default="examples/bench_prompts.jsonl")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--trace", default="drafts-trace.pkl")
    parser.add_argument("--row-cost", type=float, default=ROW_COST)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", default="auto", help="record: the precision to decode at")
    parser.add_argument("--store", help="replay: also the store policy, drafting from these answers (a results file)")
    args = parser.parse_args()
    if args.command == "record":
        record(args)
        return
    if not os.path.isfile(args.trace):
        raise SystemExit(f"no trace at {args.trace}: run `python scripts/replay_drafts.py record` first")
    with open(args.trace, "rb") as f:
        data = pickle.load(f)
    store = None
    if args.store:
        if "prompts" not in data:
            raise SystemExit(f"{args.trace} has no prompts (recorded before --store existed): record it again")
        try:
            store = AnswerStore(read_results(args.store))
        except InputError as exc:
            raise SystemExit(str(exc)) from None
    print(
        f"modeled speedup over plain decoding{' batched' if args.batch > 1 else ''} (prefill aside), "
        f"row cost {args.row_cost}, batch {args.batch}:"
    )
    has_beam = all(len(p) > 4 for _, _, positions in data["traces"] for p in positions.values())
    for policy in POLICIES + (TREE_POLICIES if has_beam else ()) + (("store",) if store else ()):
        result = replay(policy, data, args.row_cost, args.batch, store)
        print(f"  {policy:19}" + " ".join(f"{c} {v:.3f}" for c, v in result.items()))


if __name__ == "__main__":
    main()

"""The decoding engine: rounds of propose, verify, accept, commit.

    draft = proposer.propose(context, k)         # draft tokens (+ p_draft)
    out = model.forward(last token + draft)       # one target forward: k+1 rows
    verdict = accept(draft, out.logits, uniforms) # n accepted + the target's next token
    state = commit(state, draft[:n] + [next])     # rejected KV slots are overwritten later

The engine knows nothing of queues: a caller drives `DecodeSession.step()` (or the
`generate` iterator) and decides when to checkpoint the returned state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np

from specq.errors import ParameterError
from specq.specdec.acceptance import accept, accept_tree_greedy, drafts_free, resolve_rule
from specq.specdec.adaptive import ROW_COSTS, choose_k
from specq.specdec.completion_text import completion_text, final_text_so_far
from specq.specdec.draft_costs import MeasuredCosts, RoundCosts, prior_round_costs
from specq.specdec.head_screen import SCREEN_ROWS
from specq.specdec.model import KVCache, LlamaModel, Segment, SegmentOutput
from specq.specdec.proposers.base import Draft, ProposeContext, Proposer
from specq.specdec.rng import race_key, uniform
from specq.specdec.sampling import SamplingParams, race_indexes
from specq.specdec.state import DecodeState, GenerationRequest, Metrics
from specq.specdec.stops import truncate_at_stop
from specq.specdec.tokenizer import Tokenizer

# A request drafts by the measured costs once the drafts it judged lately weigh this
# much (decayed counts, adaptive.DECAY and IDLE_DECAY): after its first drafting
# round; a request whose drafts do not pay at the measured costs explores again
# after 14 to 25 rounds without drafts, a round's loss spread over them.
EXPLORED = 0.5


class Engine:
    """A target model, its tokenizer and a proposer, loaded once and shared by any
    number of decodes."""

    def __init__(
        self, model: LlamaModel, tokenizer: Tokenizer, proposer: Proposer, costs: MeasuredCosts | None = None
    ) -> None:
        """`costs`: time the forwards and drafts, and let the requests whose tokens do
        not depend on their drafts (greedy, race rule) draft by what rows cost here
        and now (draft_costs.py); without, every request drafts by the lone, constant
        figures, and its metrics are a function of its inputs."""
        self.model = model
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.costs = costs
        # The prompt rows a round takes, shared by the prompts being prefilled (in
        # the order they joined), so that a long prompt cannot stall the requests
        # decoding beside it: pieces where the model gives them the whole prompt's
        # bits, else None (every prompt whole, in the round it joins).
        self.prefill_rows = model.prompt_piece_rows

    def start(self, request: GenerationRequest) -> DecodeState:
        """A fresh state for `request`, validated against this model."""
        self.model.config.check_prompt(request.prompt_ids)
        vocab = self.model.config.vocab_size
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= vocab:
            raise ParameterError(f"prompt token ids must lie in [0, {vocab})")
        resolve_rule(request.accept, request.sampling)
        return DecodeState(request=request)

    def session(self, state: DecodeState) -> DecodeSession:
        return DecodeSession(self, state)

    def generate(self, state: DecodeState) -> Iterator[DecodeState]:
        """Yield the state after every round until the request finishes."""
        session = self.session(state)
        while not session.state.finished:
            yield session.step()

    def run(self, request: GenerationRequest) -> DecodeState:
        state = self.start(request)
        for state in self.generate(state):  # noqa: B007 - the last state is the result
            pass
        return state

    def kv_bytes(self, state: DecodeState) -> int:
        """The bytes of KV cache that decoding this request holds (the target's; a
        draft model's cache comes on top): what its cache allocates, whole blocks."""
        return KVCache.capacity_for(cache_positions(self.model, state.request)) * self.model.kv_bytes_per_position

    def generate_many(
        self, states: Sequence[DecodeState], *, group_size: int, kv_budget: int | None = None
    ) -> Iterator[tuple[int, DecodeState]]:
        """Decode several requests together, a decode group: every round, the rows of up to
        `group_size` requests (ragged: prefills, drafts of different lengths) share
        one target forward, and a finished request's place goes to the next one.
        With `kv_budget` (bytes), a request joins only while the KV caches of all
        together fit in it (one that alone needs more runs alone). Yields (index
        into `states`, new state) after every commit. See DecodeGroup for what
        stays identical to a lone decode."""
        assert group_size >= 1
        waiting = deque(enumerate(states))
        group = DecodeGroup(self)
        held: dict[int, int] = {}  # index -> its cache's bytes, for the requests in the group
        while waiting or group:
            while waiting and len(group) < group_size:
                index, state = waiting[0]
                if state.finished:
                    waiting.popleft()
                    yield index, state
                    continue
                need = self.kv_bytes(state)
                if held and kv_budget is not None and sum(held.values()) + need > kv_budget:
                    break
                waiting.popleft()
                group.add(index, state)
                held[index] = need
            for index, state in group.round():
                yield index, state
                if state.finished:
                    group.drop(index)
                    del held[index]

    def run_many(
        self, requests: Sequence[GenerationRequest], *, group_size: int, kv_budget: int | None = None
    ) -> list[DecodeState]:
        states = [self.start(r) for r in requests]
        for index, state in self.generate_many(states, group_size=group_size, kv_budget=kv_budget):
            states[index] = state
        return states

    def warm_up(self) -> None:
        """Decode a few short requests, then one alone, and drop them: the kernels
        this model, precision, proposer and CPU run are compiled (or loaded from
        numba's cache) now, rather than inside the first round of real work, where a
        first compile takes minutes and a worker would hold leases through it
        (docs/operations.md). No costs are measured: the compile is not a forward's
        time. SCREEN_ROWS greedy requests make rounds of that many logit rows (the
        output head's screen) and a first round of over a hundred prompt rows (the
        many-row products), with a sampled one beside them; the lone one runs the
        layer loop of one sequence."""
        vocab = self.model.config.vocab_size
        prompt = tuple(i % vocab for i in (5, 6, 7) * 4)  # a repeat, for prompt lookup to draft from
        spare = Engine(self.model, self.tokenizer, self.proposer)
        together = [GenerationRequest(prompt[i % 3 :], max_tokens=3) for i in range(SCREEN_ROWS)]
        together.append(GenerationRequest(prompt, max_tokens=3, sampling=SamplingParams(temperature=0.8, seed=1)))
        spare.run_many(together, group_size=len(together))
        spare.run(GenerationRequest(prompt, max_tokens=3))

    def record(self, planned: Sequence[PlannedRound], forward_s: float) -> None:
        """Time a round for the measured costs: its drafts, and its forward unless a
        prompt's prefill took part (its rows cost less: only its last row's logits)."""
        if self.costs is None:
            return
        for p in planned:
            if p.asked:
                self.costs.record_draft(max(p.draft.depth, 1), p.propose_s)
        if not any(p.prefill for p in planned):
            self.costs.record_forward(sum(p.segment.n for p in planned), forward_s)

    def text(self, state: DecodeState) -> str:
        return completion_text(self.tokenizer, state)

    def stream_text(self, state: DecodeState) -> str:
        return final_text_so_far(self.tokenizer, state)


def cache_positions(model: LlamaModel, request: GenerationRequest) -> int:
    """The positions a request's cache is made with: all it can reach (the prompt,
    every output token, a last round's drafts), so it never grows mid-decode."""
    return min(len(request.prompt_ids) + request.max_tokens + request.k + 1, model.config.context_length)


class DecodeGroup:
    """A changing set of requests decoded together, one shared target forward per
    round; the caller adds and drops requests between rounds (to refill, pause or
    cancel). Each request makes the decisions it would make alone (its own proposer
    session, draws and acceptance); only the dense products are shared, and a row
    comes out bit-identical to a lone decode at any row count (the model gives a row
    the same bits whatever rows come with it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions: dict[Hashable, DecodeSession] = {}

    def __len__(self) -> int:
        return len(self.sessions)

    def add(self, key: Hashable, state: DecodeState) -> None:
        """Join the next round; a state with committed output is resumed by one prefill."""
        assert key not in self.sessions and not state.finished
        self.sessions[key] = self.engine.session(state)

    def drop(self, key: Hashable) -> DecodeState:
        return self.sessions.pop(key).state

    def states(self) -> dict[Hashable, DecodeState]:
        return {key: session.state for key, session in self.sessions.items()}

    def round(self) -> list[tuple[Hashable, DecodeState]]:
        """One round for every request but finished ones (they stay until dropped)
        and prompts waiting for prompt rows (Engine.prefill_rows); returns the state
        of each request that took part, unchanged for a prompt not yet prefilled
        to its end."""
        live = [(key, s) for key, s in self.sessions.items() if not s.state.finished]
        costs = self.engine.costs
        # Each decoding request's plain round is one row; prompts being prefilled
        # have no such round (and rounds with their rows are not timed, below). A
        # request alone drafts by the lone figures (DecodeSession.step).
        n = sum(1 for _, s in live if not s.prefilling)
        round_costs = None
        if costs and n > 1:
            round_costs = costs.for_round(n, n) or prior_round_costs(
                n, ROW_COSTS[self.engine.model.precision], self.engine.proposer.draft_cost
            )
        prompt_rows = self.engine.prefill_rows
        active, planned = [], []
        for key, session in live:
            p = session.plan(round_costs, prompt_rows)
            if p is None:  # a prompt waiting for a round with prompt rows to spare
                continue
            if p.prefill and prompt_rows is not None:
                prompt_rows -= p.segment.n
            active.append((key, session))
            planned.append(p)
        t0 = perf_counter()
        outputs = self.engine.model.forward([p.segment for p in planned])
        self.engine.record(planned, perf_counter() - t0)
        firsts = _first_races([session for _, session in active], planned, outputs)
        return [
            (key, session.finish(p, out, out.seconds, first))
            for (key, session), p, out, first in zip(active, planned, outputs, firsts)
        ]


def _first_races(
    sessions: Sequence[DecodeSession], planned: Sequence[PlannedRound], outputs: Sequence[SegmentOutput]
) -> list[int | None]:
    """For each session, the race rule's winner of its first row this round, where two
    or more race: their rows share numba's threads (sampling.race_indexes), where one
    by one they took a core for about 0.17 ms a row while the other waited. None for
    the rest, whose acceptance races as it goes."""
    raced = [(i, r) for i, (s, p, out) in enumerate(zip(sessions, planned, outputs)) if (r := s.first_race(p, out))]
    firsts: list[int | None] = [None] * len(sessions)
    if len(raced) < 2:
        return firsts
    rows, params, keys = zip(*(r for _, r in raced))
    for (i, _), winner in zip(raced, race_indexes(rows, params, keys)):
        firsts[i] = winner
    return firsts


@dataclass(frozen=True)
class PlannedRound:
    draft: Draft
    segment: Segment  # the rows this round adds to the target forward
    propose_s: float
    asked: bool = False  # the proposer was asked for drafts (its time is a draft's cost)
    prefill: bool = False


class DecodeSession:
    """One request being decoded: the KV cache and proposer session derived from the
    state. Building a session from a saved state re-runs one prefill over the prompt
    and the committed output; the decode then continues exactly as it would have."""

    def __init__(self, engine: Engine, state: DecodeState) -> None:
        self.engine = engine
        self.model = engine.model
        self.state = state
        req = state.request
        self.rule = resolve_rule(req.accept, req.sampling)
        self.cache = self.model.new_cache(cache_positions(self.model, req))
        self.proposer = engine.proposer.session()
        self.last_hidden: np.ndarray | None = None
        # A prompt prefilled in pieces: the rows in the cache, and the pieces' time.
        self.prefilled = 0
        self._prefill_s = 0.0
        if state.output_ids and not state.finished:
            self._resume_prefill()

    def step(self) -> DecodeState:
        """One round; returns (and keeps) the new committed state."""
        # Alone, by the constant row cost of the precision, though the forwards are
        # timed for the rounds a request shares. Early versions of the timings lost
        # alone (1.14x to 1.16x plain decoding against the constants' 1.20x to 1.21x:
        # a compiling first call's outlier, then k rows at their timed differences);
        # with medians and the slope, lone requests drafting by timings measured
        # 1.206x against 1.208x (docs/performance.md). Switching needs the toy-model
        # tests that count on a lone request drafting to ask for the constants.
        # A prompt's pieces follow one another here: alone, nobody waits for them.
        while True:
            planned = self.plan()
            t0 = perf_counter()
            out = self.model.forward([planned.segment])[0]
            forward_s = perf_counter() - t0
            self.engine.record([planned], forward_s)
            state = self.finish(planned, out, forward_s)
            if not self.prefilling:
                return state

    @property
    def prefilling(self) -> bool:
        """The prompt is not yet in the cache to its end (no token emitted yet)."""
        return not self.state.output_ids and not self.state.finished

    def plan(self, round_costs: RoundCosts | None = None, prompt_rows: int | None = None) -> PlannedRound | None:
        """Propose, and lay out this round's rows for the target forward. The
        forward itself may be shared with other sessions' rounds (run_many), whose
        measured costs `round_costs` gives, and whose prompts share `prompt_rows`
        (default: Engine.prefill_rows); None if this request's prompt has no rows
        left to take this round."""
        state = self.state
        assert not state.finished, "a round of a finished request"
        req = state.request
        if not state.output_ids:
            # The prefill: the prompt's next piece (or all of it); the last piece's
            # forward emits output token 0.
            end = len(req.prompt_ids)
            piece = self.engine.prefill_rows
            if piece is not None:
                take = piece if prompt_rows is None else min(piece, prompt_rows)
                if take <= 0:
                    return None
                end = min(end, self.prefilled + take)
            segment = Segment(
                self.cache,
                req.prompt_ids[self.prefilled : end],
                self.prefilled,
                all_logits=False,
                argmax_only=self.rule == "greedy",
            )
            return PlannedRound(Draft(), segment, 0.0, prefill=True)
        ids = state.all_ids
        k = self._draft_budget(round_costs)
        measured = round_costs if self._measured(round_costs) else None
        t0 = perf_counter()
        draft = Draft()
        if k > 0:
            draft = self.proposer.propose(
                ProposeContext(
                    tokens=ids,
                    n_output=len(state.output_ids),
                    last_hidden=self.last_hidden,
                    params=req.sampling,
                    stochastic=self.rule == "sample" and not req.sampling.greedy,
                    want_p_draft=self.rule == "sample",
                    race=self.rule == "race",
                    tree_ok=self.rule == "greedy",
                    # A tree's rows take cache slots up to len(ids) - 1 + rows, inside the context.
                    max_rows=self.model.config.context_length - len(ids),
                    row_cost=measured.row if measured else None,
                ),
                k,
            )
        assert draft.depth <= k, "a proposer returned more tokens than asked"
        parents = None
        if draft.parents is not None:
            assert self.rule == "greedy" and len(draft.tokens) <= self.model.config.context_length - len(ids)
            parents = (-1,) + tuple(p + 1 for p in draft.parents)  # draft token i is row i + 1
        segment = Segment(
            self.cache, (ids[-1],) + draft.tokens, len(ids) - 1, parents=parents, argmax_only=self.rule == "greedy"
        )
        return PlannedRound(draft, segment, perf_counter() - t0, asked=k > 0)

    def first_race(self, planned: PlannedRound, out: SegmentOutput) -> tuple[np.ndarray, SamplingParams, int] | None:
        """What the race rule races at this round's first row (its logits, warp and
        key), or None where this round races nothing (other rules, a prompt's piece
        before its last)."""
        if self.rule != "race" or self._piece_before_last(planned):
            return None
        req = self.state.request
        return out.logits[0], req.sampling, race_key(req.sampling.seed, len(self.state.output_ids))

    def _piece_before_last(self, planned: PlannedRound) -> bool:
        prompt = len(self.state.request.prompt_ids)
        return planned.prefill and planned.segment.start + planned.segment.n < prompt

    def finish(
        self, planned: PlannedRound, out: SegmentOutput, forward_s: float, first_race: int | None = None
    ) -> DecodeState:
        """Accept and commit, given the target's output for the planned rows (a
        prompt's piece before its last commits nothing). `first_race`: the winner of
        the first row's race, where the round raced it already (first_race)."""
        state = self.state
        req = state.request
        if self._piece_before_last(planned):
            self.prefilled += planned.segment.n  # a piece before the prompt's last
            self._prefill_s += forward_s
            return state
        draft = planned.draft
        n_out = len(state.output_ids)
        t0 = perf_counter()
        if draft.parents is None:
            verdict = accept(
                self.rule,
                draft.tokens,
                draft.p_draft,
                out.logits,
                req.sampling,
                self._uniforms(n_out),
                self._race_keys(n_out),
                first_race,
            )
            n_accepted, next_token = verdict.n_accepted, verdict.next_token
            accepted, last_row = draft.tokens[:n_accepted], n_accepted
        else:
            path, next_token = accept_tree_greedy(draft.tokens, draft.parents, out.logits)
            n_accepted, accepted = len(path), tuple(draft.tokens[i] for i in path)
            last_row = path[-1] + 1 if path else 0
            self._compact(planned.segment.start, [i + 1 for i in path])
        verify_s = forward_s + perf_counter() - t0
        # The last accepted row predicted the emitted token: its hidden state is what
        # the next round's proposer (Medusa heads) starts from.
        self.last_hidden = out.hidden[-1] if n_out == 0 else out.hidden[last_row]
        new_tokens = accepted + (next_token,)
        metrics = state.metrics.after_round(
            n_drafted=draft.depth,
            n_accepted=n_accepted,
            n_emitted=len(new_tokens),
            propose_s=planned.propose_s,
            verify_s=0.0 if n_out == 0 else verify_s,
        )
        if n_out == 0:
            metrics = replace(metrics, prefill_seconds=metrics.prefill_seconds + self._prefill_s + verify_s)
        self.state = replace(
            self._commit(new_tokens, metrics),
            acceptance=state.acceptance.after_round(draft.depth, n_accepted),
        )
        return self.state

    def _compact(self, start: int, rows: list[int]) -> None:
        """Move an accepted tree path's keys and values (rows in slots start + row) to
        the slots of their positions, start + depth, as a chain would have left them.
        Their keys were rotated for those positions already."""
        moves = [(start + row, start + depth) for depth, row in enumerate(rows, start=1) if row != depth]
        if moves:
            self.cache.move([m[0] for m in moves], [m[1] for m in moves])

    def _resume_prefill(self) -> None:
        """Rebuild the cache for every committed token but the last (which, as after
        any round, is emitted but not yet fed) and the hidden state that predicted it.
        The cache must get the bits the interrupted decode had, or a near tie could
        break the other way after a resume: the model's rebuild_cache sees to that."""
        t0 = perf_counter()
        self.last_hidden = self.model.rebuild_cache(
            self.cache, self.state.all_ids[:-1], len(self.state.request.prompt_ids)
        )
        m = self.state.metrics
        self.state = replace(
            self.state,
            metrics=replace(
                m,
                resume_prefills=m.resume_prefills + 1,
                prefill_seconds=m.prefill_seconds + perf_counter() - t0,
            ),
        )

    def _measured(self, round_costs: RoundCosts | None) -> bool:
        """Whether this round drafts by the measured costs: only a request whose tokens
        are the same whatever it drafts (draft_costs.py: greedy, or the race rule's
        sampling), and only one that has judged a few drafts of late: the rest
        explore at the lone figures, or a request would never learn that its drafts
        are right often enough to pay in a batch, nor notice when they become so
        (its evidence fades while it does not draft, adaptive.IDLE_DECAY)."""
        if round_costs is None or not (self.state.request.adaptive and self.drafts_free):
            return False
        reached = self.state.acceptance.reached
        return bool(reached) and reached[0] >= EXPLORED

    def _draft_budget(self, round_costs: RoundCosts | None = None) -> int:
        """Drafts that fit and pay: a round emits up to k+1 tokens, never past
        max_tokens; its k+1 rows must fit the context with room for the token it
        emits; with `adaptive`, k is what the measured acceptance says pays best, at
        this round's measured costs or else the lone, constant ones."""
        state = self.state
        req = state.request
        remaining = req.max_tokens - len(state.output_ids)
        room = self.model.config.context_length - len(state.all_ids) - 1
        k = req.k
        if req.adaptive:
            k = self._adaptive_k(round_costs)
        return max(0, min(k, remaining - 1, room))

    def _adaptive_k(self, round_costs: RoundCosts | None) -> int:
        stats, k_max = self.state.acceptance, self.state.request.k
        if self._measured(round_costs):
            return choose_k(stats, k_max, round_costs.draft, row_cost=round_costs.row)
        if self.drafts_free and round_costs and round_costs.row + round_costs.draft >= 1.0:
            # Not even a draft that is always right pays where it costs a plain
            # round (rounds of 28 requests measure 0.9 + 0.27): nothing to explore.
            return 0
        return choose_k(stats, k_max, self.engine.proposer.draft_cost, row_cost=ROW_COSTS[self.model.precision])

    @property
    def drafts_free(self) -> bool:
        return drafts_free(self.rule, self.state.request.sampling)

    def _race_keys(self, n_output: int):
        seed = self.state.request.sampling.seed
        return lambda i: race_key(seed, n_output + i)

    def _uniforms(self, n_output: int):
        seed = self.state.request.sampling.seed
        return lambda i, draw: uniform(seed, n_output + i, draw)

    def _commit(self, new_tokens: tuple[int, ...], metrics: Metrics) -> DecodeState:
        state = self.state
        req = state.request
        end_of_turn = self.engine.tokenizer.end_of_turn_ids
        output = list(state.output_ids)
        finish = None
        for token in new_tokens:
            output.append(int(token))
            if token in end_of_turn:
                finish = "stop"
                break
            if len(output) >= req.max_tokens:
                finish = "length"
                break
        stop_index = None
        hit = truncate_at_stop(output, len(state.output_ids), req.stop, self.engine.tokenizer.decode)
        if hit is not None:
            n_keep, stop_index = hit
            output, finish = output[:n_keep], "stop"
        if finish is None and len(req.prompt_ids) + len(output) >= self.model.config.context_length:
            finish = "length"
        return replace(
            state,
            output_ids=tuple(output),
            finish_reason=finish,
            stop_text_index=stop_index,
            metrics=metrics,
        )

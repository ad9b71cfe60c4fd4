"""The decoding engine: rounds of propose, verify, accept, commit.

    draft = proposer.propose(context, k)         # draft tokens (+ p_draft)
    out = model.forward(last token + draft)       # one target forward: k+1 rows
    verdict = accept(draft, out.logits, uniforms) # n accepted + the target's next token
    state = commit(state, draft[:n] + [next])     # rejected KV slots are overwritten later

The engine knows nothing of queues: a caller drives `DecodeSession.step()` (or the
`generate` iterator) and decides when to checkpoint the returned state.
"""

from __future__ import annotations

from dataclasses import replace
from time import perf_counter
from typing import Iterator

import numpy as np

from specq.errors import ParameterError
from specq.specdec.acceptance import accept, resolve_rule
from specq.specdec.adaptive import choose_k
from specq.specdec.model import LlamaModel, Segment
from specq.specdec.proposers.base import Draft, ProposeContext, Proposer
from specq.specdec.rng import uniform
from specq.specdec.state import DecodeState, GenerationRequest, Metrics
from specq.specdec.stops import held_back, truncate_at_stop
from specq.specdec.tokenizer import Tokenizer


class Engine:
    """A target model, its tokenizer and a proposer, loaded once and shared by any
    number of decodes."""

    def __init__(self, model: LlamaModel, tokenizer: Tokenizer, proposer: Proposer) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.proposer = proposer

    def start(self, request: GenerationRequest) -> DecodeState:
        """A fresh state for `request`, validated against this model."""
        context = self.model.config.context_length
        if len(request.prompt_ids) >= context:
            raise ParameterError(
                f"prompt has {len(request.prompt_ids)} tokens; the model's context is {context}"
            )
        vocab = self.model.config.vocab_size
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= vocab:
            raise ParameterError(f"prompt token ids must lie in [0, {vocab})")
        resolve_rule(request.accept, request.sampling)
        return DecodeState(request=request)

    def session(self, state: DecodeState) -> "DecodeSession":
        return DecodeSession(self, state)

    def generate(self, state: DecodeState) -> Iterator[DecodeState]:
        """Yield the state after every round until the request finishes."""
        session = self.session(state)
        while not session.state.finished:
            yield session.step()

    def run(self, request: GenerationRequest) -> DecodeState:
        state = self.start(request)
        for state in self.generate(state):
            pass
        return state

    def text(self, state: DecodeState) -> str:
        """The completion's text: end-of-turn tokens dropped, cut before a stop string."""
        text = self.tokenizer.decode(state.output_ids)
        return text if state.stop_text_index is None else text[: state.stop_text_index]

    def stream_text(self, state: DecodeState) -> str:
        """The part of the text that is final already: no incomplete UTF-8 character
        and no suffix that might still become a stop string. Grows monotonically."""
        if state.finished:
            return self.text(state)
        text = self.tokenizer.stream_decoder().push(state.output_ids)
        return text[: len(text) - held_back(text, state.request.stop)]


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
        self.cache = self.model.new_cache(
            min(len(req.prompt_ids) + req.max_tokens + req.k + 1, self.model.config.context_length)
        )
        self.proposer = engine.proposer.session()
        self.last_hidden: np.ndarray | None = None
        if state.output_ids and not state.finished:
            self._resume_prefill()

    def step(self) -> DecodeState:
        """One round; returns (and keeps) the new committed state."""
        state = self.state
        assert not state.finished, "step() on a finished request"
        if not state.output_ids:
            return self._first_round()
        req = state.request
        ids = state.all_ids
        n_out = len(state.output_ids)
        k = self._draft_budget()

        t0 = perf_counter()
        draft = Draft()
        if k > 0:
            draft = self.proposer.propose(
                ProposeContext(
                    tokens=ids,
                    n_output=n_out,
                    last_hidden=self.last_hidden,
                    params=req.sampling,
                    stochastic=self.rule == "sample" and not req.sampling.greedy,
                    want_p_draft=self.rule == "sample",
                ),
                k,
            )
        assert len(draft.tokens) <= k, "a proposer returned more tokens than asked"
        t1 = perf_counter()
        out = self.model.forward([Segment(self.cache, (ids[-1],) + draft.tokens, len(ids) - 1)])[0]
        verdict = accept(
            self.rule, draft.tokens, draft.p_draft, out.logits, req.sampling, self._uniforms(n_out)
        )
        t2 = perf_counter()

        self.last_hidden = out.hidden[verdict.n_accepted]
        new_tokens = draft.tokens[: verdict.n_accepted] + (verdict.next_token,)
        metrics = state.metrics.after_round(
            n_drafted=len(draft.tokens),
            n_accepted=verdict.n_accepted,
            n_emitted=len(new_tokens),
            propose_s=t1 - t0,
            verify_s=t2 - t1,
        )
        self.state = replace(
            self._commit(new_tokens, metrics),
            acceptance=state.acceptance.after_round(len(draft.tokens), verdict.n_accepted),
        )
        return self.state

    def _first_round(self) -> DecodeState:
        """The prefill forward over the prompt emits output token 0."""
        req = self.state.request
        t0 = perf_counter()
        out = self.model.forward([Segment(self.cache, req.prompt_ids, 0, all_logits=False)])[0]
        verdict = accept(self.rule, (), None, out.logits, req.sampling, self._uniforms(0))
        elapsed = perf_counter() - t0
        self.last_hidden = out.hidden[-1]
        metrics = self.state.metrics.after_round(
            n_drafted=0, n_accepted=0, n_emitted=1, propose_s=0.0, verify_s=0.0
        )
        metrics = replace(metrics, prefill_seconds=metrics.prefill_seconds + elapsed)
        self.state = self._commit((verdict.next_token,), metrics)
        return self.state

    def _resume_prefill(self) -> None:
        """Rebuild the cache for every committed token but the last (which, as after
        any round, is emitted but not yet fed) and the hidden state that predicted it."""
        t0 = perf_counter()
        ids = self.state.all_ids[:-1]
        out = self.model.forward([Segment(self.cache, ids, 0, all_logits=False)])[0]
        self.last_hidden = out.hidden[-1]
        m = self.state.metrics
        self.state = replace(
            self.state,
            metrics=replace(
                m,
                resume_prefills=m.resume_prefills + 1,
                prefill_seconds=m.prefill_seconds + perf_counter() - t0,
            ),
        )

    def _draft_budget(self) -> int:
        """Drafts that fit and pay: a round emits up to k+1 tokens, never past
        max_tokens; its k+1 rows must fit the context with room for the token it
        emits; with `adaptive`, k is what the measured acceptance says pays best."""
        state = self.state
        req = state.request
        remaining = req.max_tokens - len(state.output_ids)
        room = self.model.config.context_length - len(state.all_ids) - 1
        k = req.k
        if req.adaptive:
            k = choose_k(state.acceptance, req.k, self.engine.proposer.draft_cost)
        return max(0, min(k, remaining - 1, room))

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


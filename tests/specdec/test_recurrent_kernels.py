"""The recurrent head's compiled drafting (recurrent_kernels): the same bits as the
step-by-step path through matmul.linear, the same drafts and gate cuts, at every
precision; SiLU and the confidence against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from specq.specdec import int8
from specq.specdec.engine import Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.matmul import embed, linear
from specq.specdec.model import LlamaModel, Segment
from specq.specdec.proposers import NoProposer, RecurrentHead, RecurrentHeadProposer
from specq.specdec.proposers.base import ProposeContext
from specq.specdec.proposers.recurrent_kernels import draft_confidence, draft_confidences, head_silu
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import GenerationRequest
from tests.model_helpers import TOY_TOKENS, random_recurrent_head

PRECISIONS = ["f32", *(["int16", "int8"] if int8.AVAILABLE else [])]


@pytest.fixture(scope="module")
def q8_0_path(toy_model_file) -> str:
    return toy_model_file(seed=3, tensor_type="Q8_0")


def by_hand(model: LlamaModel, head: RecurrentHead, rows, state: np.ndarray, token: int):
    """One step as matmul.linear computes it, one product at a time."""
    e = embed(model.weights.token_embedding, np.array([token]))
    z = linear(np.concatenate([state, e], axis=1), head.w_in) + head.b_in
    state = state + linear(head_silu(np.ascontiguousarray(z)), head.w_out)
    return state, linear(state, rows)[0]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_compiled_steps_and_chain_give_the_step_by_step_bits(q8_0_path, precision):
    model = LlamaModel.load(q8_0_path, precision)
    head = random_recurrent_head(model)
    proposer = RecurrentHeadProposer(model, head)
    assert proposer._compiled is not None  # Q8_0 head and rows: the compiled path
    hidden = model.forward([Segment(model.new_cache(), TOY_TOKENS, 0)])[0].hidden
    cut = []
    for i, token in enumerate((*TOY_TOKENS[:6], 1, 3)):  # odd tokens are outside the draft vocabulary
        state = hidden[3 * i : 3 * i + 1]
        got, want = proposer.step_logits(state, token), by_hand(model, head, proposer.rows, state, token)
        np.testing.assert_array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
        np.testing.assert_array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
        # The whole chain against drafting a step at a time.
        st, tok, chain = state, token, []
        for _ in range(4):
            st, logits = by_hand(model, head, proposer.rows, st, tok)
            best, confidence = draft_confidence(logits)
            tok = int(head.vocab[best])
            chain.append((tok, confidence))
        free = proposer._compiled.greedy(state, token, 4, (0.0,))
        assert list(free) == [t for t, _ in chain]
        # A gate between the chain's confidences cuts it where the first falls below.
        g = float(np.median([c for _, c in chain]))
        length = next((j for j, (_, c) in enumerate(chain) if c < g), 4)
        assert list(proposer._compiled.greedy(state, token, 4, (g,))) == [t for t, _ in chain[:length]]
        cut.append(length)
        # A gate per depth: the first figure for the first draft, the last for deeper ones.
        deeper = next((j for j in range(1, 4) if chain[j][1] < g), 4)
        assert list(proposer._compiled.greedy(state, token, 4, (0.0, g))) == [t for t, _ in chain[:deeper]]
    assert any(0 < n < 4 for n in cut)  # the gates cut chains inside, not only before or after


@pytest.mark.parametrize("precision", PRECISIONS)
def test_decoding_through_the_compiled_head_equals_plain_and_the_uncompiled_path(q8_0_path, precision):
    """Greedy: speculative == plain through the compiled chain. Greedy and sampled:
    the same tokens and the same drafts, position by position, as the same head
    drafting through the uncompiled path (the sampled one draws on the drafts'
    probabilities, so equal bits are what keeps it the same)."""
    model, tokenizer = load_model_and_tokenizer(q8_0_path, precision)
    head = random_recurrent_head(model, scale=0.5)
    compiled, uncompiled = RecurrentHeadProposer(model, head), RecurrentHeadProposer(model, head)
    uncompiled._compiled = None
    prompt = tuple(TOY_TOKENS[:9])
    plain = Engine(model, tokenizer, NoProposer()).run(GenerationRequest(prompt, max_tokens=32))
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=5)):
        request = GenerationRequest(prompt, max_tokens=32, k=4, sampling=sampling)
        runs = [Engine(model, tokenizer, p).run(request) for p in (compiled, uncompiled)]
        assert runs[0].output_ids == runs[1].output_ids
        assert runs[0].metrics.drafted_per_position == runs[1].metrics.drafted_per_position
        assert runs[0].metrics.accepted_per_position == runs[1].metrics.accepted_per_position
        assert runs[0].metrics.drafted > 0
        if sampling.temperature == 0:
            assert runs[0].output_ids == plain.output_ids


def test_a_float_head_drafts_without_the_compiled_path_and_the_same_way(toy_model_file):
    model = LlamaModel.load(toy_model_file(seed=3, tensor_type="Q8_0"), "f32")
    rng = np.random.default_rng(2)
    d, hidden = model.config.d_model, 32
    weights = dict(
        w_in=rng.normal(size=(2 * d, hidden)) * 0.5,
        b_in=rng.normal(size=hidden) * 0.5,
        w_out=rng.normal(size=(hidden, d)) * 0.5,
        vocab=np.arange(0, model.config.vocab_size, 2),
        target_fingerprint=model.fingerprint,
    )
    head = RecurrentHead.from_float(**weights, quantize=False)
    proposer = RecurrentHeadProposer(model, head)
    assert proposer._compiled is None and head.q8_0_arrays() is None
    hidden_state = model.forward([Segment(model.new_cache(), TOY_TOKENS[:5], 0)])[0].hidden[-1]
    ctx = ProposeContext(
        tokens=TOY_TOKENS[:5],
        n_output=0,
        last_hidden=hidden_state,
        params=SamplingParams(),
        stochastic=False,
        want_p_draft=False,
    )
    st, tok, want = hidden_state[None, :], TOY_TOKENS[4], []
    for _ in range(3):
        st, logits = by_hand(model, head, proposer.rows, st, tok)
        tok = int(head.vocab[draft_confidence(logits)[0]])
        want.append(tok)
    assert list(proposer.propose(ctx, 3).tokens) == want


def test_silu_and_the_confidence_against_float64():
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((3, 200)) * 8).astype(np.float32)
    z[0, :4] = [-100.0, 100.0, 0.0, -0.0]
    want = z.astype(np.float64) / (1.0 + np.exp(-z.astype(np.float64)))
    np.testing.assert_allclose(head_silu(z), want, rtol=2e-6, atol=1e-30)
    logits = (rng.standard_normal((4, 1000)) * 3).astype(np.float32)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1  # a tie: the first is the guess
    best, confidence = draft_confidences(logits)
    assert list(best) == list(np.argmax(logits, axis=1)) and best[1] == 7
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    np.testing.assert_allclose(confidence, 1.0 / np.exp(shifted).sum(axis=1), rtol=1e-6)
    assert draft_confidence(logits[2]) == (best[2], confidence[2])

"""The real default model (SmolLM2-135M-Instruct, Q4_1): golden greedy outputs, and
speculative decoding equal to plain decoding on it.

The golden ids were recorded once from this engine after its logits were checked
against HuggingFace transformers on the same GGUF (docs/parity.md): max |diff| below
1e-3 and identical greedy continuations. They were recorded on float32 products; the
products from the quantized blocks (qkernels) give the same ids.
"""

from __future__ import annotations

import numpy as np
import pytest

from specq.specdec import int8
from specq.specdec.engine import Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.model import Segment
from specq.specdec.proposers import DraftModelProposer, MedusaHeads, MedusaProposer, NgramProposer, NoProposer
from specq.specdec.qkernels import QuantizedMatrix
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import DecodeState, GenerationRequest

GOLDEN = {
    "What is the capital of France?": [504, 3575, 282, 4649, 314, 7042, 30, 2],
    "Write a Python function that adds two numbers.": [
        3725,
        5367,
        198,
        1604,
        803,
        79,
        11355,
        79,
        28707,
        24,
        2871,
        33,
        28,
        861,
        34,
        727,
        472,
        1003,
        861,
        33,
    ],
    "List three colors.": [
        33,
        30,
        3950,
        42,
        378,
        768,
        2378,
        2380,
        1486,
        260,
        216,
        33,
        33,
        4683,
        282,
        260,
        24594,
        30,
        198,
        34,
    ],
}


@pytest.fixture(scope="module")
def real(real_model_path):
    return load_model_and_tokenizer(real_model_path)


def _request(tokenizer, prompt, **kwargs):
    kwargs.setdefault("max_tokens", 20)
    kwargs.setdefault("adaptive", False)
    return GenerationRequest(prompt_ids=tuple(tokenizer.encode_chat([{"role": "user", "content": prompt}])), **kwargs)


def test_golden_greedy_outputs(real):
    model, tokenizer = real
    engine = Engine(model, tokenizer, NoProposer())
    for prompt, expected in GOLDEN.items():
        state = engine.run(_request(tokenizer, prompt))
        assert list(state.output_ids) == expected, prompt
    assert engine.text(engine.run(_request(tokenizer, "What is the capital of France?"))) == (
        "The capital of France is Paris."
    )


def test_quantized_products_match_float32_products_on_the_real_model(real):
    """The default model computes from its Q4_1/Q8_0 blocks; float32 products of the
    same values (the path checked against transformers) agree to about 1e-5 of the
    logit scale (docs/parity.md)."""
    model, tokenizer = real
    assert all(isinstance(lw.w_gate_up, QuantizedMatrix) for lw in model.weights.layers)
    assert isinstance(model.weights.w_output, QuantizedMatrix)
    ids = _request(tokenizer, "What is the capital of France?").prompt_ids
    got = model.forward([Segment(model.new_cache(), ids, 0)])[0].logits
    want = model.dequantized().forward([Segment(model.new_cache(), ids, 0)])[0].logits
    diff = np.abs(got - want).max()
    assert 0 < diff < 1e-3  # not 0: the quantized kernel ran, not BLAS on float32 values
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_speculative_greedy_equals_plain_on_the_real_model(real):
    model, tokenizer = real
    rng = np.random.default_rng(0)
    d = model.config.d_model
    heads = MedusaHeads(
        weights=(rng.normal(size=(3, d, d)) * 0.01).astype(np.float32),
        biases=np.zeros((3, d), np.float32),
        target_fingerprint=model.fingerprint,
        metadata={},
    )
    for proposer in (NgramProposer(), MedusaProposer(model, heads)):
        engine = Engine(model, tokenizer, proposer)
        for prompt, expected in list(GOLDEN.items())[1:]:
            state = engine.run(_request(tokenizer, prompt, k=4))
            assert list(state.output_ids) == expected, (proposer.name, prompt)


def test_the_default_proposer_is_the_shipped_head_and_keeps_greedy_output(real):
    """The shipped recurrent head, found by the model's sha256 and used by `auto`:
    it drafts, its drafts are often right, and the outputs stay the golden ones."""
    from specq.specdec.loader import make_proposer
    from specq.specdec.proposers import HybridProposer, RecurrentHeadProposer

    model, tokenizer = real
    proposer = make_proposer("auto", model, tokenizer)
    assert isinstance(proposer, HybridProposer) and isinstance(proposer.medusa, RecurrentHeadProposer)
    assert proposer.medusa.gate[0] > 0  # the gate chosen at training time, from the file
    drafted = accepted = 0
    for name, chosen in (("hybrid", proposer), ("recurrent", proposer.medusa)):
        engine = Engine(model, tokenizer, chosen)
        for prompt, expected in list(GOLDEN.items())[1:]:
            state = engine.run(_request(tokenizer, prompt, k=4))
            assert list(state.output_ids) == expected, (name, prompt)
            drafted += state.metrics.drafted
            accepted += state.metrics.accepted
    assert drafted > 0 and accepted / drafted > 0.4, (drafted, accepted)


def test_draft_model_that_is_the_target_accepts_everything_on_the_real_model(real):
    model, tokenizer = real
    engine = Engine(model, tokenizer, DraftModelProposer(model))
    prompt = "List three colors."
    state = engine.run(_request(tokenizer, prompt, max_tokens=12, k=3))
    assert list(state.output_ids) == GOLDEN[prompt][:12]
    assert state.metrics.drafted > 0 and state.metrics.accepted == state.metrics.drafted


@pytest.mark.slow
def test_sampled_resume_equals_uninterrupted_on_the_real_model(real):
    model, tokenizer = real
    engine = Engine(model, tokenizer, NgramProposer())
    req = _request(
        tokenizer,
        "Tell me a short story about a cat.",
        max_tokens=16,
        k=3,
        sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=123),
    )
    whole = engine.run(req)
    state, rounds = engine.start(req), 0
    while not state.finished:
        state = engine.session(DecodeState.from_dict(state.to_dict())).step()
        rounds += 1
    assert state.output_ids == whole.output_ids and rounds > 1


def test_greedy_resume_rebuilds_the_hidden_state_bit_for_bit_on_the_real_model(real):
    """A prompt of more than BULK_ROWS tokens, so the resume's prefill has BLAS and
    kernel rows to keep apart (docs/performance.md: they round differently)."""
    model, tokenizer = real
    engine = Engine(model, tokenizer, NoProposer())
    text = "Summarize: " + "The river rose after the rain, and the town moved its market uphill. " * 6
    req = _request(tokenizer, text, max_tokens=24, k=1)
    session = engine.session(engine.start(req))
    for _ in range(20):
        session.step()
    resumed = engine.session(DecodeState.from_dict(session.state.to_dict()))
    assert resumed.last_hidden.tobytes() == session.last_hidden.tobytes()


@pytest.mark.slow
@pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 precision needs AVX2")
def test_the_default_configuration_at_int8_equals_plain_int8_decoding(real):
    """At the int8 precision the shipped head drafts through the int8 output head,
    and speculative greedy decoding, alone and batched, still equals plain greedy
    decoding at int8."""
    from specq.specdec.loader import make_proposer

    model, tokenizer = real
    fast = model.at_precision("int8")
    engine = Engine(fast, tokenizer, make_proposer("auto", fast, tokenizer))
    plain = Engine(fast, tokenizer, NoProposer())
    requests = [_request(tokenizer, prompt, k=4, max_tokens=24) for prompt in GOLDEN]
    expected = [list(plain.run(r).output_ids) for r in requests]
    states = [engine.run(r) for r in requests]
    assert [list(s.output_ids) for s in states] == expected
    assert sum(s.metrics.accepted for s in states) > 0
    batched = engine.run_many(requests, group_size=4)
    assert [list(s.output_ids) for s in batched] == expected

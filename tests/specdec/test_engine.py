"""Engine invariants on toy models written to real GGUF files: speculative greedy
equals plain greedy for every proposer, resume equals uninterrupted, stops and
limits hold, and mismatched proposers are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from model_helpers import random_recurrent_head
from stats import chi_square, chi_square_critical

from specq.errors import ModelFileError, ParameterError
from specq.specdec.engine import Engine
from specq.specdec.loader import load_engine, load_model_and_tokenizer
from specq.specdec.matmul import BULK_ROWS
from specq.specdec.model import KVCache, Segment
from specq.specdec.proposers import (
    DraftModelProposer,
    HybridProposer,
    MedusaHeads,
    MedusaProposer,
    NgramProposer,
    NoProposer,
    RecurrentHead,
    RecurrentHeadProposer,
)
from specq.specdec.proposers.base import ProposeContext
from specq.specdec.sampling import SamplingParams, probabilities, race_indexes
from specq.specdec.state import DecodeState, GenerationRequest

PROMPTS = [
    "the cat sat on the mat and the cat",
    "Hello, world! 12345",
    "in the end it is the",
]


@pytest.fixture(scope="module")
def toy(toy_model_path):
    return load_model_and_tokenizer(toy_model_path)


@pytest.fixture(scope="module")
def other_toy(toy_model_file):
    """A different model with the same vocabulary: a draft that is often wrong."""
    return load_model_and_tokenizer(toy_model_file(seed=11))


def random_heads(model, n_heads: int = 4, seed: int = 0, scale: float = 0.05) -> MedusaHeads:
    rng = np.random.default_rng(seed)
    d = model.config.d_model
    return MedusaHeads(
        weights=(rng.normal(size=(n_heads, d, d)) * scale).astype(np.float32),
        biases=(rng.normal(size=(n_heads, d)) * scale).astype(np.float32),
        target_fingerprint=model.fingerprint,
        metadata={"made_by": "test"},
    )


def proposers(toy, other_toy):
    model, _ = toy
    return {
        "recurrent": RecurrentHeadProposer(model, random_recurrent_head(model)),
        # A gate that the random head's guesses pass at some depths and fail at others.
        "recurrent_gated": RecurrentHeadProposer(model, random_recurrent_head(model), gate=(0.15, 0.3)),
        "hybrid_recurrent": HybridProposer(NgramProposer(), RecurrentHeadProposer(model, random_recurrent_head(model))),
        "none": NoProposer(),
        "ngram": NgramProposer(),
        "draft_same": DraftModelProposer(model),
        "draft_other": DraftModelProposer(other_toy[0]),
        "medusa": MedusaProposer(model, random_heads(model)),
        "hybrid": HybridProposer(NgramProposer(), MedusaProposer(model, random_heads(model))),
    }


def request(tokenizer, prompt: str, **kwargs) -> GenerationRequest:
    """Mechanics tests draft exactly k tokens a round (adaptive=False) unless they say so."""
    kwargs.setdefault("max_tokens", 40)
    kwargs.setdefault("adaptive", False)
    return GenerationRequest(prompt_ids=tuple(tokenizer.encode_chat([{"role": "user", "content": prompt}])), **kwargs)


def plain_greedy(model, prompt_ids, n):
    """Reference: prefill, then one token per forward, argmax each time."""
    cache = model.new_cache()
    logits = model.forward([Segment(cache, prompt_ids, 0)])[0].logits[-1]
    out = []
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = model.forward([Segment(cache, [token], len(prompt_ids) + len(out) - 1)])[0].logits[-1]
    return out


@pytest.mark.parametrize(
    "name",
    [
        "none",
        "ngram",
        "draft_same",
        "draft_other",
        "medusa",
        "hybrid",
        "recurrent",
        "recurrent_gated",
        "hybrid_recurrent",
    ],
)
@pytest.mark.parametrize("k", [1, 3, 6])
def test_speculative_greedy_equals_plain_greedy(toy, other_toy, name, k):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, proposers(toy, other_toy)[name])
    total_drafted = 0
    for prompt in PROMPTS:
        req = request(tokenizer, prompt, k=k)
        state = engine.run(req)
        expected = plain_greedy(model, list(req.prompt_ids), len(state.output_ids))
        assert list(state.output_ids) == expected
        m = state.metrics
        assert m.emitted == len(state.output_ids) or state.finish_reason == "stop"
        assert sum(m.accepted_per_position) == m.accepted <= m.drafted == sum(m.drafted_per_position)
        total_drafted += m.drafted
        if name == "none":
            assert m.tau == 1.0 and m.drafted == 0
    assert (total_drafted > 0) == (name != "none")


@pytest.mark.parametrize(
    "name",
    ["ngram", "draft_same", "draft_other", "medusa", "hybrid", "recurrent", "recurrent_gated", "hybrid_recurrent"],
)
@pytest.mark.parametrize("k", [2, 5])
def test_speculative_race_sampling_equals_plain_race_sampling(toy, other_toy, name, k):
    """The race rule's committed tokens are its plain sampling's, token for token,
    whatever drafts them; a draft model identical to the target draws the target's
    own winners (the same race), so every draft is kept."""
    model, tokenizer = toy
    engine = Engine(model, tokenizer, proposers(toy, other_toy)[name])
    plain = Engine(model, tokenizer, NoProposer())
    drafted = accepted = 0
    for i, prompt in enumerate(PROMPTS):
        sampling = SamplingParams(temperature=0.9, top_p=0.95 if i % 2 else 1.0, seed=i)
        req = request(tokenizer, prompt, k=k, accept="race", sampling=sampling)
        state = engine.run(req)
        assert state.output_ids == plain.run(req).output_ids
        drafted += state.metrics.drafted
        accepted += state.metrics.accepted
    assert drafted > 0
    if name == "draft_same":
        assert accepted == drafted

    # A sample-rule request with the same seeds draws other tokens: the rule matters.
    def outputs(rule):
        runs = [
            plain.run(request(tokenizer, p, k=k, accept=rule, sampling=SamplingParams(temperature=0.9, seed=i)))
            for i, p in enumerate(PROMPTS)
        ]
        return [s.output_ids for s in runs]

    assert outputs("sample") != outputs("race") == outputs("auto")


def test_speculation_actually_saves_forwards(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, NgramProposer())
    state = engine.run(request(tokenizer, PROMPTS[0], max_tokens=60))
    assert state.metrics.accepted > 0
    assert state.metrics.target_forwards < len(state.output_ids)
    assert state.metrics.tau == pytest.approx(state.metrics.emitted / state.metrics.target_forwards)


def test_a_draft_identical_to_the_target_accepts_every_drafted_token(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, DraftModelProposer(model))
    for params in (SamplingParams(), SamplingParams(temperature=0.9, seed=3)):
        state = engine.run(request(tokenizer, PROMPTS[1], max_tokens=48, k=4, sampling=params))
        m = state.metrics
        assert m.drafted > 0 and m.accepted == m.drafted, params


@pytest.mark.parametrize(
    "name", ["none", "ngram", "draft_other", "medusa", "hybrid", "recurrent", "recurrent_gated", "hybrid_recurrent"]
)
@pytest.mark.parametrize(("temperature", "accept"), [(0.0, "auto"), (0.8, "auto"), (0.8, "race")])
def test_resume_after_every_round_equals_an_uninterrupted_run(toy, other_toy, name, temperature, accept):
    model, tokenizer = toy
    proposer = proposers(toy, other_toy)[name]
    engine = Engine(model, tokenizer, proposer)
    sampling = SamplingParams(temperature=temperature, seed=42)
    req = request(tokenizer, PROMPTS[0], max_tokens=36, k=4, accept=accept, sampling=sampling)
    uninterrupted = engine.run(req)

    state = engine.start(req)
    resumes = 0
    while not state.finished:
        # A new session from the JSON-serialized state: nothing survives but the value.
        state = DecodeState.from_dict(json.loads(json.dumps(state.to_dict())))
        state = engine.session(state).step()
        resumes += 1
    assert state.output_ids == uninterrupted.output_ids
    assert state.finish_reason == uninterrupted.finish_reason
    for field in ("target_forwards", "emitted", "drafted", "accepted", "accepted_per_position"):
        assert getattr(state.metrics, field) == getattr(uninterrupted.metrics, field), field
    assert state.metrics.resume_prefills == resumes - 1


@pytest.mark.parametrize("tensor_type", ["F32", "Q4_1"])
def test_a_resumed_cache_has_the_bits_of_the_uninterrupted_one(toy_model_file, tensor_type):
    """With a prompt and an output long enough for BLAS (matmul.BULK_ROWS rows), the
    rebuilt cache and hidden state equal the uninterrupted decode's bit for bit, so no
    near tie can break the other way after a resume."""
    model, tokenizer = load_model_and_tokenizer(toy_model_file(tensor_type=tensor_type))
    engine = Engine(model, tokenizer, NoProposer())
    req = request(tokenizer, " ".join(PROMPTS * 4), max_tokens=2 * BULK_ROWS + 8, k=1)
    assert len(req.prompt_ids) >= BULK_ROWS
    session = engine.session(engine.start(req))
    hidden = {}
    while not session.state.finished:
        state = session.step()
        hidden[len(state.output_ids)] = (state, session.last_hidden.copy())
    assert len(session.state.output_ids) > BULK_ROWS + 2
    n_filled = len(session.state.all_ids) - 1
    for cut in (1, 2, BULK_ROWS - 1, BULK_ROWS + 1, len(session.state.output_ids) - 1):
        state, want = hidden[cut]
        resumed = engine.session(DecodeState.from_dict(json.loads(json.dumps(state.to_dict()))))
        n = len(state.all_ids) - 1
        assert resumed.last_hidden.view(np.uint32).tolist() == want.view(np.uint32).tolist(), cut
        for resumed_part, part in zip(resumed.cache.stored(n), session.cache.stored(n), strict=True):
            np.testing.assert_array_equal(resumed_part, part)
        assert n <= n_filled


def test_seeded_sampling_is_reproducible_and_seed_dependent(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, NgramProposer())

    def run(seed):
        return engine.run(
            request(tokenizer, PROMPTS[2], sampling=SamplingParams(temperature=1.0, seed=seed))
        ).output_ids

    assert run(5) == run(5)
    assert len({run(s) for s in range(6)}) > 1


def test_max_tokens_is_exact(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, NgramProposer())
    for n in (1, 2, 7):
        state = engine.run(request(tokenizer, PROMPTS[0], max_tokens=n, k=5))
        assert len(state.output_ids) == n and state.finish_reason == "length"


class _EndsOn:
    """The toy tokenizer, with a chosen token declared end-of-turn."""

    def __init__(self, tokenizer, token: int) -> None:
        self._tokenizer = tokenizer
        self.end_of_turn_ids = frozenset({token})

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_end_of_turn_token_stops_generation_mid_round(toy):
    model, tokenizer = toy
    req = request(tokenizer, PROMPTS[0], max_tokens=40, k=5)
    free = Engine(model, tokenizer, NgramProposer()).run(req)
    # The first token that differs from its predecessor, so that it is a real stop.
    index = next(i for i in range(3, 40) if free.output_ids[i] != free.output_ids[i - 1])
    token = free.output_ids[index]
    first = free.output_ids.index(token)
    engine = Engine(model, _EndsOn(tokenizer, token), NgramProposer())
    state = engine.run(req)
    assert state.finish_reason == "stop"
    assert state.output_ids == free.output_ids[: first + 1]
    assert state.metrics.emitted >= len(state.output_ids)


def test_stop_strings_cut_the_text_and_are_never_streamed(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, NgramProposer())
    free = engine.run(request(tokenizer, PROMPTS[0], max_tokens=40))
    text = engine.text(free)
    stop = text[10:13]
    assert len(stop) == 3 and stop in text
    state = engine.start(request(tokenizer, PROMPTS[0], max_tokens=40, stop=(stop,)))
    streamed = ""
    for state in engine.generate(state):
        visible = engine.stream_text(state)
        assert visible.startswith(streamed), "streamed text only grows"
        assert stop not in visible
        streamed = visible
    assert state.finish_reason == "stop"
    assert engine.text(state) == text[: text.find(stop)]
    # The kept tokens are the fewest whose text contains the stop string.
    assert stop in tokenizer.decode(state.output_ids)
    assert stop not in tokenizer.decode(state.output_ids[:-1])
    assert state.output_ids == free.output_ids[: len(state.output_ids)]


def test_prompt_longer_than_the_context_is_refused(toy):
    model, tokenizer = toy
    engine = Engine(model, tokenizer, NgramProposer())
    ids = tuple([5] * model.config.context_length)
    with pytest.raises(ParameterError, match="context"):
        engine.start(GenerationRequest(prompt_ids=ids))


def test_generation_stops_at_the_context_end(toy_model_file):
    model, tokenizer = load_model_and_tokenizer(toy_model_file(context_length=64))
    engine = Engine(model, tokenizer, NgramProposer())
    state = engine.run(GenerationRequest(prompt_ids=tuple([5] * 50), max_tokens=100, k=5))
    assert state.finish_reason in ("length", "stop")
    assert len(state.all_ids) <= 64


def test_medusa_heads_file_round_trip_and_target_check(toy, other_toy, tmp_path):
    model, tokenizer = toy
    heads = random_heads(model, n_heads=3)
    path = str(tmp_path / "heads.gguf")
    heads.save(path)
    loaded = MedusaHeads.load(path)
    np.testing.assert_array_equal(loaded.weights, heads.weights)
    np.testing.assert_array_equal(loaded.biases, heads.biases)
    assert loaded.target_fingerprint == model.fingerprint and loaded.metadata == {"made_by": "test"}
    loaded.check_target(model, path)
    with pytest.raises(ModelFileError, match="were trained for model sha256"):
        loaded.check_target(other_toy[0], path)


def test_recurrent_head_file_round_trip_target_check_and_loading(toy, other_toy, toy_model_path, tmp_path):
    model, _ = toy
    head = random_recurrent_head(model)
    path = str(tmp_path / "recurrent.gguf")
    head.save(path)
    loaded = RecurrentHead.load(path)
    for name in ("w_in", "w_out"):
        assert getattr(loaded, name).type_name == "Q8_0"
        np.testing.assert_array_equal(getattr(loaded, name).dequantize(), getattr(head, name).dequantize())
    for name in ("b_in", "vocab"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(head, name))
    # A float32 head (quantize=False) round-trips too.
    flt = RecurrentHead.from_float(
        np.ones((2 * model.config.d_model, 8)),
        np.zeros(8),
        np.ones((8, model.config.d_model)),
        head.vocab,
        model.fingerprint,
        quantize=False,
    )
    flt.save(str(tmp_path / "f.gguf"))
    np.testing.assert_array_equal(RecurrentHead.load(str(tmp_path / "f.gguf")).w_in, flt.w_in)
    assert loaded.target_fingerprint == model.fingerprint and loaded.metadata == {"made_by": "test"}
    loaded.check_target(model, path)
    with pytest.raises(ModelFileError, match="were trained for model sha256"):
        loaded.check_target(other_toy[0], path)
    # The file says its kind: --medusa-heads takes it for medusa and hybrid alike.
    engine = load_engine(model_path=toy_model_path, proposer="medusa", medusa_heads_path=path)
    assert isinstance(engine.proposer, RecurrentHeadProposer)
    hybrid = load_engine(model_path=toy_model_path, proposer="hybrid", medusa_heads_path=path).proposer
    assert isinstance(hybrid, HybridProposer) and isinstance(hybrid.medusa, RecurrentHeadProposer)
    from dataclasses import replace

    bad = str(tmp_path / "bad.gguf")
    replace(head, vocab=np.array([0, model.config.vocab_size])).save(bad)
    with pytest.raises(ModelFileError, match="draft vocabulary"):
        load_engine(model_path=toy_model_path, proposer="medusa", medusa_heads_path=bad)


def test_recurrent_drafts_follow_the_head_through_the_draft_vocabulary(toy):
    """Each drafted token is the argmax, over the draft vocabulary, of the state the
    head reaches from the last hidden state and the tokens before it."""
    model, tokenizer = toy
    head = random_recurrent_head(model, scale=0.5)
    ids = tokenizer.encode("the cat sat on the")
    out = model.forward([Segment(model.new_cache(), ids, 0)])[0]
    ctx = ProposeContext(
        tokens=ids,
        n_output=0,
        last_hidden=out.hidden[-1],
        params=SamplingParams(),
        stochastic=False,
        want_p_draft=False,
    )
    draft = RecurrentHeadProposer(model, head).propose(ctx, 4)
    from specq.specdec.matmul import dequantized

    emb = dequantized(model.weights.token_embedding).astype(np.float64)
    rows = dequantized(model.weights.w_output).astype(np.float64)[head.vocab]
    w_in, w_out = head.w_in.dequantize().astype(np.float64), head.w_out.dequantize().astype(np.float64)
    state, token, want = out.hidden[-1][None, :].astype(np.float64), ids[-1], []
    for _ in range(4):
        z = np.concatenate([state, emb[[token]]], axis=1) @ w_in.T + head.b_in
        state = state + (z * 0.5 * (1 + np.tanh(z / 2))) @ w_out.T
        token = int(head.vocab[int(np.argmax(state @ rows.T))])
        want.append(token)
    assert list(draft.tokens) == want and all(t % 2 == 0 for t in draft.tokens)


def test_the_confidence_gate_cuts_the_chain_where_the_head_is_unsure(toy):
    model, tokenizer = toy
    head = random_recurrent_head(model)
    ids = tokenizer.encode("the cat sat on the")
    hidden = model.forward([Segment(model.new_cache(), ids, 0)])[0].hidden[-1]
    ctx = ProposeContext(
        tokens=ids, n_output=0, last_hidden=hidden, params=SamplingParams(), stochastic=False, want_p_draft=False
    )
    free = RecurrentHeadProposer(model, head)  # no gate in the file: every draft
    assert free.gate == (0.0,) and len(free.propose(ctx, 4).tokens) == 4
    assert RecurrentHeadProposer(model, head, gate=(1.0,)).propose(ctx, 4).tokens == ()  # nothing is that sure
    # The head's own confidences along the chain, from its products.
    from specq.specdec.matmul import embed, linear

    state, token, confidence = hidden[None, :], ids[-1], []
    for _ in range(4):
        state = head.step(state, embed(model.weights.token_embedding, np.array([token])))
        logits = linear(state, free.rows)[0].astype(np.float64)
        confidence.append(1.0 / np.exp(logits - logits.max()).sum())
        token = int(head.vocab[int(np.argmax(logits))])
    g2 = float(np.median(confidence[1:]))  # the gate for depths 2 and later
    length = next((j for j in range(1, 4) if confidence[j] < g2), 4)
    gated = RecurrentHeadProposer(model, head, gate=(0.0, g2)).propose(ctx, 4).tokens
    assert 0.02 < min(confidence) < max(confidence) < 0.98, confidence  # a head that is sometimes unsure
    assert 1 <= length < 4 and gated == free.propose(ctx, 4).tokens[:length]
    # From the file: the training run stores the gate in the metadata.
    from dataclasses import replace

    stored = RecurrentHeadProposer(model, replace(head, metadata={"gate": "0.25,0.5"}))
    assert stored.gate == (0.25, 0.5)
    # A gate per precision where the file has one (rows cost each its own share of a step).
    gates = {"gate": "0.75,0.9", "gate_int16": "0.3,0.45", "gate_int8": "0.2,0.35"}
    assert model.precision == "f32"
    assert RecurrentHeadProposer(model, replace(head, metadata=gates)).gate == (0.75, 0.9)
    int16 = model.at_precision("int16")
    assert RecurrentHeadProposer(int16, replace(head, metadata=gates)).gate == (0.3, 0.45)
    assert RecurrentHeadProposer(int16, replace(head, metadata={"gate": "0.25,0.5"})).gate == (0.25, 0.5)
    with pytest.raises(ModelFileError, match="confidence gate"):
        RecurrentHeadProposer(model, replace(head, metadata={"gate": "high"}))


def test_load_engine_refuses_mismatched_proposers(toy_model_path, toy_model_file, tmp_path):
    other_vocab = toy_model_file(n_merges=40)
    with pytest.raises(ModelFileError, match="vocabulary"):
        load_engine(model_path=toy_model_path, proposer="draft", draft_model_path=other_vocab)
    model, _ = load_model_and_tokenizer(other_vocab)
    heads_path = str(tmp_path / "h.gguf")
    random_heads(model).save(heads_path)
    with pytest.raises(ModelFileError, match="trained for"):
        load_engine(model_path=toy_model_path, proposer="medusa", medusa_heads_path=heads_path)
    with pytest.raises(ModelFileError, match="not a heads file"):
        load_engine(model_path=toy_model_path, proposer="medusa", medusa_heads_path=toy_model_path)
    with pytest.raises(ParameterError, match="needs --draft-model"):
        load_engine(model_path=toy_model_path, proposer="draft")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "accept"),
    [
        ("draft_other", "sample"),
        ("ngram", "sample"),
        ("medusa", "sample"),
        ("hybrid", "sample"),
        ("recurrent", "sample"),
        ("hybrid_recurrent", "sample"),
        ("draft_other", "race"),
        ("hybrid_recurrent", "race"),
    ],
)
def test_speculative_sampling_through_the_engine_keeps_the_target_distribution(toy, other_toy, name, accept):
    """End to end through the engine (seeded draws, draft rows, warping of both
    distributions): the two tokens of a speculative round follow the target's own
    joint distribution. top_k=3 keeps the joint small enough for a few thousand runs.
    (The race rule's tokens are its plain sampling's, test_speculative_race_sampling_
    equals_plain_race_sampling; this checks that sampling across two positions.)"""
    model, tokenizer = toy
    params = dict(temperature=1.5, top_k=3)
    engine = Engine(model, tokenizer, proposers(toy, other_toy)[name])
    prompt_ids = tuple(tokenizer.encode("the cat sat"))
    # Output token 0 comes from the prefill, which never drafts: start after it, so
    # that tokens 1 and 2 are decided by one speculative round (k = 2). Token 0 is
    # taken from the prompt so that prompt lookup finds a match.
    context = prompt_ids + (prompt_ids[0],)

    def target(ids):
        out = model.forward([Segment(model.new_cache(), list(ids), 0)])[0]
        return probabilities(out.logits[-1:], SamplingParams(**params))[0]

    p1 = target(context)
    joint = {(a, b): p1[a] * p for a in np.flatnonzero(p1) for b, p in enumerate(target(context + (a,))) if p > 0}
    cells = {key: i for i, key in enumerate(joint)}
    counts = np.zeros(len(cells))
    drafted = 0
    for seed in range(3000):
        req = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=3,
            k=3,
            adaptive=False,
            accept=accept,
            sampling=SamplingParams(seed=seed, **params),
        )
        state = DecodeState(request=req, output_ids=context[len(prompt_ids) :])
        for state in engine.generate(state):  # noqa: B007 - the last state is the result
            pass
        pair = state.output_ids[1:3]
        assert pair in cells, f"emitted {pair}, which the target gives zero probability"
        counts[cells[pair]] += 1
        drafted += state.metrics.drafted
    assert drafted >= 3000, "every run must have drafted"
    stat, dof = chi_square(counts, np.array(list(joint.values())))
    assert stat < chi_square_critical(dof), f"chi-square {stat:.1f} on {dof} dof"


@pytest.mark.parametrize(
    "name", ["ngram", "draft_other", "medusa", "hybrid", "recurrent", "recurrent_gated", "hybrid_recurrent"]
)
@pytest.mark.parametrize(("temperature", "accept"), [(0.0, "auto"), (0.9, "auto"), (0.9, "race")])
def test_batched_decoding_equals_each_request_alone(toy, other_toy, name, temperature, accept):
    """Ragged batches (prefills beside verification rounds of different lengths, slots
    refilled as requests finish) decode every request exactly as alone."""
    model, tokenizer = toy
    engine = Engine(model, tokenizer, proposers(toy, other_toy)[name])
    prompts = PROMPTS + ["a", "is the end of the mat the cat"]
    requests = [
        request(
            tokenizer,
            p,
            max_tokens=12 + 7 * i,
            k=2 + i % 3,
            adaptive=i % 2 == 0,
            accept=accept,
            sampling=SamplingParams(temperature=temperature, seed=i),
        )
        for i, p in enumerate(prompts)
    ]
    alone = [engine.run(r) for r in requests]
    together = engine.run_many(requests, group_size=3)
    assert [s.output_ids for s in together] == [s.output_ids for s in alone]
    assert [s.metrics.target_forwards for s in together] == [s.metrics.target_forwards for s in alone]
    assert all(s.finished for s in together)


def test_a_rounds_first_races_run_together(toy, monkeypatch):
    """In a group, the race rule's first rows of a round race in one call
    (engine._first_races), and every request still decodes exactly as alone."""
    from specq.specdec import engine as engine_module

    model, tokenizer = toy
    calls = []

    def counted(rows, params, keys):
        calls.append(len(rows))
        return race_indexes(rows, params, keys)

    monkeypatch.setattr(engine_module, "race_indexes", counted)
    engine = Engine(model, tokenizer, NgramProposer())
    requests = [
        request(tokenizer, p, max_tokens=15, k=2, sampling=SamplingParams(temperature=0.9, seed=i))
        for i, p in enumerate(PROMPTS)
    ]
    together = engine.run_many(requests, group_size=4)
    assert calls and max(calls) == min(4, len(PROMPTS))
    assert [s.output_ids for s in together] == [engine.run(r).output_ids for r in requests]


def test_a_kv_budget_bounds_the_requests_decoded_together(toy, monkeypatch):
    """With kv_budget, a request joins a round only while every cache fits: the
    largest set decoded together holds what the budget allows, and every request
    still decodes exactly as alone (one that alone exceeds the budget runs alone)."""
    from specq.specdec import engine as engine_module

    model, tokenizer = toy
    engine = Engine(model, tokenizer, NgramProposer())
    requests = [request(tokenizer, p, max_tokens=10 + 3 * i, k=2) for i, p in enumerate(PROMPTS * 2)]
    needs = [engine.kv_bytes(engine.start(r)) for r in requests]
    positions = KVCache.capacity_for(len(requests[0].prompt_ids) + 10 + 2 + 1)  # whole blocks of keys
    assert needs[0] == positions * model.kv_bytes_per_position
    cache = engine.session(engine.start(requests[0])).cache  # the figure is what the cache allocates
    assert cache.all_keys.nbytes + cache.all_values.nbytes == needs[0]
    sizes = []
    original = engine_module.DecodeGroup.round

    def counting(self):
        sizes.append((len(self), sum(engine.kv_bytes(s) for s in self.states().values())))
        return original(self)

    monkeypatch.setattr(engine_module.DecodeGroup, "round", counting)
    alone = [engine.run(r) for r in requests]
    budget = sorted(needs)[1] + sorted(needs)[2]  # two of the smaller ones, never three
    together = engine.run_many(requests, group_size=8, kv_budget=budget)
    assert [s.output_ids for s in together] == [s.output_ids for s in alone]
    batched = [(n, held) for n, held in sizes if n > 1]
    assert batched and all(held <= budget for _, held in batched)
    assert max(n for n, _ in batched) == 2
    sizes.clear()
    tiny = engine.run_many(requests[:3], group_size=8, kv_budget=1)
    assert [s.output_ids for s in tiny] == [s.output_ids for s in alone[:3]]
    assert {n for n, _ in sizes} == {1}


@pytest.mark.parametrize("precision", ["f32", "int16"])
@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "gemma", "gemma2", "gemma3"])
def test_other_architectures_speculative_resumed_and_batched_equal_plain(toy_model_file, precision, architecture):
    """qwen2 (q, k, v biases), qwen3 (q/k norms, wide heads), gemma (GeGLU, scaled
    embeddings), gemma2 (also post norms, sliding windows, soft caps) and gemma3 (q/k
    norms, local and global RoPE bases) files, RoPE over halves reordered at load:
    the engine's three exactness properties hold on them as on llama files."""
    from specq.specdec import int8

    if precision != "f32" and not int8.AVAILABLE:
        pytest.skip("the integer precisions need AVX2")
    extra = {"head_dim": 32} if architecture != "qwen2" else {}
    if architecture == "gemma3":
        extra.update(n_layers=6, sliding_window=16)  # layers 0-4 local, within 16 positions; 5 global
    if architecture == "gemma2":
        extra.update(sliding_window=16, softcaps=(5.0, 8.0))  # layer 0 local, 1 global
    path = toy_model_file(seed=11, architecture=architecture, tensor_type="Q4_1", embedding_type="Q8_0", **extra)
    model, tokenizer = load_model_and_tokenizer(path, precision)
    assert model.config.architecture == architecture and model._stack is None
    engine = Engine(model, tokenizer, NgramProposer())
    greedy = [request(tokenizer, p, max_tokens=30, k=4) for p in PROMPTS[:3]]
    for req in greedy:
        state = engine.run(req)
        assert list(state.output_ids) == plain_greedy(model, list(req.prompt_ids), len(state.output_ids))
    sampled = request(tokenizer, PROMPTS[0], max_tokens=30, k=4, sampling=SamplingParams(temperature=0.8, seed=4))
    uninterrupted = engine.run(sampled)
    state = engine.start(sampled)
    while not state.finished:
        state = engine.session(DecodeState.from_dict(json.loads(json.dumps(state.to_dict())))).step()
    assert state.output_ids == uninterrupted.output_ids
    batched = engine.run_many([*greedy, sampled], group_size=4)
    assert [s.output_ids for s in batched] == [engine.run(r).output_ids for r in [*greedy, sampled]]

"""The hybrid proposer (prompt lookup where the text repeats, heads elsewhere) and
the "auto" default that picks it when heads fit the model."""

from __future__ import annotations

import numpy as np
import pytest

from specq.errors import ParameterError
from specq.specdec import loader
from specq.specdec.loader import load_engine, load_model_and_tokenizer
from specq.specdec.proposers import HybridProposer, MedusaHeads, MedusaProposer, NgramProposer
from specq.specdec.proposers.base import ProposeContext
from specq.specdec.sampling import SamplingParams


def _heads(model, seed=0):
    rng = np.random.default_rng(seed)
    d = model.config.d_model
    return MedusaHeads(
        weights=(rng.normal(size=(3, d, d)) * 0.05).astype(np.float32),
        biases=np.zeros((3, d), np.float32),
        target_fingerprint=model.fingerprint,
        metadata={},
    )


def _ctx(tokens, model):
    return ProposeContext(
        tokens=tokens,
        n_output=1,
        last_hidden=np.ones(model.config.d_model, np.float32),
        params=SamplingParams(),
        stochastic=False,
        want_p_draft=False,
    )


def test_lookup_wins_on_a_two_token_match_and_heads_draft_otherwise(toy_model_path):
    model, _ = load_model_and_tokenizer(toy_model_path)
    medusa = MedusaProposer(model, _heads(model))
    hybrid = HybridProposer(NgramProposer(), medusa)
    repeating = [5, 6, 7, 8, 9, 5, 6]  # "5 6" occurred before, followed by 7 8 9
    assert hybrid.propose(_ctx(repeating, model), 3).tokens == (7, 8, 9)
    one_token_match = [5, 6, 7, 8, 9, 4, 7]  # only "7" repeats: too weak, the heads draft
    expected = medusa.propose(_ctx(one_token_match, model), 3).tokens
    assert hybrid.propose(_ctx(one_token_match, model), 3).tokens == expected
    assert NgramProposer().propose(_ctx(one_token_match, model), 3).tokens == (8, 9, 4)  # what lookup alone says


@pytest.fixture
def shipped_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "SHIPPED_HEADS_DIR", str(tmp_path))
    return tmp_path


def test_auto_is_hybrid_with_heads_that_fit_and_ngram_without(toy_model_path, toy_model_file, shipped_dir):
    model, _ = load_model_and_tokenizer(toy_model_path)
    assert isinstance(load_engine(model_path=toy_model_path).proposer, NgramProposer)  # nothing shipped
    _heads(model).save(str(shipped_dir / "toy.medusa.gguf"))
    chosen = load_engine(model_path=toy_model_path).proposer
    assert isinstance(chosen, HybridProposer) and chosen.medusa.heads.n_heads == 3
    assert isinstance(load_engine(model_path=toy_model_path, proposer="medusa").proposer, MedusaProposer)
    other = toy_model_file(seed=11)  # heads trained for another model are never used with this one
    assert isinstance(load_engine(model_path=other).proposer, NgramProposer)
    with pytest.raises(ParameterError, match="no shipped heads fit this model"):
        load_engine(model_path=other, proposer="hybrid")

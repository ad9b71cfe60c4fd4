"""Medusa heads (Cai et al. 2024): head i maps the target's last hidden state h to
h + SiLU(W_i h + b_i) and then through the target's own output head; head i predicts
the token i+1 positions after the one the target itself just predicted.

Heads are stored as a GGUF file (architecture "medusa") so that they carry their
metadata, above all the sha256 of the exact target model they were trained for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGUFWriter

from specq.errors import ModelFileError
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.model import LlamaModel
from specq.specdec.products import linear
from specq.specdec.proposers.base import Draft, ProposeContext
from specq.specdec.rng import DRAW_PROPOSE, uniform
from specq.specdec.sampling import probabilities, sample

HEADS_ARCHITECTURE = "medusa"


@dataclass(frozen=True)
class MedusaHeads:
    weights: np.ndarray  # [n_heads, d_in, d_out]: stored transposed so that h @ W
    biases: np.ndarray  # [n_heads, d]
    target_fingerprint: str  # sha256 of the target GGUF the heads were trained for
    metadata: dict  # free-form provenance (training data, accuracies)

    @property
    def n_heads(self) -> int:
        return self.weights.shape[0]

    @classmethod
    def load(cls, path: str) -> "MedusaHeads":
        f = GGUFFile(path)
        if f.get("general.architecture") != HEADS_ARCHITECTURE:
            raise ModelFileError(f"{path} is not a Medusa heads file (architecture {f.get('general.architecture')!r})")
        n_heads = int(f.require("medusa.head_count"))
        weights = np.stack([f.tensor(f"medusa.{i}.weight").T for i in range(n_heads)])
        biases = np.stack([f.tensor(f"medusa.{i}.bias").reshape(-1) for i in range(n_heads)])
        meta = {k[len("medusa.info."):]: v for k, v in f.metadata.items() if k.startswith("medusa.info.")}
        return cls(
            weights=np.ascontiguousarray(weights, dtype=np.float32),
            biases=biases.astype(np.float32),
            target_fingerprint=str(f.require("medusa.target.sha256")),
            metadata=meta,
        )

    def save(self, path: str) -> None:
        writer = GGUFWriter(path, HEADS_ARCHITECTURE)
        writer.add_uint32("medusa.head_count", self.n_heads)
        writer.add_string("medusa.target.sha256", self.target_fingerprint)
        for key, value in self.metadata.items():
            writer.add_string(f"medusa.info.{key}", str(value))
        for i in range(self.n_heads):
            writer.add_tensor(f"medusa.{i}.weight", np.ascontiguousarray(self.weights[i].T))  # (out, in)
            writer.add_tensor(f"medusa.{i}.bias", self.biases[i])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    def check_target(self, model: LlamaModel, path: str = "") -> None:
        d = model.config.d_model
        if self.weights.shape[1:] != (d, d):
            raise ModelFileError(
                f"Medusa heads {path} have width {self.weights.shape[1]}, the model has {d}"
            )
        if self.target_fingerprint != model.fingerprint:
            raise ModelFileError(
                f"Medusa heads {path} were trained for model sha256 {self.target_fingerprint[:12]}, "
                f"not for {model.path} (sha256 {model.fingerprint[:12]})"
            )

    def hidden(self, h: np.ndarray) -> np.ndarray:
        """h [d] -> each head's residual output [n_heads, d], to go through the output head."""
        z = np.einsum("d,hde->he", h, self.weights) + self.biases  # [n_heads, d]
        return h[None, :] + z / (1.0 + np.exp(-z))


def heads_target(path: str) -> str:
    """The sha256 of the model a heads file was trained for (reads only its header)."""
    return str(GGUFFile(path).get("medusa.target.sha256", ""))


class MedusaProposer:
    name = "medusa"
    # Each head adds one row to a product with the output head; the few-row kernel
    # makes that row cheap, but not free.
    draft_cost = 0.05

    def __init__(self, model: LlamaModel, heads: MedusaHeads) -> None:
        self.model = model
        self.heads = heads

    def session(self) -> "MedusaProposer":
        return self

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        k = min(k, self.heads.n_heads)
        if k <= 0:
            return Draft()
        head_hidden = self.heads.hidden(ctx.last_hidden)[:k]  # [k, d]
        logits = linear(head_hidden, self.model.weights.w_output)  # [k, V]: the target's own head
        if not (ctx.stochastic or ctx.want_p_draft):
            return Draft(tokens=tuple(int(t) for t in logits.argmax(axis=1)))
        p_draft = probabilities(logits, ctx.params)  # [k, V]
        if ctx.stochastic:
            tokens = tuple(
                sample(p_draft[i], uniform(ctx.params.seed, ctx.n_output + i, DRAW_PROPOSE)) for i in range(k)
            )
        else:
            tokens = tuple(int(t) for t in p_draft.argmax(axis=1))
        return Draft(tokens=tokens, p_draft=p_draft if ctx.want_p_draft else None)

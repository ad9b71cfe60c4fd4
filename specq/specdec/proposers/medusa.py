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
from specq.specdec.gguf_file import GGUFFile, write_file
from specq.specdec.matmul import linear
from specq.specdec.model import LlamaModel
from specq.specdec.proposers.base import Draft, ProposeContext
from specq.specdec.rng import DRAW_PROPOSE, race_key, uniform
from specq.specdec.sampling import probabilities, race_index, sample

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
    def load(cls, path: str) -> MedusaHeads:
        f = GGUFFile(path)
        if f.get("general.architecture") != HEADS_ARCHITECTURE:
            raise ModelFileError(
                f"{path} is not a heads file, Medusa or recurrent (architecture {f.get('general.architecture')!r})"
            )
        n_heads = int(f.require("medusa.head_count"))
        weights = np.stack([f.tensor(f"medusa.{i}.weight").T for i in range(n_heads)])
        biases = np.stack([f.tensor(f"medusa.{i}.bias").reshape(-1) for i in range(n_heads)])
        meta = {k[len("medusa.info.") :]: v for k, v in f.metadata.items() if k.startswith("medusa.info.")}
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
        write_file(writer)

    def check_target(self, model: LlamaModel, path: str = "") -> None:
        d = model.config.d_model
        if self.weights.shape[1:] != (d, d):
            raise ModelFileError(f"Medusa heads {path} have width {self.weights.shape[1]}, the model has {d}")
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
    """The sha256 of the model a heads file (Medusa or recurrent) was trained for
    (reads only its header)."""
    f = GGUFFile(path)
    return str(f.get(f"{f.get('general.architecture')}.target.sha256", ""))


Path = tuple[int, ...]  # a tree node: the rank of its token in head 0's list, head 1's, ...


def parse_tree(text: str) -> list[Path]:
    """ "0;1;0,0" -> [(0,), (1,), (0, 0)], checked and put in breadth-first order, so
    that any leading part of the list is itself a tree (parents before children)."""
    paths = [tuple(int(r) for r in part.split(",")) for part in text.split(";") if part.strip()]
    if any(not p or min(p) < 0 for p in paths) or len(set(paths)) != len(paths):
        raise ModelFileError(f"Medusa tree {text!r}: nodes must be distinct lists of ranks >= 0")
    present = set(paths)
    if any(len(p) > 1 and p[:-1] not in present for p in paths):
        raise ModelFileError(f"Medusa tree {text!r}: a node's parent is missing")
    return sorted(paths, key=lambda p: (len(p), p))


def format_tree(paths: list[Path]) -> str:
    return ";".join(",".join(str(r) for r in p) for p in paths)


def top_ranked(logits: np.ndarray, r: int) -> np.ndarray:
    """[rows, r]: each row's r best token ids, best first, ties to the lower id (as
    argmax). A full sort of 49,152 logits per head would cost a fifth of a step."""
    top = np.argpartition(-logits, r - 1, axis=1)[:, :r]
    values = np.take_along_axis(logits, top, axis=1)
    order = np.lexsort((top, -values), axis=1)
    return np.take_along_axis(top, order, axis=1)


class MedusaProposer:
    name = "medusa"
    # Each head adds one row to a product with the output head; the few-row kernel
    # makes that row cheap, but not free.
    draft_cost = 0.05

    def __init__(self, model: LlamaModel, heads: MedusaHeads, tree: list[Path] | None = None) -> None:
        """`tree`: candidates verified together under the greedy rule (default: the
        heads file's measured tree, if it has one); a chain of top-1 guesses otherwise."""
        self.model = model
        self.heads = heads
        if tree is None and heads.metadata.get("tree"):
            tree = parse_tree(heads.metadata["tree"])
        self.tree = [p for p in (tree or []) if len(p) <= heads.n_heads]

    def session(self) -> MedusaProposer:
        return self

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        k = min(k, self.heads.n_heads)
        if k <= 0:
            return Draft()
        if ctx.tree_ok and self.tree:
            return self._tree_draft(ctx, k)
        head_hidden = self.heads.hidden(ctx.last_hidden)[:k]  # [k, d]
        logits = linear(head_hidden, self.model.weights.w_output)  # [k, V]: the target's own head
        if ctx.race:
            keys = [race_key(ctx.params.seed, ctx.n_output + i) for i in range(k)]
            return Draft(tokens=tuple(race_index(logits[i], ctx.params, keys[i]) for i in range(k)))
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

    def _tree_draft(self, ctx: ProposeContext, k: int) -> Draft:
        nodes = [p for p in self.tree if len(p) <= k]
        if ctx.max_rows:
            nodes = nodes[: ctx.max_rows]  # breadth-first: what is left is still a tree
        depth = max(len(p) for p in nodes)
        logits = linear(self.heads.hidden(ctx.last_hidden)[:depth], self.model.weights.w_output)  # [depth, V]
        ranked = top_ranked(logits, max(max(p) for p in nodes) + 1)
        index = {p: i for i, p in enumerate(nodes)}
        return Draft(
            tokens=tuple(int(ranked[len(p) - 1, p[-1]]) for p in nodes),
            parents=tuple(index[p[:-1]] if len(p) > 1 else -1 for p in nodes),
        )

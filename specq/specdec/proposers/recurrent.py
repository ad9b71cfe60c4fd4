"""Recurrent Medusa heads: one head, applied once per drafted token, that reads the
token it continues as well as a hidden state (as Hydra's and EAGLE's heads do).

A Medusa head sees only the target's last hidden state h_t, which was computed
before the target chose token t+1; asked for token t+2 it has to guess t+1 as well.
This head is given t+1:

    s_0 = h_t                                  (the target's final-normed hidden state)
    s_j = s_{j-1} + SiLU([s_{j-1}, e(y_j)] W_in + b_in) W_out
    y_{j+1} = argmax over the draft vocabulary of s_j . output_head[y]

where y_1 is the target's own token t+1 and e() the target's token embedding. s_j
is trained to be the target's next hidden state as well as to predict its token, so
that it can be fed back for the next draft.

The head ranks only a draft vocabulary: the tokens most frequent in its training
answers (stored in the file). A full 49,152-row output head per drafted token would
cost 0.15 of a target step; the draft vocabulary's rows cost a sixth of that, and a
token outside it is rare in the model's own answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize as gguf_quantize

from specq.errors import ModelFileError
from specq.specdec.gguf_file import GGUFFile, write_file
from specq.specdec.int8 import Int8Matrix
from specq.specdec.matmul import Weight, embed, linear
from specq.specdec.model import LlamaModel
from specq.specdec.proposers.base import Draft, ProposeContext
from specq.specdec.proposers.recurrent_kernels import (
    draft_confidence,
    greedy_chain,
    head_silu,
    head_step_q8_0,
    q8_0_arrays,
    rows_arrays,
    step_logits,
)
from specq.specdec.proposers.recurrent_kernels import threads as kernel_threads
from specq.specdec.qkernels import QuantizedMatrix
from specq.specdec.rng import DRAW_PROPOSE, race_key, uniform
from specq.specdec.sampling import race_index, sample, warped_row

RECURRENT_ARCHITECTURE = "medusa_recurrent"


# The float arithmetic of training and research scripts (any dtype). Drafting uses
# recurrent_kernels.head_silu, whose bits every drafting path shares.
def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # 1 / (1 + e^-z), without overflowing for large -z


def silu(z: np.ndarray) -> np.ndarray:
    return z * sigmoid(z)


@dataclass(frozen=True)
class RecurrentHead:
    w_in: Weight  # [hidden, 2d]: (state, token embedding) -> hidden, as the model's matrices
    b_in: np.ndarray  # [hidden]
    w_out: Weight  # [d, hidden]
    vocab: np.ndarray  # [n] int64, ascending: the tokens the head may propose
    target_fingerprint: str  # sha256 of the target GGUF the head was trained for
    metadata: dict  # free-form provenance (training data, accuracies)

    @classmethod
    def from_float(
        cls,
        w_in: np.ndarray,
        b_in: np.ndarray,
        w_out: np.ndarray,
        vocab: np.ndarray,
        target_fingerprint: str,
        metadata: dict | None = None,
        quantize: bool = True,
    ) -> RecurrentHead:
        """From trained float32 w_in [2d, hidden] and w_out [hidden, d] (used as x @ W).
        Quantized to Q8_0 by default (where the widths are whole blocks): the head's products then read a quarter of the
        bytes (1.9 MB instead of 7.5 for the default head), and every user of the head
        (the proposer, the accuracy figures) computes with the same stored values."""

        def matrix(w: np.ndarray) -> Weight:
            w = np.ascontiguousarray(w.T, dtype=np.float32)  # [n_out, n_in]
            if not quantize or w.shape[1] % 32:  # Q8_0 blocks are 32 values of a row
                return w
            raw = gguf_quantize(w, GGMLQuantizationType.Q8_0)
            return QuantizedMatrix.from_gguf_bytes(raw, "Q8_0", w.shape)

        return cls(
            matrix(w_in),
            np.asarray(b_in, np.float32),
            matrix(w_out),
            np.asarray(vocab, np.int64),
            target_fingerprint,
            dict(metadata or {}),
        )

    @property
    def d_model(self) -> int:
        return self.w_out.shape[0]

    def step(self, state: np.ndarray, embedded: np.ndarray) -> np.ndarray:
        """States [n, d] and the embeddings of the tokens they continue [n, d] -> next
        states. Q8_0 matrices (every trained head's) take one compiled call; the
        bits are the same either way (recurrent_kernels)."""
        state = np.ascontiguousarray(state, dtype=np.float32)
        embedded = np.ascontiguousarray(embedded, dtype=np.float32)
        arrays = self.q8_0_arrays()
        if arrays is not None:
            return head_step_q8_0(state, embedded, arrays, kernel_threads())
        z = linear(np.concatenate([state, embedded], axis=1), self.w_in) + self.b_in
        return state + linear(head_silu(np.ascontiguousarray(z, dtype=np.float32)), self.w_out)

    def q8_0_arrays(self) -> tuple | None:
        """(w_in's quants and scales, b_in, w_out's quants and scales) for the compiled
        step, where both matrices are Q8_0; else None."""
        w_in, w_out = q8_0_arrays(self.w_in), q8_0_arrays(self.w_out)
        if w_in is None or w_out is None:
            return None
        return (*w_in, np.ascontiguousarray(self.b_in, dtype=np.float32), *w_out)

    @classmethod
    def load(cls, path: str) -> RecurrentHead:
        f = GGUFFile(path)
        prefix = RECURRENT_ARCHITECTURE
        if f.get("general.architecture") != prefix:
            raise ModelFileError(
                f"{path} is not a recurrent heads file (architecture {f.get('general.architecture')!r})"
            )
        meta = {k[len(prefix) + 6 :]: v for k, v in f.metadata.items() if k.startswith(prefix + ".info.")}
        ids = np.asarray(f.tensor(f"{prefix}.vocab"), dtype=np.float64).reshape(-1)
        vocab = ids.astype(np.int64)
        if not np.array_equal(vocab, ids) or np.any(np.diff(vocab) <= 0):
            raise ModelFileError(f"{path}: the draft vocabulary is not a list of ascending token ids")

        def matrix(name: str) -> Weight:
            if f.tensor_info(name).type_name == "Q8_0":
                raw = f.raw_tensor(name)
                return QuantizedMatrix.from_gguf_bytes(raw.data, raw.type_name, raw.shape)
            return np.ascontiguousarray(f.tensor(name), dtype=np.float32)

        w_in, w_out = matrix(f"{prefix}.in.weight"), matrix(f"{prefix}.out.weight")
        b_in = np.asarray(f.tensor(f"{prefix}.in.bias"), dtype=np.float32).reshape(-1)
        if w_in.shape[0] != b_in.shape[0] or w_out.shape[1] != w_in.shape[0] or w_in.shape[1] != 2 * w_out.shape[0]:
            raise ModelFileError(f"{path}: the head's matrices {w_in.shape}, {w_out.shape} do not fit together")
        return cls(w_in, b_in, w_out, vocab, str(f.require(f"{prefix}.target.sha256")), meta)

    def save(self, path: str) -> None:
        prefix = RECURRENT_ARCHITECTURE
        writer = GGUFWriter(path, prefix)
        writer.add_string(f"{prefix}.target.sha256", self.target_fingerprint)
        for key, value in self.metadata.items():
            writer.add_string(f"{prefix}.info.{key}", str(value))
        for name, w in ((f"{prefix}.in.weight", self.w_in), (f"{prefix}.out.weight", self.w_out)):
            if isinstance(w, QuantizedMatrix):
                raw = w.to_gguf_bytes()
                writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[w.type_name])
            else:
                writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
        writer.add_tensor(f"{prefix}.in.bias", self.b_in.astype(np.float32))
        # float32 holds token ids exactly up to 2**24, and is a type every reader takes.
        writer.add_tensor(f"{prefix}.vocab", self.vocab.astype(np.float32))
        write_file(writer)

    def check_target(self, model: LlamaModel, path: str = "") -> None:
        d = model.config.d_model
        if self.d_model != d:
            raise ModelFileError(f"recurrent heads {path} have width {self.d_model}, the model has {d}")
        if self.target_fingerprint != model.fingerprint:
            raise ModelFileError(
                f"recurrent heads {path} were trained for model sha256 {self.target_fingerprint[:12]}, "
                f"not for {model.path} (sha256 {model.fingerprint[:12]})"
            )
        if self.vocab.size == 0 or self.vocab.min() < 0 or self.vocab.max() >= model.config.vocab_size:
            raise ModelFileError(
                f"recurrent heads {path}: draft vocabulary ids outside the model's {model.config.vocab_size}"
            )


def draft_output_head(model: LlamaModel, vocab: np.ndarray) -> Weight:
    """The target's output head restricted to the draft vocabulary's rows, kept in its
    own quantization (so its rows give the same logits as the full head)."""
    w = model.weights.w_output
    if isinstance(w, (QuantizedMatrix, Int8Matrix)):
        return w.select_rows(vocab)
    return np.ascontiguousarray(w[vocab])


def parse_gate(text: str) -> tuple[float, ...]:
    """ "0.7,0.9" -> (0.7, 0.9): the confidence a draft at depth 1, 2 (and deeper, the
    last figure) needs."""
    try:
        gate = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        gate = (-1.0,)
    if not gate or any(not 0.0 <= g <= 1.0 for g in gate):
        raise ModelFileError(f"recurrent heads: confidence gate {text!r} is not a list of numbers in [0, 1]")
    return gate


@dataclass(frozen=True)
class GateAtCost:
    row_cost: float  # a verification row's cost relative to the request's plain round
    gate: tuple[float, ...]
    tokens_per_cost: float  # expected on the held-out answers at that cost; <= 1: drafting loses


def format_gate_table(table: Sequence[GateAtCost]) -> str:
    return ";".join(f"{e.row_cost:g}:{','.join(f'{g:.2f}' for g in e.gate)},{e.tokens_per_cost:.4f}" for e in table)


def parse_gate_table(text: str) -> tuple[GateAtCost, ...]:
    """ "0.2:0.45,0.70,1.1530;0.6:..." -> entries by row cost: the gate (one figure a
    depth, the last for deeper ones) and the tokens per unit of cost it expects."""
    table = []
    try:
        for item in text.split(";"):
            cost, figures = item.split(":")
            *gate, rate = (float(x) for x in figures.split(","))
            table.append(GateAtCost(float(cost), tuple(gate), rate))
    except ValueError:
        table = []
    if not table or any(e.row_cost <= 0 or not e.gate or not all(0.0 <= g <= 1.0 for g in e.gate) for e in table):
        raise ModelFileError(f"recurrent heads: gate table {text!r} is not a list of cost:gate...,rate entries")
    return tuple(sorted(table, key=lambda e: e.row_cost))


class RecurrentHeadProposer:
    name = "medusa"
    # Per drafted token: the head's two Q8_0 products (1.8 M weights) and the draft
    # vocabulary's rows of the output head (7,911 for the shipped head): measured
    # 0.45 to 0.58 ms against a 8.1 ms one-row step, so 0.06 of a step.
    draft_cost = 0.06

    def __init__(self, model: LlamaModel, head: RecurrentHead, gate: tuple[float, ...] | None = None) -> None:
        """`gate`: the head's own probability for its guess (softmax over the draft
        vocabulary) that a draft at depth 1, 2, ... needs, else the chain stops there
        (default: the gate chosen at training time for the model's precision and
        stored in the file, `gate_int16` say, else its `gate`, chosen for f32; none if
        it has none). A verification row costs 0.4 of a step at f32 and 0.2 at int16,
        so a guess right less than about half (a sixth) of the time costs more than
        it brings; the head's confidence tells those apart (docs/medusa.md)."""
        self.model = model
        self.head = head
        self.rows = draft_output_head(model, head.vocab)
        self._compiled = CompiledDrafts.build(model, head, self.rows)
        table = head.metadata.get("gate_by_row_cost")
        # An explicit gate is the caller's choice at every cost; so is a file without a table.
        self.gate_table = parse_gate_table(table) if table and gate is None else ()
        if gate is None:
            stored = head.metadata.get(f"gate_{model.precision}") or head.metadata.get("gate")
            gate = parse_gate(stored) if stored else (0.0,)
        self.gate = tuple(gate)

    def session(self) -> RecurrentHeadProposer:
        return self

    def gate_at(self, row_cost: float | None) -> tuple[float, ...] | None:
        """The gate for a row of this relative cost (the table's nearest entry, on a
        log scale), or None where no gate makes the head's drafts pay there."""
        if row_cost is None or not self.gate_table:
            return self.gate
        entry = min(self.gate_table, key=lambda e: abs(np.log(e.row_cost / max(row_cost, 1e-6))))
        return entry.gate if entry.tokens_per_cost > 1.0 else None

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        gate = self.gate_at(ctx.row_cost)
        if k <= 0 or gate is None:
            return Draft()
        vocab_size = self.model.config.vocab_size
        state = np.ascontiguousarray(ctx.last_hidden, dtype=np.float32)[None, :]
        token = int(ctx.tokens[-1])
        compiled = self._compiled
        if compiled is not None and not (ctx.stochastic or ctx.want_p_draft or ctx.race):
            drafted = compiled.greedy(state, token, k, gate)
            return Draft(tokens=tuple(int(t) for t in drafted)) if drafted.size else Draft()
        tokens: list[int] = []
        # The draft's distributions over the whole vocabulary, zero outside the draft
        # vocabulary: allocated once a proposal (a fresh row of 49,152 costs its page
        # faults), and warped over the draft vocabulary's logits alone. Tokens outside
        # it have probability zero either way, and its ids ascend, so a draw and its
        # ties go as over the whole row.
        dists = np.zeros((k, vocab_size)) if ctx.want_p_draft else None
        for i in range(k):
            state, logits = self.step_logits(state, token)
            best, confidence = draft_confidence(logits)
            # The gate reads the head's own distribution at temperature 1, whatever the
            # request's sampling: the draft's length depends on the draft side only, so
            # the acceptance rules stay exact.
            if confidence < gate[min(i, len(gate) - 1)]:
                break
            if ctx.race:
                # Raced with the noise the target's race gives these token ids.
                key = race_key(ctx.params.seed, ctx.n_output + i)
                token = int(self.head.vocab[race_index(logits, ctx.params, key, self.head.vocab)])
            elif not (ctx.stochastic or ctx.want_p_draft):
                token = int(self.head.vocab[best])
            else:
                p = warped_row(logits, ctx.params)  # [n] over the draft vocabulary
                chosen = (
                    sample(p, uniform(ctx.params.seed, ctx.n_output + i, DRAW_PROPOSE))
                    if ctx.stochastic
                    else int(np.argmax(p))
                )
                token = int(self.head.vocab[chosen])
                if dists is not None:
                    dists[i, self.head.vocab] = p
            tokens.append(token)
        if not tokens:
            return Draft()
        return Draft(tokens=tuple(tokens), p_draft=dists[: len(tokens)] if dists is not None else None)

    def step_logits(self, state: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        """One draft step from state [1, d] and the token it continues: (the next state,
        its logits [n] float32 over the draft vocabulary)."""
        if self._compiled is not None:
            return self._compiled.step(state, token)
        state = self.head.step(state, embed(self.model.weights.token_embedding, np.array([token])))
        return state, linear(state, self.rows)[0]


class CompiledDrafts:
    """The proposer's drafting as compiled calls (recurrent_kernels), where the head's
    matrices and the draft rows are Q8_0 (the default model's, at every precision).
    It keeps the draft vocabulary's embeddings as float32 rows (the shipped head's
    8,192: 19 MB): a drafted token's row is then 36 cache lines, where the model's
    embedding, laid out for products, spreads a row over 576."""

    def __init__(self, model: LlamaModel, head: RecurrentHead, arrays: tuple, rows: tuple) -> None:
        self.model, self.head, self.arrays, self.rows = model, head, arrays, rows
        self.table = embed(model.weights.token_embedding, head.vocab)  # [n, d] float32
        self.index = np.full(model.config.vocab_size, -1, dtype=np.int64)  # token -> its table row
        self.index[head.vocab] = np.arange(len(head.vocab))

    @classmethod
    def build(cls, model: LlamaModel, head: RecurrentHead, draft_rows: Weight) -> CompiledDrafts | None:
        arrays, rows = head.q8_0_arrays(), rows_arrays(draft_rows)
        return None if arrays is None or rows is None else cls(model, head, arrays, rows)

    def embedded(self, token: int) -> np.ndarray:
        """[1, d]: the token's embedding, from the table where the draft vocabulary has it."""
        i = self.index[token]
        if i >= 0:
            return self.table[i : i + 1]
        return embed(self.model.weights.token_embedding, np.array([token]))

    def greedy(self, state: np.ndarray, token: int, k: int, gate: tuple[float, ...]) -> np.ndarray:
        gates = np.asarray(gate, dtype=np.float64)
        embedded = self.embedded(token)
        return greedy_chain(
            state, embedded, k, gates, self.arrays, self.rows, self.table, self.head.vocab, kernel_threads()
        )

    def step(self, state: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        return step_logits(state, self.embedded(token), self.arrays, self.rows, kernel_threads())

"""Training a recurrent head (specq.specdec.proposers.recurrent) on collected features.

A training row is a position t of an answer: the target's hidden state h_t, the
answer's token t+1, and the target's greedy choices after it. The head's first step,
s_1 = step(h_t, e(t+1)), is scored twice: cross-entropy of s_1 through the draft
vocabulary's rows of the output head against token t+2, and the squared distance of
s_1 to the target's own next hidden state h_{t+1} (EAGLE's feature regression), so
that s_1 can stand in for h_{t+1} when the head is applied again. The second step,
step(s_1, e(t+2)) against token t+3 and h_{t+2}, is trained on the head's own s_1,
held fixed, the way the proposer will feed it: errors of the first step are then
inputs the second has seen.

Accuracy is measured as the proposer drafts: chained, on held-out answers, with the
stored (Q8_0) head and the proposer's own products.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from specq.specdec.matmul import embed, linear
from specq.specdec.model import LlamaModel
from specq.specdec.proposers.recurrent import RecurrentHead, draft_output_head, sigmoid
from specq.specdec.proposers.recurrent_kernels import draft_confidences
from specq.training.configs import RecurrentConfig
from specq.training.features import NO_LABEL, Features
from specq.training.heads import Adam


@dataclass
class ChainAccuracy:
    top1: list[float] = field(default_factory=list)  # per depth: the draft right, earlier ones given right
    top5: list[float] = field(default_factory=list)
    chain: list[float] = field(default_factory=list)  # per depth: all drafts up to it right, as the proposer chains
    rows: list[int] = field(default_factory=list)
    vocab_coverage: float = 0.0  # share of held-out labels inside the draft vocabulary


def draft_vocabulary(train: Features, size: int) -> np.ndarray:
    """The `size` tokens most frequent among the training labels, ascending by id
    (ties by id, so the choice is reproducible)."""
    labels = train.labels[train.labels != NO_LABEL]
    ids, counts = np.unique(labels, return_counts=True)
    keep = np.lexsort((ids, -counts))[:size]
    return np.sort(ids[keep])


class _Params:
    def __init__(self, d: int, hidden: int, rng: np.random.Generator) -> None:
        self.w_in = (rng.standard_normal((2 * d, hidden)) / np.sqrt(2 * d)).astype(np.float32)
        self.b_in = np.zeros(hidden, np.float32)
        # Zero: the head starts as the identity on the state, and learns from there.
        self.w_out = np.zeros((hidden, d), np.float32)

    def as_list(self) -> list[np.ndarray]:
        return [self.w_in, self.b_in, self.w_out]


def step_loss_and_grads(
    state: np.ndarray,
    embedded: np.ndarray,
    label: np.ndarray,
    next_hidden: np.ndarray,
    w_in: np.ndarray,
    b_in: np.ndarray,
    w_out: np.ndarray,
    head_rows: np.ndarray,
    reg_weight: float,
    reg_scale: float,
) -> tuple[float, np.ndarray, tuple[np.ndarray, ...]]:
    """One head step on rows state, embedded [r, d]: the loss (cross-entropy where
    label >= 0, over head_rows [S, d]; squared distance to next_hidden where it is
    finite, divided by reg_scale) and its gradients. Returns (loss, new states, grads)."""
    x = np.concatenate([state, embedded], axis=1)  # [r, 2d]
    z = x @ w_in + b_in  # [r, H]
    sig = sigmoid(z)
    act = z * sig
    new = state + act @ w_out  # [r, d]
    d_new = np.zeros_like(new)
    loss = 0.0
    has = label >= 0
    if has.any():
        logits = new[has] @ head_rows.T  # [r', S]
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        picked = np.arange(int(has.sum()))
        loss += float(-np.log(p[picked, label[has]] + 1e-12).mean())
        p[picked, label[has]] -= 1.0
        d_new[has] += (p / has.sum()) @ head_rows
    near = np.isfinite(next_hidden[:, 0])
    if near.any() and reg_weight:
        diff = new[near] - next_hidden[near]
        loss += reg_weight * float((diff * diff).sum(axis=1).mean()) / reg_scale
        d_new[near] += reg_weight * 2.0 * diff / (near.sum() * reg_scale)
    g_out = act.T @ d_new
    dz = (d_new @ w_out.T) * (sig * (1.0 + z * (1.0 - sig)))
    return loss, new, [x.T @ dz, dz.sum(axis=0), g_out]


def _targets(features: Features):
    """Per row: the embedding of token t+1, of token t+2, and the target's hidden
    states h_{t+1} and h_{t+2} (NaN where the answer has ended)."""
    nxt = features.next_rows()
    nxt2 = np.where(nxt >= 0, nxt[np.maximum(nxt, 0)], -1)
    d = features.hidden.shape[1]

    def hidden_at(rows: np.ndarray) -> np.ndarray:
        out = np.full((len(rows), d), np.nan, np.float32)
        out[rows >= 0] = features.hidden[rows[rows >= 0]]
        return out

    return nxt, nxt2, hidden_at


def train_recurrent(
    train: Features,
    embedding: np.ndarray,
    output_head: np.ndarray,
    config: RecurrentConfig,
    progress: Callable[[int, int, float], None] = lambda step, steps, loss: None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(w_in, b_in, w_out, vocab) trained on `train`; `embedding` and `output_head` are
    the target's float32 [vocab, d] matrices (the same one when tied)."""
    if train.labels.shape[1] < 2:
        raise ValueError("recurrent heads train two steps: features need labels for 2 positions")
    rng = np.random.default_rng(config.seed)
    d = train.hidden.shape[1]
    vocab = draft_vocabulary(train, config.vocab)
    head_rows = np.ascontiguousarray(output_head[vocab])
    local = np.where(np.isin(train.labels, vocab), np.searchsorted(vocab, np.maximum(train.labels, 0)), NO_LABEL)
    nxt, nxt2, hidden_at = _targets(train)
    reg_scale = float((train.hidden * train.hidden).sum(axis=1).mean())  # distances relative to |h|^2
    params = _Params(d, config.hidden, rng)
    adam = Adam([p.shape for p in params.as_list()], config.learning_rate, 0.0)
    per_epoch = max(1, -(-len(train) // config.batch_rows))
    steps, step = config.epochs * per_epoch, 0
    for _ in range(config.epochs):
        order = rng.permutation(len(train))
        for start in range(0, len(train), config.batch_rows):
            rows = order[start : start + config.batch_rows]
            p = params.as_list()
            loss1, s1, g1 = step_loss_and_grads(
                train.hidden[rows],
                embedding[train.tokens[rows]],
                local[rows, 0],
                hidden_at(nxt[rows]),
                *p,
                head_rows,
                config.regression_weight,
                reg_scale,
            )
            # The second step starts from the head's own s_1, where token t+2 exists. It
            # is fed the answer's token t+2, the one its label and h_{t+2} follow (the
            # target's greedy choice in a greedy answer, a sampled token in a sampled one).
            second = train.labels[rows, 0] != NO_LABEL
            loss2, g2 = 0.0, [np.zeros_like(x) for x in p]
            if second.any():
                r2 = rows[second]
                loss2, _, g2 = step_loss_and_grads(
                    s1[second],
                    embedding[train.tokens[nxt[r2]]],
                    local[r2, 1],
                    hidden_at(nxt2[r2]),
                    *p,
                    head_rows,
                    config.regression_weight,
                    reg_scale,
                )
            grads = [(a + b) / 2 for a, b in zip(g1, g2)]
            adam.step(p, grads, 0.5 * (1 + np.cos(np.pi * step / steps)))
            step += 1
            progress(step, steps, (loss1 + loss2) / 2)
    return params.w_in, params.b_in, params.w_out, vocab


def chain_ranks(
    held_out: Features, model: LlamaModel, head: RecurrentHead, depth: int, chunk_rows: int = 2048
) -> tuple[np.ndarray, np.ndarray]:
    """[rows, depth]: where the head ranks each label within its draft vocabulary (0 =
    its draft), drafting from h_t and token t+1 with each step fed the true previous
    token (a draft is only judged when the earlier ones were right, and then the true
    token is the drafted one). The products are the proposer's own (row-invariant
    kernels), so a rank of 0 is exactly a draft the proposer would make. A label
    outside the draft vocabulary ranks last (len(vocab)); NO_LABEL past the answer.
    Also [rows, depth]: the head's own probability for its guess, which the
    proposer's confidence gate reads."""
    head_rows = draft_output_head(model, head.vocab)
    labels = held_out.labels[:, :depth]
    n = len(head.vocab)
    ranks = np.full(labels.shape, NO_LABEL, np.int64)
    confidence = np.zeros(labels.shape)
    for start in range(0, len(held_out), chunk_rows):
        rows = slice(start, start + chunk_rows)
        state, token = held_out.hidden[rows], held_out.tokens[rows]
        for j in range(depth):
            state = head.step(state, embed(model.weights.token_embedding, token))
            logits = linear(state, head_rows)  # [r, n]
            confidence[rows, j] = draft_confidences(np.ascontiguousarray(logits))[1]  # the gate's figure
            label = labels[rows, j]
            where = np.minimum(np.searchsorted(head.vocab, np.maximum(label, 0)), n - 1)
            inside = (label != NO_LABEL) & (head.vocab[where] == label)
            value = logits[np.arange(len(label)), where][:, None]
            rank = (logits > value).sum(axis=1) + ((logits == value) & (np.arange(n) < where[:, None])).sum(axis=1)
            ranks[rows, j] = np.where(label == NO_LABEL, NO_LABEL, np.where(inside, rank, n))
            token = np.maximum(label, 0)
    return ranks, confidence


def chain_accuracy(ranks: np.ndarray, vocab_size: int) -> ChainAccuracy:
    """Per depth from chain_ranks: top-1 and top-5 where the earlier drafts were
    right, and the share of positions where every draft up to it is right."""
    result = ChainAccuracy()
    has = ranks != NO_LABEL
    result.vocab_coverage = float((ranks[has] < vocab_size).mean()) if has.any() else 0.0
    all_right = np.ones(len(ranks), bool)
    for j in range(ranks.shape[1]):
        judged = has[:, j] & all_right
        result.rows.append(int(judged.sum()))
        result.top1.append(float((ranks[judged, j] == 0).mean()) if judged.any() else 0.0)
        result.top5.append(float((ranks[judged, j] < 5).mean()) if judged.any() else 0.0)
        all_right &= has[:, j] & (ranks[:, j] == 0)
        result.chain.append(float(all_right[has[:, 0]].mean()) if has[:, 0].any() else 0.0)
    return result

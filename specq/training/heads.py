"""Training Medusa heads on collected features with Adam, in numpy.

Each head is h' = h + SiLU(h W + b) followed by the target's own output head, which
stays frozen (the heads share it, so a heads file holds only the small W and b).
The loss is cross-entropy over part of the vocabulary: the tokens the answers use,
plus the tokens the heads currently rank highest (mined before every epoch on a
sample of rows, full vocabulary). Without those, a token that never occurs as a
label is never pushed down and can win the proposer's argmax (measured on a toy
model: loss 1.3 on the labels' vocabulary, full-vocabulary top-1 still 0.32). The
full 49,152-way softmax would cost several times more per step. Accuracy is always
measured over the full vocabulary, as the proposer sees it. W and b start at zero,
where every head predicts what the target itself predicts next: a sensible start that
the gradient moves away from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from specq.training.configs import TrainConfig
from specq.training.features import NO_LABEL, Features


@dataclass
class HeadAccuracy:
    top1: list[float] = field(default_factory=list)  # per head, over rows with a label
    top5: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)


def _silu_and_grad(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = 1.0 / (1.0 + np.exp(-z))
    return z * s, s * (1.0 + z * (1.0 - s))


def head_hidden(h: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    z = h @ w + b
    return h + z / (1.0 + np.exp(-z))


class Adam:
    def __init__(self, shapes: list[tuple[int, ...]], lr: float, decay: float) -> None:
        self.m = [np.zeros(s, np.float32) for s in shapes]
        self.v = [np.zeros(s, np.float32) for s in shapes]
        self.lr, self.decay, self.t = lr, decay, 0

    def step(self, params: list[np.ndarray], grads: list[np.ndarray], lr_scale: float) -> None:
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p -= self.lr * lr_scale * ((m / c1) / (np.sqrt(v / c2) + eps) + self.decay * p)


def loss_and_grads(
    h: np.ndarray, target: np.ndarray, w: np.ndarray, b: np.ndarray, head_rows: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean cross-entropy of one head over rows h [r, d] with labels `target` (indices
    into head_rows [S, d]), and its gradients with respect to w and b."""
    z = h @ w + b
    act, act_grad = _silu_and_grad(z)
    logits = (h + act) @ head_rows.T  # [r, S]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    picked = np.arange(len(target))
    loss = float(-np.log(p[picked, target] + 1e-12).mean())
    p[picked, target] -= 1.0
    p /= len(target)
    dz = (p @ head_rows) * act_grad  # [r, d]
    return loss, h.T @ dz, dz.sum(axis=0)


def train_heads(
    train: Features,
    output_head: np.ndarray,
    config: TrainConfig,
    progress: Callable[[int, int, float], None] = lambda step, steps, loss: None,
) -> tuple[np.ndarray, np.ndarray]:
    """Heads' W [n_heads, d, d] (used as h @ W) and b [n_heads, d] trained on `train`;
    `output_head` is the target's float32 [vocab, d]."""
    n_heads, d = train.labels.shape[1], train.hidden.shape[1]
    w = np.zeros((n_heads, d, d), np.float32)
    b = np.zeros((n_heads, d), np.float32)
    adam = Adam([w.shape, b.shape], config.learning_rate, config.weight_decay)
    rng = np.random.default_rng(config.seed)
    vocab = np.unique(train.labels[train.labels != NO_LABEL])
    per_epoch = max(1, -(-len(train) // config.batch_rows))
    steps = config.epochs * per_epoch
    step = 0
    for _ in range(config.epochs):
        sample = rng.choice(len(train), size=min(config.mine_rows, len(train)), replace=False)
        vocab = np.union1d(vocab, top_tokens(train.hidden[np.sort(sample)], output_head, w, b, config.mine_top))
        head_rows = np.ascontiguousarray(output_head[vocab])  # [S, d]
        local = np.searchsorted(vocab, np.maximum(train.labels, 0))  # [rows, n_heads] index into vocab
        order = rng.permutation(len(train))
        for start in range(0, len(train), config.batch_rows):
            rows = order[start : start + config.batch_rows]
            h = train.hidden[rows]
            gw, gb, loss = np.zeros_like(w), np.zeros_like(b), 0.0
            for i in range(n_heads):
                has = train.labels[rows, i] != NO_LABEL
                if has.any():
                    head_loss, gw[i], gb[i] = loss_and_grads(h[has], local[rows, i][has], w[i], b[i], head_rows)
                    loss += head_loss / n_heads
            # Cosine decay: large steps early, settling at the end.
            adam.step([w, b], [gw, gb], 0.5 * (1 + np.cos(np.pi * step / steps)))
            step += 1
            progress(step, steps, loss)
    return w, b


def top_tokens(
    h: np.ndarray, output_head: np.ndarray, w: np.ndarray, b: np.ndarray, top: int, chunk_rows: int = 1024
) -> np.ndarray:
    """The distinct tokens among each head's `top` best for rows h, full vocabulary."""
    found = []
    for i in range(w.shape[0]):
        for start in range(0, len(h), chunk_rows):
            logits = head_hidden(h[start : start + chunk_rows], w[i], b[i]) @ output_head.T  # [r, V]
            found.append(np.unique(np.argpartition(-logits, top, axis=1)[:, :top]))
    return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)


def label_ranks(
    features: Features, output_head: np.ndarray, w: np.ndarray, b: np.ndarray, chunk_rows: int = 1024
) -> np.ndarray:
    """[rows, n_heads]: where each head ranks its label over the full vocabulary (0 =
    its argmax; ties to the lower id, as the proposer orders them), NO_LABEL where
    the row has no label for that head."""
    ranks = np.full(features.labels.shape, NO_LABEL, dtype=np.int64)
    ids = np.arange(output_head.shape[0])
    for i in range(w.shape[0]):
        has = np.flatnonzero(features.labels[:, i] != NO_LABEL)
        for start in range(0, len(has), chunk_rows):
            rows = has[start : start + chunk_rows]
            logits = head_hidden(features.hidden[rows], w[i], b[i]) @ output_head.T  # [r, V]
            label = features.labels[rows, i]
            value = logits[np.arange(len(rows)), label][:, None]
            ranks[rows, i] = (logits > value).sum(axis=1) + ((logits == value) & (ids < label[:, None])).sum(axis=1)
    return ranks


def accuracy(ranks: np.ndarray) -> HeadAccuracy:
    """Top-1 and top-5 per head, over the rows with a label."""
    result = HeadAccuracy()
    for i in range(ranks.shape[1]):
        has = ranks[:, i] != NO_LABEL
        n = int(has.sum())
        result.top1.append(float((ranks[has, i] == 0).mean()) if n else 0.0)
        result.top5.append(float((ranks[has, i] < 5).mean()) if n else 0.0)
        result.rows.append(n)
    return result

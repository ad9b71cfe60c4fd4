"""What the heads learn from: the target's final hidden state at every answer
position, and the answer's tokens 2, 3, ... positions later.

At position t the target itself predicts token t+1; head i (0-based) is asked for
token t+2+i, the one after the target's own next token and i more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from specq.specdec.model import LlamaModel, Segment
from specq.training.distill import Answer

NO_LABEL = -1  # the answer ended before this head's position


@dataclass
class Features:
    hidden: np.ndarray  # [rows, d] float32, final-normed: the input of the output head
    labels: np.ndarray  # [rows, n_heads] int64, NO_LABEL past the answer's end
    answer: np.ndarray  # [rows] index of the answer a row comes from

    def subset(self, mask: np.ndarray) -> "Features":
        return Features(self.hidden[mask], self.labels[mask], self.answer[mask])

    def __len__(self) -> int:
        return len(self.hidden)


def collect_features(
    model: LlamaModel,
    answers: Sequence[Answer],
    n_heads: int,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> Features:
    """One prefill per answer over prompt + answer (the prompt's rows are needed as
    attention context; only the answer's rows, from the prompt's last, are kept)."""
    hidden, labels, owner = [], [], []
    for index, ans in enumerate(answers):
        seq = np.asarray(ans.prompt_ids + ans.output_ids, dtype=np.int64)
        first = len(ans.prompt_ids) - 1  # predicts the answer's first token
        last = len(seq) - 3  # the last row with a label for head 0 (token last + 2)
        if last < first:
            progress(index + 1, len(answers))
            continue
        cache = model.new_cache(len(seq))
        (out,) = model.forward([Segment(cache, seq[: last + 1].tolist(), 0, all_logits=False)])
        rows = np.arange(first, last + 1)
        hidden.append(out.hidden[first:])
        wanted = rows[:, None] + 2 + np.arange(n_heads)[None, :]  # [rows, n_heads]
        labels.append(np.where(wanted < len(seq), seq[np.minimum(wanted, len(seq) - 1)], NO_LABEL))
        owner.append(np.full(len(rows), index))
        progress(index + 1, len(answers))
    d = model.config.d_model
    if not hidden:
        return Features(np.zeros((0, d), np.float32), np.zeros((0, n_heads), np.int64), np.zeros(0, np.int64))
    return Features(
        np.ascontiguousarray(np.concatenate(hidden), dtype=np.float32),
        np.concatenate(labels).astype(np.int64),
        np.concatenate(owner).astype(np.int64),
    )

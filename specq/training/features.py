"""What the heads learn from: the target's final hidden state at every answer
position, the token the target predicts from it, and the answer's tokens 2, 3, ...
positions later.

At position t the target itself predicts token t+1; head i (0-based) is asked for
token t+2+i, the one after the target's own next token and i more. Recurrent heads
also read token t+1 itself (`tokens`), and learn to predict the next row's hidden
state (the row after, within the same answer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specq.specdec.model import LlamaModel, Segment
from specq.training.distill import Answer

NO_LABEL = -1  # the answer ended before this head's position


@dataclass
class Features:
    hidden: np.ndarray  # [rows, d] float32, final-normed: the input of the output head
    labels: np.ndarray  # [rows, n_heads] int64, NO_LABEL past the answer's end
    answer: np.ndarray  # [rows] index of the answer a row comes from
    tokens: np.ndarray  # [rows] int64: token t+1, the target's own prediction from the row

    def subset(self, mask: np.ndarray) -> Features:
        return Features(self.hidden[mask], self.labels[mask], self.answer[mask], self.tokens[mask])

    def next_rows(self) -> np.ndarray:
        """[rows]: the index of the row one position later in the same answer, -1 at an
        answer's last row. Rows of an answer are consecutive positions."""
        following = np.arange(1, len(self) + 1)
        same = np.zeros(len(self), bool)
        same[:-1] = self.answer[1:] == self.answer[:-1]
        return np.where(same, following, -1)

    def __len__(self) -> int:
        return len(self.hidden)


def collect_features(
    model: LlamaModel,
    answers: Sequence[Answer],
    n_heads: int,
    progress: Callable[[int, int], None] = lambda done, total: None,
    per_forward: int = 8,
) -> Features:
    """Prefills over prompt + answer, `per_forward` answers sharing a forward (each
    weight is dequantized once per forward for long segments). The prompt's rows are
    needed as attention context; only the answer's rows, from the prompt's last, are
    kept."""
    hidden, labels, owner, tokens = [], [], [], []
    usable = [(i, a) for i, a in enumerate(answers) if len(a.output_ids) >= 2]
    for group_start in range(0, len(usable), per_forward):
        group = usable[group_start : group_start + per_forward]
        segments = []
        for _, ans in group:
            seq = ans.prompt_ids + ans.output_ids
            segments.append(Segment(model.new_cache(len(seq)), list(seq[:-2]), 0, all_logits=False))
        for (index, ans), out in zip(group, model.forward(segments)):
            seq = np.asarray(ans.prompt_ids + ans.output_ids, dtype=np.int64)
            first = len(ans.prompt_ids) - 1  # predicts the answer's first token
            rows = np.arange(first, len(seq) - 2)  # the last row with a label for head 0 predicts seq[-2]
            hidden.append(out.hidden[first:])
            wanted = rows[:, None] + 2 + np.arange(n_heads)[None, :]  # [rows, n_heads]
            labels.append(np.where(wanted < len(seq), seq[np.minimum(wanted, len(seq) - 1)], NO_LABEL))
            owner.append(np.full(len(rows), index))
            tokens.append(seq[rows + 1])
        progress(min(group_start + per_forward, len(usable)), len(usable))
    d = model.config.d_model
    if not hidden:
        none = np.zeros(0, np.int64)
        return Features(np.zeros((0, d), np.float32), np.zeros((0, n_heads), np.int64), none, none)
    return Features(
        np.ascontiguousarray(np.concatenate(hidden), dtype=np.float32),
        np.concatenate(labels).astype(np.int64),
        np.concatenate(owner).astype(np.int64),
        np.concatenate(tokens).astype(np.int64),
    )

"""What the heads learn from: the target's final hidden state at every answer
position, the token that follows it in the answer, and the tokens the target itself
predicts 2, 3, ... positions later.

At position t the target predicts token t+1; head i (0-based) is asked for the token
after t+1 and i more. Labels are the target's own greedy predictions (the argmax of
its logits at t+1+i, given the answer up to there), not the answer's tokens: a draft
is accepted when it is what the target would pick, so that is what a head must learn.
For a greedy answer the two are the same tokens; a sampled answer (a path through the
model's states that greedy decoding never takes from its prompt) is then as good a
teacher as a greedy one. Recurrent heads also read token t+1 itself (`tokens`), and
learn to predict the next row's hidden state (the row after, within the same answer).
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
    tokens: np.ndarray  # [rows] int64: token t+1, the answer's next token
    on_path: np.ndarray  # [rows] bool: token t+1 is the target's own greedy choice from the row

    def subset(self, mask: np.ndarray) -> Features:
        return Features(self.hidden[mask], self.labels[mask], self.answer[mask], self.tokens[mask], self.on_path[mask])

    def next_rows(self) -> np.ndarray:
        """[rows]: the index of the row one position later in the same answer, -1 at an
        answer's last row. Rows of an answer are consecutive positions."""
        following = np.arange(1, len(self) + 1)
        same = np.zeros(len(self), bool)
        same[:-1] = self.answer[1:] == self.answer[:-1]
        return np.where(same, following, -1)

    def greedy_paths(self) -> Features:
        """The same rows, with a label kept only where the answer's tokens from t+1 up
        to it are all the target's greedy choices: a head drafting from h_t alone, or
        a chain fed its own right drafts, is asked for the token after greedy ones."""
        labels = self.labels.copy()
        nxt = self.next_rows()
        ok, at = self.on_path.copy(), np.arange(len(self))
        for j in range(labels.shape[1]):
            labels[~ok, j] = NO_LABEL
            at = np.where(at >= 0, nxt[np.maximum(at, 0)], -1)
            ok &= (at >= 0) & self.on_path[np.maximum(at, 0)]
        return Features(self.hidden, labels, self.answer, self.tokens, self.on_path)

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
    kept, each with the target's logits through the output head's few-row kernels. At
    int16 and int8 a prompt's rows run through the decode kernels too, so a label is
    exactly the token greedy decoding picks there; at f32 long segments' products
    are BLAS's, whose roundings may turn a near tie the other way."""
    hidden, labels, owner, tokens, on_path = [], [], [], [], []
    usable = [(i, a) for i, a in enumerate(answers) if len(a.output_ids) >= 2]
    for group_start in range(0, len(usable), per_forward):
        group = usable[group_start : group_start + per_forward]
        segments = []
        for _, ans in group:
            seq = ans.prompt_ids + ans.output_ids
            segments.append(Segment(model.new_cache(len(seq)), list(seq[:-1]), 0, all_logits=False))
        for (index, ans), out in zip(group, model.forward(segments)):
            seq = np.asarray(ans.prompt_ids + ans.output_ids, dtype=np.int64)
            first = len(ans.prompt_ids) - 1  # predicts the answer's first token
            rows = np.arange(first, len(seq) - 1)  # every row whose next token is in the answer
            greedy = np.argmax(model.head_logits(out.hidden[first:]), axis=1)  # greedy[r - first]: token r + 1
            wanted = rows[:, None] + 1 + np.arange(n_heads)[None, :]  # [rows, n_heads]: the row predicting it
            has = wanted < len(seq) - 1
            labels.append(np.where(has, greedy[np.minimum(wanted, len(seq) - 2) - first], NO_LABEL))
            hidden.append(out.hidden[first:])
            owner.append(np.full(len(rows), index))
            tokens.append(seq[rows + 1])
            on_path.append(seq[rows + 1] == greedy)
        progress(min(group_start + per_forward, len(usable)), len(usable))
    d = model.config.d_model
    if not hidden:
        none = np.zeros(0, np.int64)
        return Features(np.zeros((0, d), np.float32), np.zeros((0, n_heads), np.int64), none, none, np.zeros(0, bool))
    return Features(
        np.ascontiguousarray(np.concatenate(hidden), dtype=np.float32),
        np.concatenate(labels).astype(np.int64),
        np.concatenate(owner).astype(np.int64),
        np.concatenate(tokens).astype(np.int64),
        np.concatenate(on_path),
    )

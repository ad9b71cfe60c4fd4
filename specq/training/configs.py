"""The training options of the heads, apart from the training itself: the command
line shows their defaults without importing the training code and the model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    batch_rows: int = 256
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    mine_rows: int = 8192  # rows sampled before each epoch to find the heads' top tokens
    mine_top: int = 10  # each sampled row adds its top tokens, per head, to the loss's vocabulary


@dataclass(frozen=True)
class RecurrentConfig:
    epochs: int = 8
    batch_rows: int = 256
    learning_rate: float = 1e-3
    hidden: int = 1024  # width of the head's inner layer
    vocab: int = 8192  # size of the draft vocabulary
    regression_weight: float = 1.0  # of the hidden-state distance, against cross-entropy
    seed: int = 0

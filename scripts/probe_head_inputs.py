#!/usr/bin/env python3
"""Would a draft head guess better if it saw more than the last hidden state?

The shipped recurrent head drafts token t+2 from the target's final-normed hidden
state h_t and token t+1 (docs/medusa.md). This script trains the head's first step
(the same residual MLP, the same loss, over a draft vocabulary of the training
labels' most frequent tokens) on the same answers with different inputs, and prints
each one's held-out top-1 (token t+2 right):

  last       h_t and the embedding of token t+1 (what the shipped head sees)
  taps       the same and the residual stream after the layers --taps (each row
             scaled to unit RMS): EAGLE-3's fused low, middle and high features
  previous   the same as last and h_{t-1}, h_{t-2} (zeros before the answer's
             start): the cheapest look further back than one state

Answers: a results file of greedy answers (`specq generate --input F --proposer
none --json`, `specq run`), the labels being the answers' own tokens. Every tenth
answer (the 10th, 20th, ...) is held out, as `specq train-heads` holds out prompts.
Training and scoring are in float32 numpy, not the proposer's Q8_0 products: the
inputs are compared, not a head to ship.

Usage:  python scripts/probe_head_inputs.py RESULTS.jsonl [--taps 7,15,22]
            [--inputs last,taps,previous] [--epochs 4] [--hidden 1024] [--vocab 8192]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from specq.errors import SpecqError
from specq.specdec.loader import default_model_path, load_model_and_tokenizer
from specq.specdec.matmul import dequantized, embed
from specq.specdec.model import LlamaModel
from specq.specdec.precision import PRECISIONS, resolve
from specq.specdec.proposers.recurrent import silu
from specq.training.distill import read_results
from specq.training.features import Features
from specq.training.heads import Adam
from specq.training.recurrent import draft_vocabulary, step_loss_and_grads
from specq.training.run import HELD_OUT_EVERY

INPUTS = ("last", "taps", "previous")


def collect(model: LlamaModel, answers, taps: list[int]) -> dict[str, np.ndarray]:
    """Per answer row t (from the prompt's last row to the answer's third last): h_t,
    the taps' residuals, token t+1, the label t+2 and the answer's index."""
    hidden, tapped, tokens, labels, owner = [], [], [], [], []
    for index, (_, prompt, output) in enumerate(answers):
        if len(output) < 2:
            continue
        seq = np.asarray(prompt + output, dtype=np.int64)
        final, residuals = model.residuals(seq[:-1], taps)
        rows = np.arange(len(prompt) - 1, len(seq) - 2)
        hidden.append(final[rows])
        scaled = [r[rows] / np.sqrt((r[rows] * r[rows]).mean(axis=1, keepdims=True) + 1e-6) for r in residuals.values()]
        tapped.append(np.concatenate(scaled, axis=1) if scaled else np.zeros((len(rows), 0), np.float32))
        tokens.append(seq[rows + 1])
        labels.append(seq[rows + 2])
        owner.append(np.full(len(rows), index))
    if not hidden:
        raise SystemExit("no answer has two tokens or more")
    return {
        name: np.concatenate(parts)
        for name, parts in (("h", hidden), ("taps", tapped), ("t", tokens), ("label", labels), ("answer", owner))
    }


def earlier(h: np.ndarray, answer: np.ndarray, back: int) -> np.ndarray:
    """h_{t-back} within the same answer, zeros before its first row."""
    out = np.zeros_like(h)
    same = answer[back:] == answer[:-back]
    out[back:][same] = h[:-back][same]
    return out


def extra_inputs(name: str, data: dict[str, np.ndarray]) -> np.ndarray:
    if name == "taps":
        return data["taps"]
    if name == "previous":
        return np.concatenate([earlier(data["h"], data["answer"], 1), earlier(data["h"], data["answer"], 2)], axis=1)
    return np.zeros((len(data["h"]), 0), np.float32)


def probe(name, data, embedded, head_rows, local, train, held, args) -> float:
    """Held-out top-1 of a first step trained with `name`'s inputs."""
    h = data["h"]
    # step_loss_and_grads concatenates (state, embedded): the extra inputs ride along
    # with the token's embedding, and the residual stays on h.
    side = np.ascontiguousarray(np.concatenate([embedded, extra_inputs(name, data)], axis=1), dtype=np.float32)
    rng = np.random.default_rng(0)
    width = h.shape[1] + side.shape[1]
    params = [
        (rng.standard_normal((width, args.hidden)) / np.sqrt(width)).astype(np.float32),
        np.zeros(args.hidden, np.float32),
        np.zeros((args.hidden, h.shape[1]), np.float32),
    ]
    adam = Adam([p.shape for p in params], 1e-3, 0.0)
    no_target = np.full((args.batch_rows, h.shape[1]), np.nan, np.float32)
    steps = args.epochs * max(1, len(train) // args.batch_rows)
    step = 0
    for epoch in range(args.epochs):
        order = rng.permutation(train)
        for start in range(0, len(order) - args.batch_rows + 1, args.batch_rows):
            rows = order[start : start + args.batch_rows]
            loss, _, grads = step_loss_and_grads(
                h[rows], side[rows], local[rows], no_target, *params, head_rows, 0.0, 1.0
            )
            adam.step(params, grads, 0.5 * (1 + np.cos(np.pi * step / steps)))
            step += 1
        print(f"  {name}: epoch {epoch + 1}, loss {loss:.3f}", file=sys.stderr, flush=True)
    w_in, b_in, w_out = params
    right = 0
    for start in range(0, len(held), 4096):
        rows = held[start : start + 4096]
        new = h[rows] + silu(np.concatenate([h[rows], side[rows]], axis=1) @ w_in + b_in) @ w_out
        right += int((np.argmax(new @ head_rows.T, axis=1) == local[rows]).sum())
    return right / max(len(held), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--model", default=None)
    parser.add_argument("--precision", default="auto", choices=("auto", *PRECISIONS))
    parser.add_argument("--taps", default="7,15,22", help="0-based blocks whose output the taps input reads")
    parser.add_argument("--inputs", default=",".join(INPUTS))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch-rows", type=int, default=256)
    args = parser.parse_args()
    if min(args.epochs, args.hidden, args.vocab, args.batch_rows) < 1:
        raise SystemExit("--epochs, --hidden, --vocab and --batch-rows must each be at least 1")
    names = [n for n in args.inputs.split(",") if n]
    try:
        taps = sorted({int(x) for x in args.taps.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--taps {args.taps!r}: not a list of block numbers") from None
    if unknown := [n for n in names if n not in INPUTS]:
        raise SystemExit(f"--inputs: {', '.join(unknown)} unknown; choose from {', '.join(INPUTS)}")
    try:
        answers = read_results(args.results)
        model, _ = load_model_and_tokenizer(args.model or default_model_path(), resolve(args.precision))
        if any(not 0 <= t < model.config.n_layers for t in taps):
            raise SystemExit(f"--taps: the model has blocks 0 to {model.config.n_layers - 1}")
        data = collect(model, answers, taps if "taps" in names else [])
    except SpecqError as exc:
        raise SystemExit(str(exc)) from None
    except OSError as exc:
        raise SystemExit(f"cannot read {exc.filename or args.model}: {exc.strerror or exc}") from None
    held_mask = data["answer"] % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
    labels = data["label"][:, None]
    rows_of = Features(data["h"], labels, data["answer"], data["t"], np.ones(len(labels), bool))
    vocab = draft_vocabulary(rows_of.subset(~held_mask), args.vocab)
    if not len(vocab):
        raise SystemExit("no training rows: every usable answer is a held-out one (the 10th, 20th, ...)")
    where = np.minimum(np.searchsorted(vocab, data["label"]), len(vocab) - 1)
    local = np.where(vocab[where] == data["label"], where, -1)
    train = np.flatnonzero(~held_mask & (local >= 0))
    held = np.flatnonzero(held_mask)
    if len(train) < args.batch_rows or not len(held):
        raise SystemExit(
            f"{len(train)} training and {len(held)} held-out rows: give more answers (every tenth is held out; "
            f"training takes at least --batch-rows {args.batch_rows})"
        )
    embedding = dequantized(model.weights.token_embedding)
    tied = model.weights.w_output is model.weights.token_embedding
    head_rows = np.ascontiguousarray((embedding if tied else dequantized(model.weights.w_output))[vocab])
    embedded = embed(model.weights.token_embedding, data["t"]).astype(np.float32)
    print(
        f"{len(answers)} answers: {len(train)} training rows, {len(held)} held out "
        f"({(local[held] >= 0).mean():.3f} of their labels inside the {len(vocab)}-token draft vocabulary); "
        f"taps after blocks {','.join(map(str, taps))}"
    )
    for name in names:
        top1 = probe(name, data, embedded, head_rows, local, train, held, args)
        print(f"{name:9} held-out top-1 {top1:.4f}")


if __name__ == "__main__":
    main()

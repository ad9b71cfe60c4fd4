"""The whole training run behind `specq train-heads`: answers, features, heads, file.

Each stage keeps its result in the work directory (answers.jsonl; features .npz
named by the answers' and model's digests), so a rerun after an interruption, or
with other training settings, redoes only what changed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from specq.errors import InputError
from specq.jobs.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.engine import Engine
from specq.specdec.gguf_file import file_sha256
from specq.specdec.products import dequantized
from specq.specdec.adaptive import ROW_COST
from specq.specdec.proposers import MedusaHeads, MedusaProposer, NoProposer
from specq.specdec.proposers.medusa import format_tree
from specq.specdec.sampling import SamplingParams
from specq.training.distill import distill
from specq.training.features import Features, collect_features
from specq.training.heads import HeadAccuracy, TrainConfig, accuracy, label_ranks, train_heads
from specq.training.tree_shape import TreeChoice, choose_tree

HELD_OUT_EVERY = 10  # every 10th answer (in file order) is held out for the accuracy figures


@dataclass(frozen=True)
class TrainingReport:
    answers: int
    train_rows: int
    held_out_rows: int
    held_out: HeadAccuracy
    config: TrainConfig
    tree: TreeChoice


def train_medusa(
    engine: Engine,
    prompts_path: str,
    out_path: str,
    work_dir: str,
    *,
    n_heads: int = 4,
    max_tokens: int | None = None,
    batch_size: int = 8,
    config: TrainConfig = TrainConfig(),
    say: Callable[[str], None] = lambda message: None,
) -> TrainingReport:
    os.makedirs(work_dir, exist_ok=True)
    specs = read_jsonl(prompts_path)
    defaults = GenerationDefaults(max_tokens=max_tokens or 256)
    requests = []
    for spec in specs:
        request = replace(to_request(spec, engine.tokenizer, defaults), sampling=SamplingParams())  # greedy
        if max_tokens:
            request = replace(request, max_tokens=min(request.max_tokens, max_tokens))
        requests.append((spec.custom_id, spec.category or "", request))

    answers_path = os.path.join(work_dir, "answers.jsonl")
    plain = Engine(engine.model, engine.tokenizer, NoProposer())  # greedy output is the same either way
    answers = distill(plain, requests, answers_path, batch_size=batch_size,
                      progress=_every(50, lambda d, t: say(f"answers: {d}/{t}")))
    say(f"answers: {len(answers)} ({sum(len(a.output_ids) for a in answers)} tokens) in {answers_path}")

    features = _features(engine, answers, answers_path, work_dir, n_heads, say)
    held = (features.answer % HELD_OUT_EVERY) == HELD_OUT_EVERY - 1
    train, held_out = features.subset(~held), features.subset(held)
    if not len(train) or not len(held_out):
        # Every 10th answer is held out for the accuracy figures and the tree: fewer
        # than 10 answers of 2+ tokens leave nothing to measure with.
        raise InputError(
            f"{prompts_path}: the answers give {len(train)} training and {len(held_out)} held-out positions; "
            f"train-heads needs at least {HELD_OUT_EVERY} prompts whose answers have 2 or more tokens"
        )
    say(f"features: {len(train)} training rows, {len(held_out)} held out")

    output_head = dequantized(engine.model.weights.w_output)
    w, b = train_heads(train, output_head, config,
                       progress=_every(200, lambda s, n, loss: say(f"step {s}/{n}: loss {loss:.3f}")))
    ranks = label_ranks(held_out, output_head, w, b)
    scores = accuracy(ranks)
    for i, (t1, t5) in enumerate(zip(scores.top1, scores.top5)):
        say(f"head {i}: held-out top-1 {t1:.3f}, top-5 {t5:.3f} ({scores.rows[i]} rows)")
    tree = choose_tree(ranks, ROW_COST, MedusaProposer.draft_cost)
    say(f"tree: {len(tree.paths)} nodes, {tree.tokens_per_round:.2f} tokens a round expected, "
        f"{tree.tokens_per_cost:.2f} per step-cost against {tree.chain_tokens_per_cost:.2f} for the best chain")

    metadata = {
        "training_prompts": os.path.basename(prompts_path),
        "training_prompts_sha256": file_sha256(prompts_path),
        "answers": str(len(answers)),
        "train_rows": str(len(train)),
        "held_out_rows": str(len(held_out)),
        "held_out_top1": ",".join(f"{x:.4f}" for x in scores.top1),
        "held_out_top5": ",".join(f"{x:.4f}" for x in scores.top5),
        "config": ",".join(f"{k}={v}" for k, v in asdict(config).items()),
        "tree_expected_tokens_per_round": f"{tree.tokens_per_round:.4f}",
        "tree_expected_tokens_per_cost": f"{tree.tokens_per_cost:.4f}",
        "chain_expected_tokens_per_cost": f"{tree.chain_tokens_per_cost:.4f}",
        "row_cost": str(ROW_COST),
    }
    if tree.paths:  # none: drafting did not pay on the held-out answers; a chain is used
        metadata["tree"] = format_tree(tree.paths)
    MedusaHeads(weights=w, biases=b, target_fingerprint=engine.model.fingerprint, metadata=metadata).save(out_path)
    return TrainingReport(len(answers), len(train), len(held_out), scores, config, tree)


def _features(engine, answers, answers_path, work_dir, n_heads, say) -> Features:
    digest = hashlib.sha256(f"{file_sha256(answers_path)} {engine.model.fingerprint} {n_heads}".encode()).hexdigest()
    path = os.path.join(work_dir, f"features-{digest[:16]}.npz")
    if os.path.exists(path):
        with np.load(path) as data:
            return Features(data["hidden"], data["labels"], data["answer"])
    features = collect_features(engine.model, answers, n_heads,
                                progress=_every(50, lambda d, t: say(f"features: {d}/{t} answers")))
    tmp = path + ".tmp.npz"
    np.savez(tmp, hidden=features.hidden, labels=features.labels, answer=features.answer)
    os.replace(tmp, path)  # a kill mid-write leaves no half file to be trusted later
    return features


def _every(n: int, report: Callable) -> Callable:
    """Pass on every n-th progress call, and the last."""
    def progress(done, total, *rest):
        if done % n == 0 or done == total:
            report(done, total, *rest)
    return progress

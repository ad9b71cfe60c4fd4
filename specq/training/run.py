"""The whole training run behind `specq train-heads`: answers, features, heads, file.

Each stage keeps its result in the work directory (answers.jsonl; features .npz
named by the answers' and model's digests), so a rerun after an interruption, or
with other training settings, redoes only what changed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np

from specq.errors import InputError
from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
from specq.specdec.adaptive import ROW_COST, ROW_COSTS
from specq.specdec.engine import Engine
from specq.specdec.gguf_file import file_sha256
from specq.specdec.matmul import dequantized
from specq.specdec.proposers import MedusaHeads, MedusaProposer, NoProposer
from specq.specdec.proposers.medusa import format_tree
from specq.specdec.proposers.recurrent import GateAtCost, RecurrentHead, RecurrentHeadProposer, format_gate_table
from specq.specdec.sampling import SamplingParams
from specq.training.distill import Answer, distill, read_results
from specq.training.features import Features, collect_features
from specq.training.gate import choose_gate, gate_table
from specq.training.heads import TrainConfig, accuracy, label_ranks, train_heads
from specq.training.recurrent import RecurrentConfig, chain_accuracy, chain_ranks, train_recurrent
from specq.training.tree_shape import choose_tree

FEATURES_FORMAT = 3  # 2: with each row's next token; 3: the target's greedy choices as labels
HEAD_KINDS = ("recurrent", "medusa")
HELD_OUT_EVERY = 10  # every 10th prompt's answers are held out for the accuracy figures


Say = Callable[[str], None]  # where progress lines go


@dataclass(frozen=True)
class TrainingReport:
    kind: str  # "recurrent" or "medusa"
    answers: int
    train_rows: int
    held_out_rows: int
    top1: list[float]  # per head (Medusa) or per drafted position (recurrent), held out
    top5: list[float]
    detail: dict  # kind-specific figures, as stored in the file's metadata


def train_heads_file(
    engine: Engine,
    prompts_path: str,
    out_path: str,
    work_dir: str,
    *,
    kind: str = "recurrent",
    n_heads: int = 4,
    max_tokens: int | None = None,
    batch_size: int = 8,
    config: TrainConfig | RecurrentConfig | None = None,
    results_path: str | None = None,
    say: Callable[[str], None] = lambda message: None,
) -> TrainingReport:
    """The whole run: answers, features, training, and the heads file at out_path.
    `n_heads`: Medusa heads, or the drafted positions a recurrent head is measured at.
    `results_path`: answers already decoded (a `specq run` results file over these
    prompts, greedy or sampled) instead of decoding greedy ones here."""
    if kind not in HEAD_KINDS:
        raise InputError(f"unknown kind of heads {kind!r} (choose from {', '.join(HEAD_KINDS)})")
    os.makedirs(work_dir, exist_ok=True)
    specs = read_jsonl(prompts_path)
    defaults = GenerationDefaults(max_tokens=max_tokens or 256)
    requests = []
    for spec in specs:
        request = replace(to_request(spec, engine.tokenizer, defaults), sampling=SamplingParams())  # greedy
        if max_tokens:
            request = replace(request, max_tokens=min(request.max_tokens, max_tokens))
        requests.append((spec.custom_id, spec.category or "", request))

    prompt_index = {tuple(request.prompt_ids): i for i, (_, _, request) in enumerate(requests)}
    if results_path:
        answers = _answers_from_results(results_path, prompt_index, max_tokens)
        source = results_path
    else:
        source = os.path.join(work_dir, "answers.jsonl")
        plain = Engine(engine.model, engine.tokenizer, NoProposer())  # greedy output is the same either way
        answers = distill(
            plain, requests, source, batch_size=batch_size, progress=_every(50, lambda d, t: say(f"answers: {d}/{t}"))
        )
    say(f"answers: {len(answers)} ({sum(len(a.output_ids) for a in answers)} tokens) from {source}")

    # A recurrent head trains two steps, so it needs the labels of two positions.
    features = _features(engine, answers, work_dir, max(n_heads, 2 if kind == "recurrent" else 1), say)
    # Held out by prompt, so that no answer to a held-out prompt (a sampled one
    # shares its opening with the greedy one) is trained on.
    last = HELD_OUT_EVERY - 1
    held_answers = [i for i, a in enumerate(answers) if prompt_index[a.prompt_ids] % HELD_OUT_EVERY == last]
    held = np.isin(features.answer, held_answers)
    # Judged where drafting happens: after the target's own greedy tokens.
    train, held_out = features.subset(~held), features.subset(held).greedy_paths()
    if kind == "medusa":  # a Medusa head reads h_t alone: the tokens between are greedy ones
        train = train.greedy_paths()
    if not len(train) or not len(held_out):
        # Every 10th answer is held out for the accuracy figures and the tree: fewer
        # than 10 answers of 2+ tokens leave nothing to measure with.
        raise InputError(
            f"{prompts_path}: the answers give {len(train)} training and {len(held_out)} held-out positions; "
            f"train-heads needs at least {HELD_OUT_EVERY} prompts whose answers have 2 or more tokens"
        )
    say(f"features: {len(train)} training rows, {len(held_out)} held out")
    metadata = {
        "training_prompts": os.path.basename(prompts_path),
        "training_prompts_sha256": file_sha256(prompts_path),
        "answers": str(len(answers)),
        "answers_from": os.path.basename(source),
        "answer_tokens": str(sum(len(a.output_ids) for a in answers)),
        "answers_on_greedy_paths": f"{float(features.on_path.mean()) if len(features) else 0.0:.4f}",
        "train_rows": str(len(train)),
        "held_out_rows": str(len(held_out)),
    }
    train_kind = _train_recurrent if kind == "recurrent" else _train_medusa
    top1, top5, detail = train_kind(
        engine,
        train,
        held_out,
        out_path,
        metadata,
        n_heads,
        config or (RecurrentConfig() if kind == "recurrent" else TrainConfig()),
        say,
    )
    return TrainingReport(kind, len(answers), len(train), len(held_out), top1, top5, detail)


def _train_medusa(
    engine: Engine,
    train: Features,
    held_out: Features,
    out_path: str,
    metadata: dict[str, str],
    n_heads: int,
    config: TrainConfig,
    say: Say,
) -> tuple[list[float], list[float], dict]:
    output_head = dequantized(engine.model.weights.w_output)
    w, b = train_heads(
        train, output_head, config, progress=_every(200, lambda s, n, loss: say(f"step {s}/{n}: loss {loss:.3f}"))
    )
    ranks = label_ranks(held_out, output_head, w, b)
    scores = accuracy(ranks)
    for i, (t1, t5) in enumerate(zip(scores.top1, scores.top5)):
        say(f"head {i}: held-out top-1 {t1:.3f}, top-5 {t5:.3f} ({scores.rows[i]} rows)")
    tree = choose_tree(ranks, ROW_COST, MedusaProposer.draft_cost)
    say(
        f"tree: {len(tree.paths)} nodes, {tree.tokens_per_round:.2f} tokens a round expected, "
        f"{tree.tokens_per_cost:.2f} per step-cost against {tree.chain_tokens_per_cost:.2f} for the best chain"
    )
    metadata = {
        **metadata,
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
    return scores.top1, scores.top5, metadata


def _train_recurrent(
    engine: Engine,
    train: Features,
    held_out: Features,
    out_path: str,
    metadata: dict[str, str],
    depth: int,
    config: RecurrentConfig,
    say: Say,
) -> tuple[list[float], list[float], dict]:
    embedding = dequantized(engine.model.weights.token_embedding)
    tied = engine.model.weights.w_output is engine.model.weights.token_embedding
    output_head = embedding if tied else dequantized(engine.model.weights.w_output)
    w_in, b_in, w_out, vocab = train_recurrent(
        train,
        embedding,
        output_head,
        config,
        progress=_every(200, lambda s, n, loss: say(f"step {s}/{n}: loss {loss:.3f}")),
    )
    head = RecurrentHead.from_float(w_in, b_in, w_out, vocab, engine.model.fingerprint)
    ranks, confidence = chain_ranks(held_out, engine.model, head, depth)
    scores = chain_accuracy(ranks, len(vocab))
    say(f"draft vocabulary: {len(vocab)} tokens, {scores.vocab_coverage:.3f} of held-out labels inside")
    for j, (t1, t5, c) in enumerate(zip(scores.top1, scores.top5, scores.chain)):
        say(
            f"draft {j + 1}: held-out top-1 {t1:.3f}, top-5 {t5:.3f} given the earlier right; "
            f"all {j + 1} right {c:.3f} ({scores.rows[j]} rows)"
        )
    # A gate per precision: a verification row costs each its own share of a step,
    # so a draft pays at a lower confidence where rows are cheap. "gate" is f32's.
    gates = {}
    for precision, row_cost in ROW_COSTS.items():
        gates[precision] = choose_gate(confidence, ranks == 0, row_cost, RecurrentHeadProposer.draft_cost)
    gate = gates[engine.model.precision]
    # ... and a gate for each cost a row may have relative to a request's share of a
    # batched round, which the engine measures as it runs.
    table = [GateAtCost(cost, c.gate, c.tokens_per_cost) for cost, c in gate_table(confidence, ranks == 0)]
    say(
        "gates by row cost: "
        + ", ".join(f"{e.row_cost:g}: {e.gate[0]:.2f}/{e.gate[1]:.2f} ({e.tokens_per_cost:.3f})" for e in table)
    )
    say(
        f"gate at {engine.model.precision}: confidence {gate.gate[0]:.2f} for the first draft, {gate.gate[1]:.2f} "
        f"after; {gate.tokens_per_round:.2f} tokens a round expected, {gate.tokens_per_cost:.3f} per step-cost "
        f"against {gate.ungated_tokens_per_cost:.3f} without the gate"
    )
    metadata = {
        **metadata,
        **{
            ("gate" if precision == "f32" else f"gate_{precision}"): ",".join(f"{g:.2f}" for g in choice.gate)
            for precision, choice in gates.items()
        },
        "gate_precision": engine.model.precision,
        "gate_by_row_cost": format_gate_table(table),
        "gate_expected_tokens_per_round": f"{gate.tokens_per_round:.4f}",
        "gate_expected_tokens_per_cost": f"{gate.tokens_per_cost:.4f}",
        "ungated_expected_tokens_per_cost": f"{gate.ungated_tokens_per_cost:.4f}",
        "row_cost": str(ROW_COSTS[engine.model.precision]),
        "held_out_top1": ",".join(f"{x:.4f}" for x in scores.top1),
        "held_out_top5": ",".join(f"{x:.4f}" for x in scores.top5),
        "held_out_chain": ",".join(f"{x:.4f}" for x in scores.chain),
        "vocab_coverage": f"{scores.vocab_coverage:.4f}",
        "config": ",".join(f"{k}={v}" for k, v in asdict(config).items()),
    }
    replace(head, metadata=metadata).save(out_path)
    return scores.top1, scores.top5, metadata


def _answers_from_results(path: str, prompt_index: dict[tuple[int, ...], int], max_tokens: int | None) -> list[Answer]:
    """The answers in a results file, ordered by prompt (then custom_id), so that a
    file written in whatever order the workers finished gives the same features."""
    answers = []
    for custom_id, prompt_ids, output_ids in read_results(path):
        if prompt_ids not in prompt_index:
            raise InputError(
                f"{path}: request {custom_id!r} answers a prompt that is not in the prompts file "
                "(the results must come from a batch over the same prompts, with the same template)"
            )
        answers.append(Answer(custom_id, "", prompt_ids, output_ids[:max_tokens] if max_tokens else output_ids))
    answers.sort(key=lambda a: (prompt_index[a.prompt_ids], a.custom_id))
    return answers


def _features(engine: Engine, answers: list[Answer], work_dir: str, n_heads: int, say: Say) -> Features:
    # The format tag changes whenever the stored arrays do, so older caches are not read.
    content = hashlib.sha256()
    for a in answers:
        content.update(np.asarray([len(a.prompt_ids), *a.prompt_ids, len(a.output_ids), *a.output_ids], np.int64))
    digest = hashlib.sha256(
        f"{FEATURES_FORMAT} {content.hexdigest()} {engine.model.fingerprint} {n_heads}".encode()
    ).hexdigest()
    path = os.path.join(work_dir, f"features-{digest[:16]}.npz")
    if os.path.exists(path):
        with np.load(path) as data:
            return Features(data["hidden"], data["labels"], data["answer"], data["tokens"], data["on_path"])
    features = collect_features(
        engine.model, answers, n_heads, progress=_every(50, lambda d, t: say(f"features: {d}/{t} answers"))
    )
    tmp = path + ".tmp.npz"
    np.savez(
        tmp,
        hidden=features.hidden,
        labels=features.labels,
        answer=features.answer,
        tokens=features.tokens,
        on_path=features.on_path,
    )
    os.replace(tmp, path)  # a kill mid-write leaves no half file to be trusted later
    return features


def _every(n: int, report: Callable) -> Callable:
    """Pass on every n-th progress call, and the last."""

    def progress(done: int, total: int, *rest: float) -> None:
        if done % n == 0 or done == total:
            report(done, total, *rest)

    return progress

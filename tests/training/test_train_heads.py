"""Training heads (Medusa and recurrent): the gradients are right, training learns, and the
one-command run is reproducible, resumable and refuses bad input in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from specq.cli import main
from specq.specdec.engine import Engine
from specq.specdec.loader import load_engine, load_model_and_tokenizer
from specq.specdec.matmul import dequantized
from specq.specdec.proposers import MedusaHeads, RecurrentHead, RecurrentHeadProposer
from specq.specdec.proposers.base import ProposeContext
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import GenerationRequest
from specq.training.distill import read_answers
from specq.training.features import NO_LABEL, collect_features
from specq.training.heads import TrainConfig, accuracy, label_ranks, loss_and_grads, train_heads
from specq.training.recurrent import RecurrentConfig, chain_accuracy, chain_ranks, step_loss_and_grads, train_recurrent


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    r, d, s = 6, 5, 7
    h = rng.normal(size=(r, d))
    rows = rng.normal(size=(s, d))
    target = rng.integers(0, s, size=r)
    w, b = rng.normal(size=(d, d)) * 0.3, rng.normal(size=d) * 0.3
    _, gw, gb = loss_and_grads(h, target, w, b, rows)
    eps = 1e-6
    for i, j in [(0, 0), (2, 3), (4, 1)]:
        wp, wm = w.copy(), w.copy()
        wp[i, j] += eps
        wm[i, j] -= eps
        numeric = (loss_and_grads(h, target, wp, b, rows)[0] - loss_and_grads(h, target, wm, b, rows)[0]) / (2 * eps)
        assert abs(numeric - gw[i, j]) < 1e-6 * max(1.0, abs(numeric)), (i, j, numeric, gw[i, j])
    bp, bm = b.copy(), b.copy()
    bp[2] += eps
    bm[2] -= eps
    numeric = (loss_and_grads(h, target, w, bp, rows)[0] - loss_and_grads(h, target, w, bm, rows)[0]) / (2 * eps)
    assert abs(numeric - gb[2]) < 1e-6 * max(1.0, abs(numeric))


def _prompts(path, n=40, max_tokens=30):
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(
                json.dumps(
                    {"custom_id": f"t{i}", "prompt": f"tell me about item {i} " * (i % 3 + 1), "max_tokens": max_tokens}
                )
                + "\n"
            )
    return str(path)


def test_features_line_up_hidden_states_with_later_tokens(toy_model_path, tmp_path):
    engine = load_engine(model_path=toy_model_path, proposer="none")
    from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
    from specq.training.distill import distill

    specs = read_jsonl(_prompts(tmp_path / "p.jsonl", n=3, max_tokens=12))
    reqs = [(s.custom_id, "", to_request(s, engine.tokenizer, GenerationDefaults())) for s in specs]
    answers = distill(engine, reqs, str(tmp_path / "a.jsonl"))
    feats = collect_features(engine.model, answers, n_heads=3)
    index = max(range(len(answers)), key=lambda i: len(answers[i].output_ids))
    first = answers[index]
    assert len(first.output_ids) >= 5
    seq = first.prompt_ids + first.output_ids
    rows = feats.answer == index
    assert rows.sum() == len(first.output_ids)  # from the prompt's last row to the second-last token
    # Row 0 stands at the prompt's last token: the target predicts output 0, head i output 1 + i.
    assert list(feats.labels[rows][0]) == [seq[len(first.prompt_ids) + 1 + i] for i in range(3)]
    assert feats.labels[rows][-2].tolist() == [seq[-1], NO_LABEL, NO_LABEL]
    assert feats.labels[rows][-1].tolist() == [NO_LABEL] * 3  # only the hidden state the row before regresses to
    assert feats.on_path[rows].all() and feats.tokens[rows].tolist() == list(first.output_ids)
    # And the hidden state is the one the target predicts output 0 from.
    logits = feats.hidden[rows][0] @ dequantized(engine.model.weights.w_output).T
    assert int(np.argmax(logits)) == first.output_ids[0]


def _toy_features(toy_model_path, tmp_path, n_heads):
    """The toy model's answers to 40 prompts, and their features."""
    engine = load_engine(model_path=toy_model_path, proposer="none")
    from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
    from specq.training.distill import distill

    specs = read_jsonl(_prompts(tmp_path / "p.jsonl"))
    reqs = [(s.custom_id, "", to_request(s, engine.tokenizer, GenerationDefaults())) for s in specs]
    return engine, collect_features(engine.model, distill(engine, reqs, str(tmp_path / "a.jsonl")), n_heads=n_heads)


@pytest.mark.slow
def test_training_learns_what_it_was_shown(toy_model_path, tmp_path):
    engine, feats = _toy_features(toy_model_path, tmp_path, n_heads=2)
    head = dequantized(engine.model.weights.w_output)
    zero = accuracy(
        label_ranks(
            feats,
            head,
            np.zeros((2, feats.hidden.shape[1], feats.hidden.shape[1]), np.float32),
            np.zeros((2, feats.hidden.shape[1]), np.float32),
        )
    )
    w, b = train_heads(feats, head, TrainConfig(epochs=30, learning_rate=3e-3, batch_rows=64))
    ranks = label_ranks(feats, head, w, b)
    trained = accuracy(ranks)
    # The ranks agree with the order the proposer drafts in.
    from specq.specdec.proposers.medusa import top_ranked
    from specq.training.heads import head_hidden

    rows = np.flatnonzero(feats.labels[:, 0] != NO_LABEL)[:50]
    top = top_ranked(head_hidden(feats.hidden[rows], w[0], b[0]) @ head.T, 3)
    for row, ranked in zip(rows, top):
        r = ranks[row, 0]
        assert (r < 3) == (feats.labels[row, 0] in ranked) and (r >= 3 or ranked[r] == feats.labels[row, 0])
    for i in range(2):
        assert trained.top1[i] > zero.top1[i] + 0.2, (trained.top1, zero.top1)
        assert trained.top5[i] >= trained.top1[i]


def test_recurrent_step_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    r, d, hidden, s = 7, 5, 6, 9
    state, embedded = rng.normal(size=(r, d)), rng.normal(size=(r, d))
    label = rng.integers(-1, s, size=r)  # some rows without a label
    next_hidden = rng.normal(size=(r, d))
    next_hidden[2] = np.nan  # and one without a next hidden state
    params = [rng.normal(size=(2 * d, hidden)) * 0.3, rng.normal(size=hidden) * 0.3, rng.normal(size=(hidden, d)) * 0.3]
    rows = rng.normal(size=(s, d))

    def loss(p):
        return step_loss_and_grads(state, embedded, label, next_hidden, *p, rows, 0.7, 3.0)

    _, _, grads = loss(params)
    eps = 1e-6
    for k, p in enumerate(params):
        for index in [(0,) * p.ndim, tuple(n - 1 for n in p.shape), tuple(n // 2 for n in p.shape)]:
            up, down = [x.copy() for x in params], [x.copy() for x in params]
            up[k][index] += eps
            down[k][index] -= eps
            numeric = (loss(up)[0] - loss(down)[0]) / (2 * eps)
            assert abs(numeric - grads[k][index]) < 1e-6 * max(1.0, abs(numeric)), (k, index, numeric)


@pytest.mark.slow
def test_recurrent_training_learns_and_its_ranks_are_the_proposers_drafts(toy_model_path, tmp_path):
    engine, feats = _toy_features(toy_model_path, tmp_path, n_heads=3)
    emb = dequantized(engine.model.weights.token_embedding)
    out = dequantized(engine.model.weights.w_output)
    cfg = RecurrentConfig(epochs=40, learning_rate=3e-3, batch_rows=64, hidden=32, vocab=40)
    w_in, b_in, w_out, vocab = train_recurrent(feats, emb, out, cfg)
    assert len(vocab) == 40 and np.all(np.diff(vocab) > 0)
    head = RecurrentHead.from_float(w_in, b_in, w_out, vocab, engine.model.fingerprint)
    untrained = RecurrentHead.from_float(w_in, b_in, np.zeros_like(w_out), vocab, engine.model.fingerprint)
    ranks, confidence = chain_ranks(feats, engine.model, head, 3)
    assert np.all((confidence > 0) & (confidence <= 1))
    trained = chain_accuracy(ranks, len(vocab))
    before = chain_accuracy(chain_ranks(feats, engine.model, untrained, 3)[0], len(vocab))
    assert trained.top1[0] > before.top1[0] + 0.3, (trained.top1, before.top1)
    # Deeper drafts count only after right earlier ones: compare whole chains.
    assert trained.chain[1] > before.chain[1] + 0.2, (trained.chain, before.chain)
    assert trained.chain[0] >= trained.chain[1] >= trained.chain[2]
    assert all(t5 >= t1 for t1, t5 in zip(trained.top1, trained.top5))
    # A rank of 0 is exactly a first draft of the proposer's that verification accepts.
    proposer = RecurrentHeadProposer(engine.model, head)
    rows = np.flatnonzero(feats.labels[:, 0] != NO_LABEL)[:60]
    agree = 0
    for row in rows:
        ctx = ProposeContext(
            tokens=[int(feats.tokens[row])],
            n_output=1,
            last_hidden=feats.hidden[row],
            params=SamplingParams(),
            stochastic=False,
            want_p_draft=False,
        )
        drafted = proposer.propose(ctx, 1).tokens[0]
        agree += (drafted == feats.labels[row, 0]) == (ranks[row, 0] == 0)
    assert agree == len(rows)  # the same products, so the same bits


@pytest.mark.slow
def test_the_command_is_reproducible_resumes_and_writes_loadable_heads(toy_model_path, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl")
    work = tmp_path / "work"
    args = [
        "train-heads",
        prompts,
        "--model",
        toy_model_path,
        "--kind",
        "medusa",
        "--heads",
        "3",
        "--epochs",
        "2",
        "--work-dir",
        str(work),
    ]
    first = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "a.gguf")])
    assert first.exit_code == 0, first.output
    assert "held-out top-1" in first.output
    answers = (work / "answers.jsonl").read_text().splitlines()
    # A kill mid-write: keep 10 answers and a torn eleventh line, drop the features.
    (work / "answers.jsonl").write_text("\n".join(answers[:10]) + "\n" + answers[10][:25])
    for f in work.glob("features-*.npz"):
        f.unlink()
    second = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "b.gguf")])
    assert second.exit_code == 0, second.output
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert len(read_answers(str(work / "answers.jsonl"))) == 40
    model, _ = load_model_and_tokenizer(toy_model_path)
    heads = MedusaHeads.load(str(tmp_path / "a.gguf"))
    heads.check_target(model)
    assert heads.n_heads == 3 and heads.metadata["answers"] == "40"
    assert len(heads.metadata["held_out_top1"].split(",")) == 3
    assert float(heads.metadata["tree_expected_tokens_per_round"]) >= 1.0
    assert os.path.getsize(tmp_path / "a.gguf") < 10e6


def test_the_command_trains_a_recurrent_head_by_default(toy_model_path, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl")
    args = ["train-heads", prompts, "--model", toy_model_path, "--epochs", "3", "--work-dir", str(tmp_path / "w")]
    first = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "a.gguf")])
    assert first.exit_code == 0, first.output
    assert "a recurrent head, held-out top-1" in first.output and "draft vocabulary" in first.output
    second = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "b.gguf")])
    assert second.exit_code == 0, second.output
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    model, _ = load_model_and_tokenizer(toy_model_path)
    head = RecurrentHead.load(str(tmp_path / "a.gguf"))
    head.check_target(model)
    assert head.metadata["answers"] == "40" and len(head.metadata["held_out_chain"].split(",")) == 4
    # A gate for each precision (each its own row cost), read back as the proposer does.
    from specq.specdec.proposers.recurrent import parse_gate

    for key in ("gate", "gate_int16", "gate_int8"):
        assert len(parse_gate(head.metadata[key])) == 2
    # ... and one for each row cost a batched round may measure.
    from specq.specdec.proposers.recurrent import parse_gate_table
    from specq.training.gate import ROW_COST_GRID

    table = parse_gate_table(head.metadata["gate_by_row_cost"])
    assert tuple(e.row_cost for e in table) == ROW_COST_GRID
    # Trained at the precision the command line resolves `auto` to, as every command does.
    from specq.specdec.precision import AUTO, resolve

    auto = load_engine(model_path=toy_model_path, precision=resolve(AUTO)).model.precision
    assert head.metadata["gate_precision"] == auto
    engine = load_engine(model_path=toy_model_path, proposer="auto", medusa_heads_path=str(tmp_path / "a.gguf"))
    assert isinstance(engine.proposer.medusa, RecurrentHeadProposer)


def test_bad_input_is_one_line(toy_model_path, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"promt": "b"}\n')
    for args, what in [
        ([str(bad), "-o", str(tmp_path / "h.gguf")], "line 2"),
        ([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "h.gguf")], "missing.jsonl"),
        ([_prompts(tmp_path / "few.jsonl", n=4), "-o", str(tmp_path / "h.gguf")], "at least 10 prompts"),
        ([_prompts(tmp_path / "p.jsonl"), "-o", str(tmp_path / "no" / "h.gguf")], "no directory"),
    ]:
        result = CliRunner().invoke(
            main, ["train-heads", *args, "--model", toy_model_path, "--work-dir", str(tmp_path / "w")]
        )
        assert result.exit_code == 1 and "Traceback" not in result.output
        lines = [line for line in result.output.strip().splitlines() if not line.startswith("[")]  # not progress
        assert len(lines) == 1 and lines[0].startswith("Error: ") and what in lines[0], result.output


def test_the_tree_is_the_most_frequent_paths_at_the_size_that_pays_best():
    from specq.training.tree_shape import choose_tree, path_frequencies

    # 10 positions: the true path's ranks per head.
    ranks = np.array([[0, 0, 0]] * 5 + [[0, 1, NO_LABEL]] * 2 + [[1, 0, 0]] * 2 + [[3, 0, 0]])
    counts = path_frequencies(ranks, max_rank=8)
    assert counts[(0,)] == 7 and counts[(0, 0)] == 5 and counts[(0, 1)] == 2 and counts[(1,)] == 2
    free = choose_tree(ranks, row_cost=0.0, head_cost=0.0)  # rows cost nothing: every seen path
    assert set(free.paths) == set(counts) and free.tokens_per_round == 1 + sum(counts.values()) / 10
    costly = choose_tree(ranks, row_cost=0.3, head_cost=0.0)
    assert costly.paths == [(0,), (0, 0), (0, 0, 0)]  # (0,1) at 0.2 is not worth 0.3 of a step
    assert costly.tokens_per_cost == costly.chain_tokens_per_cost == (1 + 1.7) / 1.9
    assert choose_tree(ranks, row_cost=2.0, head_cost=0.0).paths == []  # drafting never pays


def test_the_gate_drafts_only_guesses_that_pay():
    from specq.training.gate import choose_gate, rate

    # 100 positions: 40 confident and right at both depths, 60 unsure and wrong.
    confidence = np.array([[0.9, 0.8]] * 40 + [[0.3, 0.2]] * 60)
    right = np.array([[True, True]] * 40 + [[False, False]] * 60)
    # Every draft, always: 1 + 0.4 * 2 tokens; cost 1 + 2 * (0.05 + 0.4).
    assert rate(confidence, right, (0.0, 0.0), 0.4, 0.05, 2) == pytest.approx((1.8, 1.8 / 1.9))
    # Gated at 0.5: only the 40 draft, both tokens; all 100 pay the first step.
    tokens, per_cost = rate(confidence, right, (0.5, 0.5), 0.4, 0.05, 2)
    assert tokens == pytest.approx(1.8)
    assert per_cost == pytest.approx(180 / (100 * 1.05 + 40 * (0.4 + 0.05 + 0.4)))
    choice = choose_gate(confidence, right, 0.4, 0.05)
    assert 0.3 <= choice.gate[0] < 0.9 and choice.gate[1] < 0.8
    assert choice.tokens_per_cost == pytest.approx(per_cost) and choice.ungated_tokens_per_cost < per_cost


def test_the_gate_table_tightens_with_the_row_cost_and_says_where_drafting_loses():
    from specq.training.gate import gate_table

    # Confidence tells right from wrong only roughly: right 90% at 0.9, 60% at 0.6, 20% at 0.3.
    confidence = np.repeat([[0.9, 0.9], [0.6, 0.6], [0.3, 0.3]], 10, axis=0)
    right = np.array([[i < n] * 2 for n in (9, 6, 2) for i in range(10)])
    table = gate_table(confidence, right)
    firsts = [choice.gate[0] for _, choice in table]
    assert firsts == sorted(firsts) and firsts[0] < firsts[-1], firsts
    rates = [choice.tokens_per_cost for _, choice in table]
    assert rates[0] > 1.0 > rates[-1]  # cheap rows pay, rows dearer than the plain round do not


@pytest.mark.slow  # trains a head end to end
def test_a_head_trained_for_a_qwen3_file_drafts_exactly(toy_model_file, tmp_path):
    """train-heads on another supported architecture (qwen3: q/k norms, wide heads,
    RoPE over halves): the head loads against that model, and speculation with it
    gives plain decoding's greedy tokens."""
    path = toy_model_file(seed=21, architecture="qwen3", head_dim=32)
    prompts = _prompts(tmp_path / "p.jsonl")
    args = ["train-heads", prompts, "--model", path, "--epochs", "2", "--work-dir", str(tmp_path / "w")]
    done = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "q.gguf")])
    assert done.exit_code == 0, done.output
    model, tokenizer = load_model_and_tokenizer(path)
    head = RecurrentHead.load(str(tmp_path / "q.gguf"))
    head.check_target(model)
    # Ungated: on so little data the trained gate may let no draft through.
    speculative = Engine(model, tokenizer, RecurrentHeadProposer(model, head, gate=(0.0,)))
    plain = load_engine(model_path=path, proposer="none")
    for prompt in ("count with me", "a b c d"):
        ids = tokenizer.encode_chat([{"role": "user", "content": prompt}])
        req = GenerationRequest(prompt_ids=tuple(ids), max_tokens=40, k=4, adaptive=False)
        fast, slow = speculative.run(req), plain.run(req)
        assert fast.output_ids == slow.output_ids
        assert fast.metrics.drafted > 0


def _greedy_next(model, ids):
    """The token greedy decoding picks after `ids`: one prefill, its last row."""
    from specq.specdec.model import Segment

    out = model.forward([Segment(model.new_cache(len(ids)), list(ids), 0, all_logits=False)])[0]
    return int(np.argmax(out.logits[-1]))


def test_a_sampled_answer_is_labelled_with_the_targets_greedy_choices(toy_model_path):
    from specq.training.distill import Answer

    engine = load_engine(model_path=toy_model_path, proposer="none")
    request = GenerationRequest(
        prompt_ids=tuple(engine.tokenizer.encode("tell me about item 7")),
        max_tokens=24,
        sampling=SamplingParams(temperature=1.5, seed=3),
    )
    state = next(s for _, s in engine.generate_many([engine.start(request)], group_size=1) if s.finished)
    answer = Answer("s", "", tuple(request.prompt_ids), tuple(state.output_ids))
    feats = collect_features(engine.model, [answer], n_heads=2)
    seq = list(answer.prompt_ids + answer.output_ids)
    first = len(answer.prompt_ids) - 1
    greedy = [_greedy_next(engine.model, seq[: r + 1]) for r in range(first, len(seq) - 1)]
    # Row t: token t+1 is the answer's; its labels are what the target picks after t+1 and t+2.
    assert feats.tokens.tolist() == seq[first + 1 :]
    assert feats.on_path.tolist() == [seq[r + 1] == greedy[r - first] for r in range(first, len(seq) - 1)]
    assert feats.labels[:, 0].tolist() == greedy[1:] + [NO_LABEL]
    assert feats.labels[:, 1].tolist() == greedy[2:] + [NO_LABEL] * 2
    assert 0 < feats.on_path.sum() < len(feats)  # sampled hot: some tokens are not the greedy ones
    # On greedy paths only: a label stays where the tokens from t+1 up to it are greedy.
    kept = feats.greedy_paths().labels
    for t in range(len(feats)):
        assert (kept[t, 0] != NO_LABEL) == (feats.labels[t, 0] != NO_LABEL and bool(feats.on_path[t]))
        both = feats.labels[t, 1] != NO_LABEL and bool(feats.on_path[t] and feats.on_path[t + 1])
        assert (kept[t, 1] != NO_LABEL) == both
        assert kept[t, 0] in (NO_LABEL, feats.labels[t, 0]) and kept[t, 1] in (NO_LABEL, feats.labels[t, 1])


def _distill_results(toy_model_path, tmp_path, prompts, samples):
    """`specq generate --json` over scripts/distill_requests.py's batch: the results
    file `train-heads --answers` reads (the queue writes the same lines)."""
    import subprocess
    import sys

    batch = tmp_path / "distill.jsonl"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "distill_requests.py")
    made = subprocess.run(
        [sys.executable, script, prompts, "--samples", str(samples), "--temperature", "1.2"],
        capture_output=True,
        text=True,
        check=True,
    )
    batch.write_text(made.stdout)
    out = CliRunner().invoke(
        main, ["generate", "--input", str(batch), "--model", toy_model_path, "--proposer", "none", "--json"]
    )
    assert out.exit_code == 0, out.output
    results = tmp_path / "distill.results.jsonl"
    # In the order a queue might finish them: train-heads must not depend on it.
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    results.write_text("\n".join(reversed(lines)) + "\n")
    return batch, results


@pytest.mark.slow
def test_the_command_trains_on_a_results_file_of_greedy_and_sampled_answers(toy_model_path, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", n=20, max_tokens=16)
    batch, results = _distill_results(toy_model_path, tmp_path, prompts, samples=2)
    ids = [json.loads(line)["custom_id"] for line in batch.read_text().splitlines()]
    assert len(ids) == 60 and ids[:3] == ["t0", "t0~s1", "t0~s2"]
    assert [json.loads(line).get("temperature") for line in batch.read_text().splitlines()[:3]] == [0.0, 1.2, 1.2]
    args = ["train-heads", prompts, "--model", toy_model_path, "--epochs", "2", "--answers", str(results)]
    args += ["--precision", "f32"]
    first = CliRunner().invoke(main, [*args, "--work-dir", str(tmp_path / "w1"), "-o", str(tmp_path / "a.gguf")])
    assert first.exit_code == 0, first.output
    assert "answers: 60 (" in first.output and "distill.results.jsonl" in first.output
    head = RecurrentHead.load(str(tmp_path / "a.gguf"))
    assert head.metadata["answers"] == "60" and head.metadata["answers_from"] == "distill.results.jsonl"
    assert 0 < float(head.metadata["answers_on_greedy_paths"]) < 1  # the sampled answers part from greedy
    assert head.metadata["gate_precision"] == "f32" and head.metadata["row_cost"] == "0.4"
    # A row per answer token (answers of 2 tokens or more); the two prompts of twenty
    # held out (every tenth) with all three of their answers.
    lengths = {}
    for line in results.read_text().splitlines():
        rec = json.loads(line)
        if len(rec["specq"]["token_ids"]) >= 2:
            lengths[rec["custom_id"]] = len(rec["specq"]["token_ids"])
    assert int(head.metadata["train_rows"]) + int(head.metadata["held_out_rows"]) == sum(lengths.values())
    held = sum(n for cid, n in lengths.items() if cid.split("~")[0] in ("t9", "t19"))
    assert int(head.metadata["held_out_rows"]) == held > 0
    # The results in another order give the same head.
    results.write_text("\n".join(sorted(results.read_text().splitlines())) + "\n")
    second = CliRunner().invoke(main, [*args, "--work-dir", str(tmp_path / "w2"), "-o", str(tmp_path / "b.gguf")])
    assert second.exit_code == 0, second.output
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_a_results_file_that_is_not_of_the_prompts_is_one_line(toy_model_path, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", n=12, max_tokens=4)
    other = _prompts(tmp_path / "other.jsonl", n=13, max_tokens=4)
    _, results = _distill_results(toy_model_path, tmp_path, other, samples=0)
    not_results = tmp_path / "bad.jsonl"
    not_results.write_text('{"custom_id": "a", "text": "hi"}\n')
    for path, what in [(results, "'t12' answers a prompt that is not in the prompts file"), (not_results, "line 1")]:
        out = CliRunner().invoke(
            main,
            ["train-heads", prompts, "--model", toy_model_path, "--answers", str(path), "-o", str(tmp_path / "h.gguf")]
            + ["--work-dir", str(tmp_path / "w")],
        )
        assert out.exit_code == 1 and "Traceback" not in out.output
        lines = [line for line in out.output.strip().splitlines() if not line.startswith("[")]
        assert len(lines) == 1 and what in lines[0], out.output
    # A batch size would decode nothing here: said, not silently ignored.
    out = CliRunner().invoke(
        main,
        ["train-heads", prompts, "--model", toy_model_path, "--answers", str(results), "--batch-size", "4"]
        + ["-o", str(tmp_path / "h.gguf"), "--work-dir", str(tmp_path / "w")],
    )
    assert out.exit_code == 1 and out.output.strip().splitlines() == [
        "Error: --batch-size sets how many answers are decoded together; with --answers none are"
    ]
    assert not (tmp_path / "h.gguf").exists()

"""`specq bench` on a toy model: the report's figures are consistent with each other."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from click.testing import CliRunner

from specq.cli import main
from specq.specdec import int8


@pytest.mark.slow
def test_bench_reports_every_config_and_category(toy_model_path, tmp_path):
    prompts = tmp_path / "p.jsonl"
    lines = [
        {"custom_id": f"{cat}-{i}", "category": cat, "prompt": f"the cat {cat} {i} the cat", "max_tokens": 24}
        for cat in ("qa", "code")
        for i in range(3)
    ]
    prompts.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--input",
            str(prompts),
            "--model",
            toy_model_path,
            "--proposers",
            "ngram",
            "--k",
            "2,4",
            "--repeat",
            "2",
            "--limit",
            "2",
            "--batch-size",
            "3",
            "--json",
            "--plot",
            str(tmp_path / "charts"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {(r["config"], r["category"]): r for r in report["results"]}
    singles = ("none", "ngram k=2", "ngram k=4")
    assert set(rows) == {(c, cat) for c in singles for cat in ("code", "qa", "all")} | {
        (f"{c} batch=3", "all") for c in singles
    }
    for c in singles:  # batched: 4 requests 3 at a time, each output what it is alone
        batched = rows[(f"{c} batch=3", "all")]
        assert batched["exact"] is True and batched["requests"] == 4 and batched["batch_size"] == 3
        assert batched["tokens"] == rows[(c, "all")]["tokens"]
    for (config, category), r in rows.items():
        if "batch=" in config:
            continue
        assert r["requests"] == (4 if category == "all" else 2)  # --limit 2 per category
        if config == "none":
            assert r["speedup"] == 1.0 and r["tau"] == 1.0 and r["exact"] is None
        else:
            assert r["exact"] is True  # greedy speculative output equals plain output
            assert r["tau"] >= 1.0 and len(r["accepted_per_position"]) <= int(config[-1])
    assert set(report["verify_cost"]) == {"3", "5"}
    assert set(report["batch_cost"]) == {"3"} and report["batch_cost"]["3"] > 0
    # A difference of two timings: on a toy model it is tiny, and noise may make it
    # negative; only its presence and form are checked here, never a timing.
    assert set(report["batch_draft_cost"]) == {"3"} and math.isfinite(report["batch_draft_cost"]["3"])
    assert "decode round of 3 requests" in result.stderr and "a draft each adds" in result.stderr
    # Rounds at the requests' own contexts (bench.halfway_contexts, tested apart).
    assert set(report["mixed_batch_gain"]) == {"3"} and math.isfinite(report["mixed_batch_gain"]["3"])
    assert len(report["mixed_contexts"]) == 4
    assert "decode rounds at the requests' own contexts" in result.stderr and "3 requests (contexts" in result.stderr
    assert "tok/s" in result.stderr and "verify cost" in result.stderr
    charts = sorted(p.name for p in (tmp_path / "charts").iterdir())
    assert charts == [
        "acceptance_per_position.png",
        "speedup_per_category.png",
        "tokens_per_s_vs_batch_size.png",
        "tokens_per_s_vs_k.png",
    ]
    for name in charts:
        data = (tmp_path / "charts" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000  # a real image, not an empty canvas


@pytest.mark.slow
def test_bench_sweeps_batch_sizes_and_measures_the_row_cost_curve(toy_model_path, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"the cat {i} sat", "max_tokens": 12}) for i in range(5)) + "\n")
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--input",
            str(prompts),
            "--model",
            toy_model_path,
            "--proposers",
            "none",
            "--repeat",
            "1",
            "--batch-size",
            "2,4,4",
            "--row-curve",
            "1,2,8",
            "--json",
            "--plot",
            str(tmp_path / "charts"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    batched = {r["config"]: r for r in report["results"] if "batch=" in r["config"]}
    assert set(batched) == {"none batch=2", "none batch=4"}  # a repeated size is measured once
    assert all(r["exact"] is True and r["requests"] == 5 for r in batched.values())
    assert report["settings"]["batch_sizes"] == [2, 4] and set(report["batch_cost"]) == {"2", "4"}
    assert set(report["mixed_batch_gain"]) == {"2", "4"} and len(report["mixed_contexts"]) == 5
    for kind in ("verify", "decode"):
        curve = report["row_curve"][kind]
        assert set(curve) == {"1", "2", "8"} and curve["1"] > 0 and all(math.isfinite(v) for v in curve.values())
    assert "row cost, rows of one sequence" in result.stderr and "row cost, sequences of one row" in result.stderr
    charts = {p.name for p in (tmp_path / "charts").iterdir()}
    assert {"tokens_per_s_vs_batch_size.png", "row_cost.png"} <= charts
    bad = CliRunner().invoke(main, ["bench", "--model", toy_model_path, "--batch-size", "1,8"])
    assert bad.exit_code == 2 and "batch sizes must be >= 2" in bad.stderr


def test_row_costs_time_each_forward_once_its_own_shape_has_settled(toy_model_path):
    """Every timed forward of the row costs comes after SETTLE_RUNS forwards of its own
    shape and is one of TIMED_RUNS in a row: a lone step timed right after a bigger
    forward is not the lone step decoding runs (bench._settled says by how much)."""
    from itertools import groupby

    from specq import bench
    from specq.specdec.model import LlamaModel

    model = LlamaModel.load(toy_model_path, "f32")
    shapes: list[tuple[int, ...]] = []
    forward = model.forward

    def spy(segments):
        shapes.append(tuple(len(s.token_ids) for s in segments))
        return forward(segments)

    model.forward = spy
    verify = bench.measure_verify_cost(model, [1, 3], context=8, trials=2)
    batch, drafts = bench.measure_batch_cost(model, [2, 3], context=8, trials=2)
    assert set(verify) == {1, 3} and set(batch) == set(drafts) == {2, 3}
    assert bench.SETTLE_RUNS >= 10  # lone steps on the Xeon settled after about ten
    per_timing = bench.SETTLE_RUNS + bench.TIMED_RUNS
    timed = [(shape, len(list(run))) for shape, run in groupby(s for s in shapes if 8 not in s)]  # prompts aside
    # verify: (1 row, the divisor, and 1 row), 3 rows; batch: 1 row, then per size a
    # round of one row and one of two rows a request; each trial in turn.
    expected = [((1,), 2 * per_timing), ((3,), per_timing)] * 2 + [
        ((1,), per_timing),
        ((1, 1), per_timing),
        ((2, 2), per_timing),
        ((1, 1, 1), per_timing),
        ((2, 2, 2), per_timing),
    ] * 2
    assert timed == expected


def test_mixed_rounds_put_each_request_at_its_own_context_against_its_own_lone_steps(toy_model_path):
    """measure_mixed_rounds: request i at contexts[i] (in turn), every round settled;
    a lone step timed at each distinct context, then each size's round of those
    requests, whose gain sums the lone steps of the contexts it holds."""
    from specq import bench
    from specq.specdec.model import LlamaModel

    model = LlamaModel.load(toy_model_path, "f32")
    calls: list[tuple[tuple[int, int], ...]] = []  # per forward: (start, rows) of each segment
    caches: list[tuple[int, ...]] = []  # and which cache each segment wrote
    forward = model.forward

    def spy(segments):
        calls.append(tuple((s.start, len(s.token_ids)) for s in segments))
        caches.append(tuple(id(s.cache) for s in segments))
        return forward(segments)

    model.forward = spy
    last = model.config.context_length - 1  # a request at the end of the model's context still steps
    gains = bench.measure_mixed_rounds(model, [2, 3], [8, last], trials=2)
    assert set(gains) == {2, 3} and all(g > 0 and math.isfinite(g) for g in gains.values())
    assert calls[:3] == [((0, 8),), ((0, last),), ((0, 8),)]  # three requests' prompts, the third at 8 again
    per_timing = bench.SETTLE_RUNS + bench.TIMED_RUNS
    trial = [((8, 1),)] * per_timing + [((last, 1),)] * per_timing
    trial += [((8, 1), (last, 1))] * per_timing + [((8, 1), (last, 1), (8, 1))] * per_timing
    assert calls[3:] == trial * 2
    # Every request on a cache of its own (one cache read by several rows stays in
    # the CPU's caches, and makes a round look cheaper), each lone step on one of them.
    requests = caches[:3]
    assert len(set(requests)) == 3 and caches[-1] == tuple(c for (c,) in requests)
    assert caches[3] == requests[0] and caches[3 + per_timing] == requests[1]
    assert bench.measure_mixed_rounds(model, [2], []) == {}


def test_halfway_contexts_are_each_requests_prompt_and_half_its_answer_shuffled_below_the_context():
    from types import SimpleNamespace

    from specq import bench

    prompts, outputs = [5, 9, 30, 12, 7], [10, 3, 40, 0, 1]
    requests = [(None, SimpleNamespace(prompt_ids=(1,) * p)) for p in prompts]
    runs = [SimpleNamespace(output_ids=[2] * o) for o in outputs]
    contexts = bench.halfway_contexts(requests, runs, 40)
    assert sorted(contexts) == sorted([10, 10, 39, 12, 7])  # 30 + 20 is past the context: 39
    assert contexts == bench.halfway_contexts(requests, runs, 40)  # the same order every run
    assert contexts != [10, 10, 39, 12, 7]  # shuffled: the file's order groups its categories


@pytest.mark.slow
def test_bench_samples_with_temperature_and_checks_batched_against_their_single_stream(toy_model_path, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"the cat {i} sat on", "max_tokens": 16}) for i in range(4)))
    args = ["bench", "--input", str(prompts), "--model", toy_model_path, "--proposers", "ngram", "--k", "3"]
    args += ["--repeat", "1", "--batch-size", "3", "--json"]
    sampling = ["--temperature", "0.9", "--top-p", "0.9", "--seed", "7"]
    sampled = CliRunner().invoke(main, [*args, *sampling, "--accept", "sample"])
    raced = CliRunner().invoke(main, [*args, *sampling])
    greedy = CliRunner().invoke(main, args)
    assert sampled.exit_code == 0 and raced.exit_code == 0 and greedy.exit_code == 0, sampled.output + greedy.output
    report = json.loads(sampled.stdout)
    assert report["settings"]["temperature"] == 0.9 and report["settings"]["top_p"] == 0.9
    assert report["settings"]["accept"] == "sample"
    rows = {r["config"]: r for r in report["results"] if r["category"] == "all"}
    # The sample rule's speculation is not plain decoding's draws: no promise there;
    # batched, the same configuration's single stream, token for token.
    assert rows["ngram k=3"]["exact"] is None
    assert rows["ngram k=3 batch=3"]["exact"] is True and rows["none batch=3"]["exact"] is True
    # The race rule (auto's for sampling): speculative outputs are plain sampling's.
    race_rows = {r["config"]: r for r in json.loads(raced.stdout)["results"] if r["category"] == "all"}
    assert race_rows["ngram k=3"]["exact"] is True and race_rows["ngram k=3 batch=3"]["exact"] is True
    plain = {r["config"]: r for r in json.loads(greedy.stdout)["results"] if r["category"] == "all"}
    assert plain["ngram k=3"]["exact"] is True  # greedy: plain decoding's outputs
    # Sampling is on: the outputs are not greedy decoding's (seeded: the same every run).
    assert rows["none"]["tokens"] != plain["none"]["tokens"]
    bad = CliRunner().invoke(main, ["bench", "--model", toy_model_path, "--quality", "--temperature", "0.5"])
    assert bad.exit_code == 2 and "--temperature" in bad.stderr
    greedy_tools = CliRunner().invoke(
        main, ["bench", "--model", toy_model_path, "--compare", "hf", "--temperature", "1"]
    )
    assert greedy_tools.exit_code == 2 and "greedily" in greedy_tools.stderr and "Traceback" not in greedy_tools.output


def test_bench_refuses_unknown_proposers_and_bad_lists(toy_model_path):
    runner = CliRunner()
    bad = runner.invoke(main, ["bench", "--model", toy_model_path, "--proposers", "magic"])
    assert bad.exit_code == 2 and "unknown proposer 'magic'" in bad.stderr
    bad = runner.invoke(main, ["bench", "--model", toy_model_path, "--k", "0,2"])
    assert bad.exit_code == 2 and "integers >= 1" in bad.stderr


class EngineAsTool:
    """An external tool stand-in that is a real greedy decoder: specq's own engine
    without speculation, behind the TimedBaseline interface (the real tools are
    optional extras that the tests do not install)."""

    name = "own-engine"
    batches = True

    def __init__(self, engine):
        self.engine = engine
        self.calls = 0
        self.batch_sizes = []
        self.timed = []

    def generate_timed(self, prompt_ids, max_tokens, end_ids):
        import time

        from specq.bench_external import Timed
        from specq.specdec.state import GenerationRequest

        self.calls += 1
        t0 = time.perf_counter()
        state = self.engine.run(GenerationRequest(prompt_ids=tuple(prompt_ids), max_tokens=max_tokens))
        out = state.output_ids
        assert all(t not in end_ids for t in out[:-1])
        self.timed.append(Timed(list(out), time.perf_counter() - t0, state.metrics.prefill_seconds))
        return self.timed[-1]

    def generate_many_timed(self, prompts, max_tokens, end_ids, batch_size):
        import time

        from specq.specdec.state import GenerationRequest

        self.batch_sizes.append(batch_size)
        t0 = time.perf_counter()
        states = self.engine.run_many(
            [GenerationRequest(prompt_ids=tuple(p), max_tokens=m) for p, m in zip(prompts, max_tokens)],
            group_size=batch_size,
        )
        return [list(s.output_ids) for s in states], time.perf_counter() - t0


def _bench_ngram_and_tools(model, tokenizer, specs, tools, repeat, progress=lambda _: None):
    """run_bench of plain decoding and ngram k=2, single stream and 2 at a time, beside
    the stand-in tools."""
    from specq.bench import BenchConfig, run_bench
    from specq.requests.inputs import GenerationDefaults
    from specq.specdec.loader import make_proposer

    return run_bench(
        model,
        tokenizer,
        specs,
        [BenchConfig("ngram", 2)],
        lambda name: make_proposer(name, model, tokenizer),
        defaults=GenerationDefaults(),
        repeat=repeat,
        batch_sizes=[2],
        baselines=tools,
        progress=progress,
    )


def test_external_tools_run_on_the_same_prompts_and_are_compared_to_plain(toy_model_path):
    from specq.bench import format_table
    from specq.requests.inputs import PromptSpec
    from specq.specdec.engine import Engine
    from specq.specdec.loader import load_model_and_tokenizer, make_proposer

    model, tokenizer = load_model_and_tokenizer(toy_model_path)
    specs = [
        PromptSpec(custom_id=f"p{i}", line=i + 1, prompt=f"the cat {i}", overrides={"max_tokens": 12}, category="qa")
        for i in range(3)
    ]
    tool = EngineAsTool(Engine(model, tokenizer, make_proposer("none", model, tokenizer)))
    report = _bench_ngram_and_tools(model, tokenizer, specs, [tool], repeat=2)
    assert tool.calls == 6 and tool.batch_sizes == [2, 2]  # every prompt, every repetition, and batched
    row = next(r for r in report.results if r.config == "own-engine")
    assert row.identical == 1.0 and row.exact is None and row.tau is None and row.requests == 3
    plain = next(r for r in report.results if r.config == "none")
    assert row.tokens == plain.tokens
    # Prefill excluded: the tokens after the first over the time after the prefill,
    # the median over the repetitions (two: their mean).
    per_rep = [
        sum(len(t.ids) - 1 for t in rep) / sum(t.seconds - t.first_token_seconds for t in rep)
        for rep in (tool.timed[:3], tool.timed[3:])
    ]
    assert row.decode_tokens_per_s == pytest.approx(sum(per_rep) / 2, abs=0.01)
    assert plain.decode_tokens_per_s is not None and plain.decode_tokens_per_s > 0
    batched = next(r for r in report.results if r.config == "own-engine batch=2")
    assert batched.identical == 1.0 and batched.batch_size == 2 and batched.decode_tokens_per_s is None
    table = format_table(report)
    assert "own-engine" in table and "own-engine batch=2" in table and "100%" in table and "decode/s" in table


def test_single_stream_configurations_take_each_prompt_in_turn(toy_model_path):
    """Every single-stream configuration decodes a prompt before any decodes the next
    (the order reversed from one prompt to the next), so that a slow moment of the
    machine weighs on a prompt's configurations alike; batched passes stay whole."""
    from specq.requests.inputs import PromptSpec
    from specq.specdec.engine import Engine
    from specq.specdec.loader import load_model_and_tokenizer, make_proposer

    model, tokenizer = load_model_and_tokenizer(toy_model_path)
    log = []

    class Logged(EngineAsTool):
        def generate_timed(self, prompt_ids, max_tokens, end_ids):
            log.append((self.name, tuple(prompt_ids)))
            return super().generate_timed(prompt_ids, max_tokens, end_ids)

        def generate_many_timed(self, prompts, max_tokens, end_ids, batch_size):
            log.append((self.name, "batch"))
            return super().generate_many_timed(prompts, max_tokens, end_ids, batch_size)

    tools = []
    for name in ("tool-a", "tool-b"):
        tool = Logged(Engine(model, tokenizer, make_proposer("none", model, tokenizer)))
        tool.name = name
        tools.append(tool)
    specs = [
        PromptSpec(custom_id=f"p{i}", line=i + 1, prompt=f"the dog {i}", overrides={"max_tokens": 6}) for i in range(3)
    ]
    said = []
    _bench_ngram_and_tools(model, tokenizer, specs, tools, repeat=1, progress=said.append)
    # Each prompt says it is done before any configuration's figure is given.
    assert [m.split(":")[0] for m in said[:3]] == [f"rep 1/1 prompt {i}/3" for i in (1, 2, 3)]
    prompts = list(dict.fromkeys(ids for _, ids in log if ids != "batch"))
    assert len(prompts) == 3
    assert log == [
        ("tool-a", prompts[0]),
        ("tool-b", prompts[0]),
        ("tool-b", prompts[1]),
        ("tool-a", prompts[1]),
        ("tool-a", prompts[2]),
        ("tool-b", prompts[2]),
        ("tool-a", "batch"),
        ("tool-b", "batch"),
    ]


def test_compare_refuses_unknown_tools_and_names_a_missing_extra(toy_model_path):
    import importlib.util

    runner = CliRunner()
    bad = runner.invoke(main, ["bench", "--model", toy_model_path, "--compare", "vllm"])
    assert bad.exit_code == 2 and "unknown tool 'vllm'" in bad.stderr
    if importlib.util.find_spec("llama_cpp") is None:
        missing = runner.invoke(main, ["bench", "--model", toy_model_path, "--compare", "llama.cpp"])
        assert missing.exit_code == 1 and "needs llama-cpp-python" in missing.stderr
        assert "Traceback" not in missing.output


# int8 changes only the products with Q4_1 and Q8_0 matrices: a toy made of them.
QUANTIZED = dict(seed=6, tensor_type="Q4_1", embedding_type="Q8_0")
needs_int8 = pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 precision needs AVX2")


def _prompts(tmp_path, n_per_category: int = 2) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join(
            json.dumps({"category": cat, "prompt": f"the cat {cat} {i} the cat", "max_tokens": 12}) + "\n"
            for cat in ("qa", "code")
            for i in range(n_per_category)
        )
    )
    return str(path)


@needs_int8
def test_bench_at_int8_is_exact_and_drafts_at_the_target_precision(toy_model_file, tmp_path):
    model = toy_model_file(**QUANTIZED)
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--input",
            _prompts(tmp_path),
            "--model",
            model,
            "--precision",
            "int8",
            "--proposers",
            "ngram,draft",
            "--draft-model",
            model,
            "--fixed-k",
            "--k",
            "2",
            "--repeat",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["settings"]["precision"] == "int8"
    rows = {(r["config"], r["category"]): r for r in report["results"]}
    assert all(r["exact"] is True for (config, _), r in rows.items() if config != "none")
    # The draft is the target's own file: at the same precision every draft is accepted
    # (an f32 draft would part from the int8 target where the two disagree).
    draft = rows[("draft k=2", "all")]
    assert draft["acceptance_rate"] == 1.0 and draft["tau"] > 1.0


@needs_int8
def test_bench_quality_reports_int16_and_int8_against_f32(toy_model_file, tmp_path):
    args = [
        "bench",
        "--quality",
        "--input",
        _prompts(tmp_path),
        "--model",
        toy_model_file(**QUANTIZED),
        "--limit",
        "1",
        "--max-tokens",
        "8",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "top-1 agreement with f32:" in result.stderr and "mean KL(f32 || int8):" in result.stderr
    assert "mean KL(f32 || int16):" in result.stderr
    assert "tok/s" not in result.stderr  # no speed passes
    reports = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    assert sorted(reports) == ["int16", "int8"]
    for report in reports.values():
        # --limit 1 per category: 2 prompts, each continued for at most --max-tokens.
        assert report["sequences"] == 2 and 2 <= report["positions"] <= 16
        assert 0.0 <= report["top1_agreement"] <= 1.0 and report["mean_kl"] >= 0.0
    # 15-bit activations stay closer to float32 than 8-bit ones.
    assert reports["int16"]["mean_kl"] < reports["int8"]["mean_kl"]
    only = json.loads(CliRunner().invoke(main, [*args, "--json", "--precision", "int16"]).stdout)
    assert sorted(only) == ["int16"]


def test_bench_quality_on_a_cpu_without_avx2_is_one_error_line(toy_model_file, tmp_path, monkeypatch):
    monkeypatch.setattr(int8.vec, "has_avx2", lambda: False)  # what such a CPU reports
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--quality",
            "--input",
            _prompts(tmp_path),
            "--model",
            toy_model_file(**QUANTIZED),
            "--limit",
            "1",
            "--max-tokens",
            "4",
        ],
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines()[-1].startswith("Error: ") and "AVX2" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python (extra 'compare')")
def test_llama_cpp_batched_decodes_every_prompt_as_its_single_stream_does(real_model_path):
    """The batched llama.cpp baseline: continuous batching over more prompts than
    slots, prompts of different lengths and budgets, every completion as long as
    asked or ended by an end id, and the single stream's completions. Not all of
    them: llama.cpp computes a row with other kernels when other sequences share its
    forward (measured here: one of seven parts from its single stream at the second
    token), while a mix-up of sequences, positions or cache slots changes nearly all."""
    from specq.bench_external import IsolatedBaseline

    tool = IsolatedBaseline("llama.cpp", real_model_path, 2)
    try:
        assert tool.batches
        prompts = [[1, 4093, 28, 253, 5248, 314][: 2 + i % 4] + [1000 + 17 * i] for i in range(7)]
        budgets = [3 + 2 * (i % 3) for i in range(7)]
        end_ids = frozenset({2})
        alone = [tool.generate_timed(p, m, end_ids) for p, m in zip(prompts, budgets)]
        assert all(t.first_token_seconds is not None and 0 < t.first_token_seconds <= t.seconds for t in alone)
        together, seconds = tool.generate_many_timed(prompts, budgets, end_ids, 3)
        assert seconds > 0
        for got, _, budget in zip(together, alone, budgets):
            assert len(got) == budget or got[-1] in end_ids
        assert sum(got == single.ids for got, single in zip(together, alone)) >= len(prompts) - 2
    finally:
        tool.close()


def test_quality_refuses_speed_options_and_a_row_curve_past_the_context_fails_before_the_passes(
    toy_model_path, tmp_path
):
    runner = CliRunner()
    for extra in (
        ["--compare", "llama.cpp"],
        ["--plot", str(tmp_path / "p")],
        ["--row-curve", "1,2"],
        ["--batch-size", "2"],
    ):
        result = runner.invoke(main, ["bench", "--quality", "--model", toy_model_path, *extra])
        assert result.exit_code == 2 and f"it takes no {extra[0]}" in result.stderr, extra
    assert not (tmp_path / "p").exists()
    # The toy's context is 512: 400 rows after the curve's 200 positions do not fit.
    result = runner.invoke(
        main,
        [
            "bench",
            "--input",
            _prompts(tmp_path),
            "--model",
            toy_model_path,
            "--proposers",
            "none",
            "--repeat",
            "1",
            "--row-curve",
            "1,400",
        ],
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--row-curve 400 rows after 200 positions exceed the model's context of 512" in result.stderr
    assert "rep 1/1" not in result.stderr  # refused before the speed passes, not after them

"""Smoke runs of every script in scripts/: each runs as a user would run it (a
subprocess from the repository root), with the smallest arguments, on a toy model
where it takes one, and its report is checked, not only its exit status."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specq.specdec import int8

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"

needs_int8 = pytest.mark.skipif(not int8.AVAILABLE, reason="the integer precisions need AVX2")


def run_script(
    name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(Path("scripts") / name), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refuses(name: str, cases, *common: str) -> None:
    """Each (arguments, words) case: the script exits non-zero with an error naming
    those words, never a traceback."""
    for bad, named in cases:
        result = run_script(name, *common, *bad)
        assert result.returncode != 0 and named in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.fixture(scope="module")
def q4_model(toy_model_file) -> str:
    """A toy model with the default model's types: Q4_1 blocks, a Q8_0 embedding and
    head (the integer precisions' compiled stack needs Q4_1)."""
    return toy_model_file(tensor_type="Q4_1", embedding_type="Q8_0")


def write_prompts(path: Path, n: int) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"custom_id": f"p{i}", "category": "qa", "prompt": f"Say something about {i}."}) + "\n")
    return path


def test_every_script_has_a_smoke_test_and_none_edits_sys_path():
    here = Path(__file__).read_text()
    for script in sorted(SCRIPTS.glob("*.py")):
        assert f'"{script.name}"' in here, f"{script.name} has no smoke test in {Path(__file__).name}"
        assert not re.search(r"sys\.path\s*(\.|\[|\+?=)", script.read_text()), f"{script.name} edits sys.path"


# --- distill_requests.py ---------------------------------------------------------------


def test_distill_requests_writes_each_prompt_greedy_then_sampled(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    lines = [json.loads(x) for x in ok(run_script("distill_requests.py", prompts, "--samples", "2")).splitlines()]
    assert [x["custom_id"] for x in lines] == ["p0", "p0~s1", "p0~s2", "p1", "p1~s1", "p1~s2", "p2", "p2~s1", "p2~s2"]
    assert all(x["prompt"] == f"Say something about {x['custom_id'][1]}." for x in lines)
    assert [x["temperature"] for x in lines[:3]] == [0.0, 0.7, 0.7]
    seeds = [x["seed"] for x in lines if "seed" in x]
    assert len(seeds) == 6 == len(set(seeds))  # every sampled answer its own draws
    # The same input, the same batch (so `specq run` resumes it rather than starting anew).
    assert ok(run_script("distill_requests.py", prompts, "--samples", "2")) == ok(
        run_script("distill_requests.py", prompts, "--samples", "2")
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n[1, 2]\n')
    for args, what in [((bad,), "line 2: not a JSON object"), ((prompts, "--temperature", "0"), "--temperature")]:
        result = run_script("distill_requests.py", *args)
        assert result.returncode != 0 and result.stdout == "" and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and what in result.stderr, result.stderr


# --- parity_hf.py: torch and transformers are an optional extra ------------------------


def test_parity_hf_help():
    out = ok(run_script("parity_hf.py", "--help"))
    assert "transformers" in out and "--gguf" in out and "--speed" in out


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None,
    reason="the compare extra is installed",
)
def test_parity_hf_without_the_compare_extra_names_it_in_one_line(toy_model_path):
    result = run_script("parity_hf.py", "--gguf", toy_model_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "pip install 'specq[compare]'" in lines[0]
    assert "compare" in lines[0] and ("torch" in lines[0] or "transformers" in lines[0])


# --- parity_quantized.py ---------------------------------------------------------------


@pytest.mark.slow
def test_parity_quantized_on_a_q4_1_toy(q4_model):
    # qa is 34 tokens; code (58) also goes through the whole-prompt (BULK_ROWS) branch.
    out = ok(run_script("parity_quantized.py", "--gguf", q4_model, "--new-tokens", "2", "--prompts", "qa,code"))
    assert re.search(r"^model: .*; 8 quantized layer matrices, head QuantizedMatrix;", out, re.M), out
    rows = re.findall(r"^  (\S+) +(\d+) +([\d.e+-]+) +([\d.e+-]+) +[\d.]+ +(\d+)/(\d+) +[\d.e+-]+$", out, re.M)
    assert [name for name, *_ in rows] == ["qa", "code"], out
    for _, tokens, max_diff, _, agree, of in rows:
        assert int(tokens) == int(of) > 0 and int(agree) <= int(tokens)
        assert 0 < float(max_diff) < 1e-2  # different arithmetic, the same values
    assert len(re.findall(r"whole prompt in one forward \(BLAS on dequantized values\): max \|diff\|", out)) == 1
    worst = float(re.search(r"overall max \|diff\| = ([\d.e+-]+)", out)[1])
    assert worst == max(float(r[2]) for r in rows)
    greedy = re.findall(r"^  (\S+) +(?:\d+ tokens  identical|DIFFER at \d+)", out, re.M)
    assert greedy == ["qa", "code"], out
    assert out.rstrip().endswith("RESULT: PASS")


# --- bench_precision.py ----------------------------------------------------------------


@pytest.mark.slow
def test_bench_precision_on_a_toy(q4_model, tmp_path):
    precisions = ["f32", "int16"] if int8.AVAILABLE else ["f32"]
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    small = f"--batch-size 1,2 --repeat 1 --max-tokens 4 --precisions {','.join(precisions)}".split()
    out = ok(run_script("bench_precision.py", "--model", q4_model, "--input", prompts, *small))
    assert "3 requests, at most 4 tokens, proposer none" in out
    table = re.findall(r"^ +(\d+)  (\w+) +([\d.]+) +([\d.]+)x +(\d+)/(\d+)$", out, re.M)
    assert [(int(b), p) for b, p, *_ in table] == [(b, p) for b in (1, 2) for p in precisions], out
    for _, name, rate, ratio, same, of in table:
        assert float(rate) > 0 and float(ratio) > 0 and int(of) == 3 and int(same) <= 3
        if name == "f32":
            assert ratio == "1.00" and same == "3"  # f32 against itself


# --- bench_draft_costs.py ---------------------------------------------------------------


def test_bench_draft_costs_on_a_toy(q4_model, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    small = "--batch-size 1,2 --repeat 2 --max-tokens 6 --precision f32 --proposer ngram".split()
    out = ok(run_script("bench_draft_costs.py", "--model", q4_model, "--input", prompts, *small))
    for size in (1, 2):
        assert f"batch size {size}, 3 requests, 2 repetitions, f32:" in out, out
    rows = re.findall(
        r"^  (plain|lone costs|measured costs) +([\d.]+) tokens/s +([\d.]+)x plain .*drafted (\d+), accepted (\d+)$",
        out,
        re.M,
    )
    assert [name for name, *_ in rows] == ["plain", "lone costs", "measured costs"] * 2, out
    for name, rate, ratio, drafted, accepted in rows:
        assert float(rate) > 0 and int(accepted) <= int(drafted)
        if name == "plain":
            assert ratio == "1.000" and drafted == "0"


# --- bench_qkernels.py -----------------------------------------------------------------


def test_bench_qkernels_on_a_toy(q4_model):
    out = ok(run_script("bench_qkernels.py", "--model", q4_model, "--repeat", "1", "--rows", "1,2", "--prefill", "8"))
    assert out.startswith("2 layers; quantized matrices")
    rows = _product_rows(out)
    assert [(kind, int(n)) for kind, *_, n, _, _, _, _ in rows] == [
        (kind, n) for n in (1, 2) for kind in ("qkv", "out", "gate_up", "down", "head")
    ], out
    types = {kind: t for kind, _, _, t, *_ in rows}
    assert types == {"qkv": "Q4_1", "out": "Q4_1", "gate_up": "Q4_1", "down": "Q4_1", "head": "Q8_0"}
    assert all(float(f) > 0 and float(q) > 0 and float(g) > 0 for *_, f, q, _, g in rows)
    assert "whole forward, matrix products only (2 layers x 4 products + head)" in out
    assert re.search(r"^prefill of 8 rows, matrix products of a whole forward:", out, re.M)
    assert (
        len(re.findall(r"^  (quant, one call|quant, chunks of \d+|BLAS float32 \(x @ w\.T\)) +[\d.]+ ms", out, re.M))
        == 3
    )


def _product_rows(out: str) -> list[tuple[str, ...]]:
    """(kind, n_out, n_in, type, rows, float32 us, quantized us, speedup, G/s) per product line."""
    return re.findall(
        r"^ *(qkv|out|gate_up|down|head) +(\d+)x(\d+) +(\w+) +(\d+) +([\d.na]+) +([\d.]+) +([\d.na]+)x +([\d.]+)$",
        out,
        re.M,
    )


@needs_int8
def test_bench_qkernels_times_the_integer_products(q4_model):
    args = ("bench_qkernels.py", "--model", q4_model, "--repeat", "1", "--rows", "3", "--precision", "int16")
    out = ok(run_script(*args, "--prefill", "0", "--no-float"))
    rows = _product_rows(out)
    assert [kind for kind, *_ in rows] == ["qkv", "out", "gate_up", "down", "head"], out
    # No float32 copies: that column is empty; the integer products' times and rates are not.
    assert all(f == "nan" and float(q) > 0 and float(g) > 0 for *_, f, q, _, g in rows)
    # The prefill comparison is the float32-activation kernels': refused, not silently skipped.
    refused = run_script(*args)
    assert refused.returncode == 2 and "--prefill 0" in refused.stderr


# --- bench_prefill.py ------------------------------------------------------------------


def test_bench_prefill_on_a_toy(q4_model, tmp_path):
    out = ok(run_script("bench_prefill.py", "--model", q4_model, "--precision", "f32", "--lengths", "12,40"))
    lines = re.findall(r"^ +(\d+) tokens, +whole: +([\d.]+) ms +([\d.]+) tokens/s$", out, re.M)
    assert [int(n) for n, _, _ in lines] == [12, 40], out
    assert all(float(ms) > 0 and float(rate) > 0 for _, ms, rate in lines)
    args = ("--model", q4_model, "--precision", "f32", "--lengths", "40", "--pieces", "0,16,64")
    out = ok(run_script("bench_prefill.py", *args))
    hows = re.findall(r"^ +40 tokens, +(.+?): +[\d.]+ ms", out, re.M)
    assert hows == ["whole", "pieces of 16"], out  # 64 rows hold all 40: the whole prompt, timed once
    refused = run_script("bench_prefill.py", "--model", q4_model, "--lengths", "0")
    assert refused.returncode == 2 and "lengths must be" in refused.stderr
    for bad in (("--lengths", "ten"), ("--trials", "1"), ("--pieces", "x"), ("--pieces", "-3")):
        refused = run_script("bench_prefill.py", "--model", q4_model, *bad)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr and bad[0] in refused.stderr
    missing = run_script("bench_prefill.py", "--model", str(tmp_path / "none.gguf"), "--lengths", "12")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "model file not found" in missing.stderr
    # A length given twice is timed once.
    out = ok(run_script("bench_prefill.py", "--model", q4_model, "--precision", "f32", "--lengths", "12,12"))
    assert len(re.findall(r"^ +12 tokens,", out, re.M)) == 1, out


# --- bench_stall.py -------------------------------------------------------------------


@needs_int8
def test_bench_stall_on_a_toy(q4_model):
    base = ("--model", q4_model, "--batch", "2", "--prompt", "90", "--trials", "1")
    out = ok(run_script("bench_stall.py", *base, "--pieces", "16,32"))
    lines = re.findall(
        r"^ +(.+?): round before +([\d.]+) ms, longest round +([\d.]+) ms, others +([\d.]+) tokens/s, "
        r"time to first token +([\d.]+) ms$",
        out,
        re.M,
    )
    assert [name for name, *_ in lines] == ["pieces of 16", "pieces of 32", "whole"], out
    assert all(float(v) > 0 for _, *figures in lines for v in figures), out
    for bad, named in (
        (("--pieces", "x"), "--pieces"),
        (("--pieces", "2000"), "below 1024"),
        (("--batch", "0"), "--batch"),
        (("--prompt", "600"), "--prompt"),
    ):
        refused = run_script("bench_stall.py", *base, *bad)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr and named in refused.stderr, bad
    at_f32 = run_script("bench_stall.py", *base, "--precision", "f32", "--pieces", "16")
    assert at_f32.returncode == 2 and "change their bits" in at_f32.stderr


def test_bench_qkernels_refuses_mistakes_before_loading(tmp_path):
    missing = str(tmp_path / "none.gguf")
    for bad, named in ((("--rows", "ten"), "--rows"), (("--model", missing), "model file not found")):
        refused = run_script("bench_qkernels.py", *bad)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr and named in refused.stderr


# --- bench_forward_parts.py -------------------------------------------------------------


@needs_int8
def test_bench_forward_parts_splits_each_shape_and_checks_its_copy_of_the_loop(q4_model):
    out = ok(
        run_script(
            "bench_forward_parts.py",
            "--model",
            q4_model,
            "--rows",
            "1,3",
            "--context",
            "8",
            "--trials",
            "1",
            timeout=600,
        )
    )
    assert "int16, context 8, medians of 1 forwards" in out
    labels = ("products", "attention", "rest of the layers", "outside the layers")
    part = ", ".join(rf"{label} (-?[\d.]+) ms \((-?\d+)%\)" for label in labels)
    lines = re.findall(r"^(.*): forward ([\d.]+) ms = " + part + "$", out, re.M)
    assert [line[0] for line in lines] == ["1 row", "3 rows of one sequence", "3 sequences of 1 row"], out
    for _, forward, *figures in lines:  # each part's share is its time over the forward's
        assert float(forward) > 0, out
        for ms, share in zip(figures[::2], figures[1::2]):
            # Times print to 0.01 ms and shares to 1%: the share must fit some time and
            # forward that print as these (forwards of a toy model take about 0.1 ms).
            ratios = [(float(ms) + a) / (float(forward) + b) for a in (-0.005, 0.005) for b in (-0.005, 0.005)]
            assert 100 * min(ratios) - 0.5 <= int(share) <= 100 * max(ratios) + 0.5, out
    refuses(
        "bench_forward_parts.py",
        ((("--rows", "0"), "--rows"), (("--rows", "x"), "--rows"), (("--context", "0"), "--context")),
        "--model",
        q4_model,
    )
    missing = run_script("bench_forward_parts.py", "--model", "/nonexistent.gguf")
    assert missing.returncode != 0 and "not found" in missing.stderr and "Traceback" not in missing.stderr


@needs_int8
def test_bench_forward_parts_copy_check_tells_a_different_loop(q4_model):
    """The guard that stops the script when its copy of the loop drifts from
    int8_stack._run: true for the whole copy, false for a copy without attention."""
    spec = importlib.util.spec_from_file_location("bench_forward_parts", SCRIPTS / "bench_forward_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from specq.specdec.model import LlamaModel, Segment

    model = LlamaModel.load(q4_model, "int16")
    ids = [5, 6, 7, 8, 9, 10]
    caches = [model.new_cache(32) for _ in range(2)]
    for i, cache in enumerate(caches):
        model.forward([Segment(cache, ids[i : i + 4], 0, all_logits=False)])
    timer = module._Timed(model._stack)
    segments = module._segments(caches, ids, 1, 4)
    assert module._same_bits(model, timer, module._loop(True, True), segments)
    assert not module._same_bits(model, timer, module._loop(True, False), segments)
    assert model._stack.compiled is timer.real  # the real loop back in place


# --- bench_scales.py, bench_attention.py -------------------------------------------------


@needs_int8
def test_bench_scales_on_a_toy(q4_model):
    for extra in ((), ("--cached",)):
        out = ok(run_script("bench_scales.py", "--model", q4_model, "--rows", "1,3", "--trials", "1", *extra))
        timed = r"float32 scales ([\d.]+) ms, float16 scales ([\d.]+) ms, ([\d.]+)x$"
        lines = re.findall(r"^(\d+) row\(s\): " + timed, out, re.M)
        assert [int(r) for r, *_ in lines] == [1, 3], out
        assert all(float(v) > 0 for _, *figures in lines for v in figures), out
        assert ("from cache" if extra else "from memory") in out
    assert "--rows" in run_script("bench_scales.py", "--rows", "0").stderr
    missing = run_script("bench_scales.py", "--model", "/nonexistent.gguf")
    assert missing.returncode != 0 and "not found" in missing.stderr and "Traceback" not in missing.stderr


@needs_int8
def test_bench_frozen_layouts_times_every_form_against_float16_keys():
    out = ok(
        run_script(
            "bench_frozen_layouts.py",
            "--context",
            "100",
            "--sequences",
            "2",
            "--layers",
            "2",
            "--trials",
            "2",
            timeout=300,
        )
    )
    forms = re.findall(r"^([A-F]) .*median +([\d.]+) ms .*vs A ([\d.]+)$", out, re.M)
    assert [f for f, *_ in forms] == list("ABCDEF"), out
    assert all(float(t) > 0 for _, t, _ in forms) and float(forms[0][2]) == 1.0, out
    assert "frozen blocks 2" in out  # positions 0..63 frozen at context 100 (block_ops.frozen_blocks)
    bad = run_script("bench_frozen_layouts.py", "--context", "0")
    assert bad.returncode != 0 and "--context" in bad.stderr and "Traceback" not in bad.stderr


@needs_int8
def test_bench_attention_against_an_earlier_copy(q4_model, tmp_path):
    copy = tmp_path / "block_ops_copy.py"
    copy.write_text((ROOT / "specq" / "specdec" / "block_ops.py").read_text())
    args = ("--model", q4_model, "--cases", "2x8,3x20", "--trials", "1")
    # The copy compiles afresh: 6.4 minutes alone here since frozen keys (2026-12-07).
    out = ok(run_script("bench_attention.py", *args, "--against", copy, timeout=1200))
    # Again: the copy's compiled code now comes from numba's cache, which imports the
    # copy by its module name (a ModuleNotFoundError before the script registered it).
    out = ok(run_script("bench_attention.py", *args, "--against", copy, timeout=300))
    timed = r"\d+ layers: against ([\d.]+) ms, now ([\d.]+) ms"
    lines = re.findall(r"^(\d+) sequence\(s\), context (\d+) to (\d+), " + timed, out, re.M)
    assert [(int(n), int(a), int(b)) for n, a, b, *_ in lines] == [(2, 8, 15), (3, 20, 27)], out
    assert "against / now" in out
    # Segments of 3 causal rows (a verification chain): the rows' own keys in the cache.
    out = ok(run_script("bench_attention.py", *args, "--rows", "3", "--against", copy, timeout=300))
    chains = re.findall(r"^(\d+) sequence\(s\), context (\d+) to \d+, 3 rows each, \d+ layers: against", out, re.M)
    assert [(int(n), int(c)) for n, c in chains] == [(2, 8), (3, 20)], out
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    refuses(
        "bench_attention.py",
        (
            (("--cases", "32"), "--cases"),
            (("--one-cache", "--against", copy), "one comparison at a time"),
            (("--rows", "0"), "--rows"),
            (("--against", tmp_path / "missing.py"), "no file"),
            (("--against", other), "no attend_many"),
            (("--model", "/nonexistent.gguf"), "not found"),
        ),
    )


@needs_int8
def test_bench_attention_times_a_round_whose_long_sequences_come_last(q4_model):
    out = ok(run_script("bench_attention.py", "--model", q4_model, "--cases", "4x8:20", "--trials", "1", timeout=600))
    line = r"^4 sequence\(s\), context 8 to 15, then half at 20 to 27, \d+ layers: now ([\d.]+) ms$"
    found = re.findall(line, out, re.M)
    assert len(found) == 1 and float(found[0]) > 0, out
    refuses(
        "bench_attention.py",
        (
            (("--cases", "4x8:20", "--one-cache"), "one context"),
            (("--cases", "4x8:a"), "--cases"),
            (("--cases", "3x8:20"), "even number"),
        ),
    )


@needs_int8
def test_bench_attention_times_every_sequence_reading_one_cache(q4_model):
    """--one-cache: the same rows over their own caches and over the first one's,
    which hold the same tokens, so the script's bits check passes only if both read
    what they should."""
    args = ("--model", q4_model, "--cases", "3x20", "--trials", "1", "--one-cache")
    out = ok(run_script("bench_attention.py", *args, timeout=600))
    line = r"^3 sequence\(s\), context 20, \d+ layers: now ([\d.]+) ms, one cache ([\d.]+) ms, now / one cache ([\d.]+)"
    found = re.findall(line, out, re.M)
    assert len(found) == 1 and all(float(x) > 0 for x in found[0]), out


# --- bench_head_screen.py --------------------------------------------------------------


@needs_int8
def test_bench_head_screen_times_the_screen_the_whole_head_and_the_choice(q4_model, toy_model_file, tmp_path):
    """Both kinds of text (an input .jsonl, a plain text), every row count, the three
    paths' times; the script itself stops if their argmax ever differ."""
    text = tmp_path / "notes.md"
    text.write_text("# Notes\n\n- the cat sat on the mat\n- a b c a b\n\n| a | b |\n| --- | --- |\n" * 20)
    prompts = write_prompts(tmp_path / "prompts.jsonl", 6)
    args = ("--model", q4_model, "--texts", f"{prompts},{text}", "--rows", "12,16", "--calls", "6", "--between", "1")
    out = ok(run_script("bench_head_screen.py", *args, timeout=900))
    line = r"^(\S+) +(\d+)" + r" +([\d.]+)" * 5 + r" +([\d.]+)% +(\d+)%$"
    found = re.findall(line, out, re.M)
    assert [(name, int(rows)) for name, rows, *_ in found] == [
        ("prompts.jsonl", 12),
        ("prompts.jsonl", 16),
        ("notes.md", 12),
        ("notes.md", 16),
    ], out
    for _, _, *ms, unsure, screened in found:
        assert all(float(x) > 0 for x in ms) and 0 <= float(unsure) <= 100 and 0 <= int(screened) <= 100, out
    # Decoding: the three heads' runs, each line's figures, the same outputs (checked by the script).
    prompts = write_prompts(tmp_path / "decode.jsonl", 14)
    # quiet_end: answers run to --max-tokens, so rounds of 12 rows reach the head's choice.
    talker = toy_model_file(quiet_end=True, tensor_type="Q4_1", embedding_type="Q8_0")
    args = ("--model", talker, "--texts", prompts, "--batch", "12", "--max-tokens", "3", "--runs", "1")
    out = ok(run_script("bench_head_screen.py", "--decode", "--suffix", " In a table.", *args, timeout=900))
    runs = re.findall(
        r"^decode.jsonl +(\w+) +12 requests, (\d+) tokens: ([\d.]+) s; best ([\d.]+) tokens/s$", out, re.M
    )
    assert [name for name, *_ in runs] == ["choice", "screen", "whole"], out
    assert all(int(n) == 36 and float(t) > 0 and float(r) > 0 for _, n, t, r in runs), out
    refuses(
        "bench_head_screen.py",
        (
            (("--decode", "--texts", text), "--decode takes .jsonl"),
            (("--decode", "--runs", "0"), "--runs"),
            (("--rows", "8"), "--rows"),
            (("--rows", "a"), "--rows"),
            (("--texts", tmp_path / "missing.md"), "not a file"),
            (("--calls", "0"), "--calls"),
            (("--model", "/nonexistent.gguf"), "not found"),
        ),
    )


# --- bench_forwards.py -----------------------------------------------------------------


@needs_int8
def test_bench_forwards_on_a_toy(q4_model):
    out = ok(run_script("bench_forwards.py", "--model", q4_model, "--context", "8", "--trials", "1"))
    timed = r"now ([\d.]+) ms \(([\d.]+)x its 1 row\)"
    lines = re.findall(r"^context 8, (\d+) row\(s\) x (\d+) sequence\(s\): " + timed + "$", out, re.M)
    cases = [(1, 1), (5, 1), (1, 8), (1, 32), (1, 64), (64, 1)]
    assert [(int(r), int(s)) for r, s, *_ in lines] == cases, out
    assert all(float(ms) > 0 for *_, ms, _ in lines) and float(lines[0][3]) == 1.0, out
    out = ok(run_script("bench_forwards.py", "--model", q4_model, "--context", "8", "--trials", "1", "--greedy"))
    paired = r"whole [\d.]+ ms \([\d.]+x its 1 row\), greedy [\d.]+ ms \([\d.]+x its 1 row\), "
    paired += r"whole / greedy [\d.]+ \(median of pairs\)"
    lines = re.findall(r"^context 8, (\d+) row\(s\) x (\d+) sequence\(s\): " + paired + "$", out, re.M)
    assert [(int(r), int(s)) for r, s in lines] == cases, out
    out = ok(
        run_script(
            "bench_forwards.py", "--model", q4_model, "--context", "8", "--trials", "1", "--precisions", "int16,int8"
        )
    )
    agree = re.findall(r"^(\d+) row\(s\) x (\d+) sequence\(s\): argmax agrees at (\d+) of (\d+) rows$", out, re.M)
    assert [(int(r), int(s)) for r, s, *_ in agree] == cases, out
    assert all(int(n) == int(r) * int(s) and int(a) <= int(n) for r, s, a, n in agree), out
    paired = r"int16 [\d.]+ ms \([\d.]+x its 1 row\), int8 [\d.]+ ms \([\d.]+x its 1 row\), int16 / int8 [\d.]+ "
    assert len(re.findall(r"^context 8, .*: " + paired + r"\(median of pairs\)$", out, re.M)) == len(cases), out
    refuses(
        "bench_forwards.py",
        (
            (("--precisions", "int16"), "--precisions"),
            (("--precisions", "int16,int16"), "--precisions"),
            (("--precisions", "int16,int8", "--greedy"), "--precisions"),
            (("--against", "no-such-commit"), "not a commit"),
            (("--context", "0"), "--context"),
            (("--model", "/nonexistent.gguf"), "not found"),
        ),
    )


def test_bench_forwards_exports_a_commit_as_a_package_of_another_name():
    """--against imports another commit's specq beside this one: every import of
    specq inside the copy must name the copy, or the two codes would mix."""
    spec = importlib.util.spec_from_file_location("bench_forwards", ROOT / "scripts" / "bench_forwards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    package = module.export("HEAD") / module.PACKAGE
    sources = {p.relative_to(package): p.read_text() for p in package.rglob("*.py")}
    assert Path("specdec") / "model.py" in sources and Path("__init__.py") in sources
    assert "from specq_against.specdec" in sources[Path("specdec") / "model.py"]
    for path, text in sources.items():
        assert not re.search(r"^\s*(from|import) specq\b(?!_against)", text, re.M), path


# --- bench_kv_cache.py -----------------------------------------------------------------


@pytest.mark.slow  # compiles the integer block loop for float32 caches (not cached): about 7 s
@needs_int8
def test_bench_kv_cache_on_a_toy(q4_model):
    out = ok(run_script("bench_kv_cache.py", "--model", q4_model, "--context", "8", "--trials", "1"))
    cache = r"(float32|float16|int8) ([\d.]+) ms \(([\d.]+)x float32, ([\d.]+)x its 1 row\)"
    lines = re.findall(r"^int16, context 8, (\d+) row\(s\) x (\d+) sequence\(s\): (.*)$", out, re.M)
    assert [(int(r), int(s)) for r, s, _ in lines] == [(1, 1), (5, 1), (1, 8), (1, 32)], out
    for rows, seqs, rest in lines:
        parts = [re.fullmatch(cache, part) for part in rest.split("; ")]
        assert all(parts) and [p[1] for p in parts] == ["float32", "float16", "int8"], rest
        assert float(parts[0][3]) == 1.0 and all(float(p[2]) > 0 and float(p[3]) > 0 for p in parts)
        if (rows, seqs) == ("1", "1"):
            assert all(float(p[4]) == 1.0 for p in parts)
    assert "--caches" in run_script("bench_kv_cache.py", "--caches", "float16,int4").stderr
    assert "--sequences" in run_script("bench_kv_cache.py", "--sequences", "8,x").stderr
    out = ok(
        run_script(
            "bench_kv_cache.py",
            "--model",
            q4_model,
            "--caches",
            "float16,float16+int8",
            "--sequences",
            "3",
            "--context",
            "8",
            "--trials",
            "1",
        )
    )
    lines = re.findall(
        r"^int16, context 8, (\d+) row\(s\) x (\d+) sequence\(s\): float16 .*; float16\+int8 ", out, re.M
    )
    assert [(int(r), int(s)) for r, s in lines] == [(1, 1), (5, 1), (1, 3)], out
    out = ok(
        run_script(
            "bench_kv_cache.py", "--model", q4_model, "--growth", "--caches", "int8", "--context", "20", "--trials", "1"
        )
    )
    figure = r"([\d.]+) -> ([\d.]+) ms \(\+(-?[\d.]+)\)"
    lines = re.findall(
        rf"^int16, int8 cache, (\d+) sequence\(s\), context 8 -> 20: round {figure}; attention alone {figure}$",
        out,
        re.M,
    )
    assert [int(line[0]) for line in lines] == [1, 8, 32], out
    assert all(float(x) > 0 for line in lines for x in (line[1], line[2], line[4], line[5]))


# --- replay_drafts.py ------------------------------------------------------------------


# What `replay_drafts.py replay` prints for a trace with the head's beam, in order.
REPLAY_POLICIES = ["engine", "batch-aware", "per-source", "flat-prior", "perfect", "tree-0.1", "tree-0.2", "tree-0.3"]


def _replay_table(out: str) -> dict[str, dict[str, float]]:
    table = {}
    for line in out.splitlines()[1:]:
        policy, *cells = line.split()
        table[policy] = {cells[i]: float(cells[i + 1]) for i in range(0, len(cells), 2)}
    return table


def _chain_beam(tokens: list[int], p: float) -> list[tuple[int, int, float]]:
    """A beam of one path: node i continues node i - 1, each step at probability p."""
    return [(i - 1, token, p ** (i + 1)) for i, token in enumerate(tokens)]


@pytest.mark.slow
def test_replay_drafts_replays_a_trace(tmp_path):
    # A trace as `record` writes it: per decode (category, output ids, per position the
    # lookup draft, its match length, the head's 4 guesses, its confidence in each and
    # its beam), and the prompts' ids.
    output = [10, 11, 12, 13] * 6
    right = {
        t: (output[t : t + 4], 3, output[t : t + 4], [0.95] * 4, _chain_beam(output[t : t + 4], 0.95))
        for t in range(1, len(output))
    }
    wrong = {t: ([], 0, [7, 7, 7, 7], [0.1] * 4, _chain_beam([7, 7, 7, 7], 0.05)) for t in range(1, len(output))}
    trace = tmp_path / "trace.pkl"
    data = {"gate": (0.75, 0.9), "traces": [("code", output, right), ("qa", output, wrong)], "prompts": [[1], [2]]}
    with open(trace, "wb") as f:
        pickle.dump(data, f)
    out = ok(run_script("replay_drafts.py", "replay", "--trace", trace, "--row-cost", "0.4"))
    assert out.startswith("modeled speedup over plain decoding (prefill aside), row cost 0.4, batch 1:")
    table = _replay_table(out)
    assert list(table) == REPLAY_POLICIES
    for speedups in table.values():
        assert set(speedups) == {"code", "qa", "all"}
        assert speedups["qa"] <= 1.0 + 1e-9  # nothing right to draft: at best plain decoding
    assert table["perfect"]["code"] > 1.5  # every draft right
    assert table["engine"]["code"] > 1.0
    assert table["engine"] == table["batch-aware"]  # the same at batch 1
    # The qa beam's paths are below every threshold: no tree, a plain round and the
    # head's first level (0.06 of a step), run to find nothing; at the last position
    # there is nothing to draft and no head to run.
    rounds = len(output) - 1
    assert table["tree-0.1"]["qa"] == pytest.approx(rounds / ((rounds - 1) * 1.06 + 1), abs=1e-3)
    # code's lookup drafts everywhere, so its trees are never asked for.
    assert table["tree-0.3"]["code"] == table["engine"]["code"]

    # The store: answers in which 7 follows 7, 7, 7, 7 continue qa's output wrongly;
    # ones that continue it as it goes make its drafts right.
    results = tmp_path / "results.jsonl"
    ids = {"prompt_token_ids": [2], "token_ids": output}
    results.write_text(json.dumps({"custom_id": "a", "specq": ids}) + "\n")
    table = _replay_table(ok(run_script("replay_drafts.py", "replay", "--trace", trace, "--store", results)))
    assert list(table)[-1] == "store"
    assert table["store"]["qa"] > 1.2 and table["engine"]["qa"] <= 1.0 + 1e-9
    assert table["store"]["code"] == table["engine"]["code"]  # lookup first


@pytest.mark.slow
def test_replay_drafts_store_needs_a_trace_with_prompts(tmp_path):
    trace = tmp_path / "trace.pkl"
    with open(trace, "wb") as f:
        pickle.dump({"gate": (0.5,), "traces": []}, f)
    results = tmp_path / "results.jsonl"
    results.write_text("")
    result = run_script("replay_drafts.py", "replay", "--trace", trace, "--store", results)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "has no prompts" in result.stderr and "record it again" in result.stderr


@pytest.mark.slow
def test_replay_drafts_without_a_trace_says_to_record_one(tmp_path):
    result = run_script("replay_drafts.py", "replay", "--trace", tmp_path / "none.pkl")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "replay_drafts.py record" in result.stderr


@pytest.mark.slow  # the real model and its shipped head: about 7 s
def test_replay_drafts_records_on_the_default_model(real_model_path, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 1)
    trace = tmp_path / "trace.pkl"
    out = ok(run_script("replay_drafts.py", "record", "--input", prompts, "--max-tokens", "8", "--trace", trace))
    with open(trace, "rb") as f:
        data = pickle.load(f)
    category, output, positions = data["traces"][0]
    assert out.strip() == f"1 decodes, {len(output)} tokens -> {trace}"
    assert category == "qa" and 1 < len(output) <= 8 and sorted(positions) == list(range(1, len(output)))
    assert len(data["prompts"]) == 1 and len(data["prompts"][0]) > 5  # the chat template's tokens
    for _, _, guesses, confidence, beam in positions.values():
        assert len(guesses) == len(confidence) == 4
        # 4 guesses at the first level, then 4 for each of the 4 likeliest paths.
        assert len(beam) == 4 + 3 * 16
        assert [parent for parent, _, _ in beam[:4]] == [-1] * 4
        assert all(beam[parent][2] >= p for parent, _, p in beam if parent >= 0)  # a path's probability falls
        # The beam's first guess is the head's chained first guess.
        assert beam[0][1] == guesses[0] and beam[0][2] == pytest.approx(confidence[0], rel=1e-6)
    table = _replay_table(ok(run_script("replay_drafts.py", "replay", "--trace", trace)))
    assert list(table) == REPLAY_POLICIES
    assert all(v > 0 for speedups in table.values() for v in speedups.values())


def _cycling_answers(path: Path, n: int) -> Path:
    """Results of n answers that count up through 40 tokens from different starts:
    the token after next always follows from the next, so a head that sees the next
    token's embedding can learn every held-out label."""
    with open(path, "w") as fh:
        for i in range(n):
            output = [100 + (3 * i + j) % 40 for j in range(24)]
            ids = {"prompt_token_ids": [1, 2, 3 + i % 5], "token_ids": output}
            fh.write(json.dumps({"custom_id": f"a{i}", "specq": ids}) + "\n")
    return path


@pytest.mark.slow
def test_probe_head_inputs_learns_what_the_inputs_say(q4_model, tmp_path):
    results = _cycling_answers(tmp_path / "results.jsonl", 30)
    args = ["--model", q4_model, "--taps", "0,1", "--epochs", "12", "--batch-rows", "32", "--hidden", "64"]
    out = ok(run_script("probe_head_inputs.py", results, *args, timeout=300))
    lines = out.splitlines()
    # The 10th, 20th and 30th answers held out; 23 rows an answer, from the prompt's
    # last (label: the answer's second token) to the answer's third last.
    assert lines[0] == (
        "30 answers: 621 training rows, 69 held out (1.000 of their labels inside the 40-token draft "
        "vocabulary); taps after blocks 0,1"
    )
    top1 = {line.split()[0]: float(line.split()[-1]) for line in lines[1:]}
    assert list(top1) == ["last", "taps", "previous"]
    assert all(v > 0.9 for v in top1.values()), top1


@pytest.mark.slow
def test_probe_head_inputs_refuses_mistakes_in_one_line(q4_model, tmp_path):
    results = _cycling_answers(tmp_path / "results.jsonl", 30)
    for args, message in [
        (["--taps", "0,9"], "--taps: the model has blocks 0 to 1"),
        (["--taps", "x"], "--taps 'x': not a list of block numbers"),
        (["--inputs", "last,attention"], "--inputs: attention unknown"),
        (["--epochs", "0"], "--epochs, --hidden, --vocab and --batch-rows must each be at least 1"),
    ]:
        result = run_script("probe_head_inputs.py", results, "--model", q4_model, *args)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert message in result.stderr
    few = _cycling_answers(tmp_path / "few.jsonl", 5)  # none of the 10th, 20th, ...: nothing held out
    result = run_script("probe_head_inputs.py", few, "--model", q4_model, "--taps", "0")
    assert result.returncode != 0 and "0 held-out rows" in result.stderr
    result = run_script("probe_head_inputs.py", results, "--model", tmp_path / "absent.gguf")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "absent.gguf" in result.stderr


# --- probe_product_bits.py and probe_key_scales.py -------------------------------------


def _report(out: str) -> dict[str, list[str]]:
    """Each variant's report lines, by the line that names it."""
    reports: dict[str, list[str]] = {}
    for line in out.splitlines():
        if not line.startswith(" ") and line.endswith(":"):
            reports[line[:-1]] = []
        elif reports:
            reports[list(reports)[-1]].append(line)
    return reports


@needs_int8
@pytest.mark.slow
def test_probe_product_bits_compares_each_variant_with_f32(q4_model, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    args = ["--model", q4_model, "--input", prompts, "--max-tokens", "6", "--variants", ",w_out,w_gate_up+w_qkv"]
    reports = _report(ok(run_script("probe_product_bits.py", *args, timeout=300)))
    assert list(reports) == ["int16", "w_out at 8 bits", "w_gate_up+w_qkv at 8 bits"]
    assert len({lines[0] for lines in reports.values()}) == 1  # the same positions for every variant
    for lines in reports.values():
        assert lines[0].startswith("positions compared (teacher-forced): ")
        agreement = re.fullmatch(r"top-1 agreement with f32: +([0-9.]+)% \(target >= 99%\)", lines[1])
        assert agreement and 0 <= float(agreement.group(1)) <= 100


@pytest.mark.slow
def test_probe_product_bits_refuses_mistakes_in_one_line(q4_model, tmp_path):
    for args, message in [
        (["--variants", "w_qkv+w_attn"], "--variants: unknown kinds w_attn"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--model", tmp_path / "absent.gguf"], "absent.gguf"),
    ]:
        result = run_script("probe_product_bits.py", "--model", q4_model, *args)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert message in result.stderr


@pytest.mark.slow
def test_probe_key_scales_checks_itself_and_rounds_keys(q4_model, tmp_path):
    """The check (float32 keys by the step-by-step path) agrees at 100%; rounded keys
    give figures of their own."""
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    args = ["--model", q4_model, "--input", prompts, "--max-tokens", "6", "--groups", "0,16,4", "--blocks", "8,16"]
    lines = ok(run_script("probe_key_scales.py", *args, timeout=300)).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "float32 keys (the check)",
        "one scale per 16 dimensions",
        "one scale per 4 dimensions",
        "per channel over 8 positions, with a minimum",
        "per channel over 16 positions, with a minimum",
    ]
    counts = {line.split(" of ")[1].split()[0] for line in lines}
    assert len(counts) == 1 and int(counts.pop()) > 0  # the same positions for every grouping
    assert "top-1 agreement 100.00% of " in lines[0] and lines[0].endswith("mean KL 0.000000 nats")


@needs_int8
@pytest.mark.slow
def test_probe_key_scales_at_int16_names_its_own_keys(q4_model, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 1)
    args = ["--model", q4_model, "--input", prompts, "--max-tokens", "4", "--groups", "0", "--blocks", "8"]
    lines = ok(run_script("probe_key_scales.py", *args, "--precision", "int16", timeout=300)).splitlines()
    names = ["int16's own keys", "per channel over 8 positions, with a minimum"]
    assert [line.split(":")[0] for line in lines] == names
    for line in lines:
        agreement = re.search(r"top-1 agreement ([0-9.]+)% of [1-9]", line)
        assert agreement and 0 <= float(agreement.group(1)) <= 100


def _probe_key_scales():
    spec = importlib.util.spec_from_file_location("probe_key_scales", SCRIPTS / "probe_key_scales.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_key_scales_rounds_whole_blocks_per_channel():
    """Blocks are rounded only once whole, each channel on its own range: a channel of
    large keys does not coarsen its neighbours, whose keys land within half a step."""
    probe = _probe_key_scales()
    rng = np.random.default_rng(0)
    blocks = rng.normal(size=(2, 3, 4, 16, 8)).astype(np.float16)  # [layers, kv, blocks, head_dim, 8]
    blocks[:, :, :, 5] = blocks[:, :, :, 5] * 400 + 1000  # one channel far larger, and offset
    before = blocks.astype(np.float32)
    after = probe.rounder("blocks", 16, blocks)
    after(15)  # 15 positions: no block of 16 is whole
    assert np.array_equal(blocks.astype(np.float32), before)
    after(31)  # positions 0..15 are
    rounded = blocks.astype(np.float32)
    assert np.array_equal(rounded[:, :, 2:], before[:, :, 2:])
    span = before[:, :, :2]
    low, high = span.min(axis=(2, 4)), span.max(axis=(2, 4))  # [layers, kv, head_dim]
    step = ((high - low) / 255).astype(np.float16).astype(np.float32)[:, :, None, :, None]
    error = np.abs(rounded[:, :, :2] - span)
    # float16 storage adds its own rounding (a relative 2^-11) to the 8 bits' half step
    assert (error <= 0.5 * step + np.abs(span) * 2.0**-10 + 1e-6).all()
    assert not np.array_equal(rounded[:, :, :2], span)  # 8 bits did round something
    narrow = [c for c in range(16) if c != 5]
    assert error[:, :, :, narrow].max() < 0.05  # one scale for all 16 would have cost them ~5


def test_probe_key_scales_rounds_each_position_by_groups():
    probe = _probe_key_scales()
    blocks = np.zeros((1, 1, 2, 8, 8), np.float32)
    blocks[0, 0, 1, :, 2] = [1.0, -3.0, 0.5, 2.0, 100.0, 0.01, 7.0, -7.0]  # position 10
    after = probe.rounder("groups", 4, blocks)
    after(11)
    key = blocks[0, 0, 1, :, 2]
    assert np.allclose(key[:4], [1.0, -3.0, 0.5, 2.0], atol=3.0 / 254)
    assert key[5] == 0.0  # 0.01 is below half of 100 / 127
    assert np.isclose(key[4], 100.0) and not blocks[0, 0, 0].any()


@needs_int8
@pytest.mark.slow
@pytest.mark.parametrize("script", ["probe_product_bits.py", "probe_key_scales.py"])
def test_probes_name_a_prompt_that_fills_the_context(toy_model_file, tmp_path, script):
    """As `specq bench --quality`: a continuation is clipped to the context, and a prompt
    that fills it alone is named in one line."""
    small = toy_model_file(tensor_type="Q4_1", embedding_type="Q8_0", context_length=64)
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"custom_id": "long", "prompt": " ".join(["word"] * 100)}) + "\n")
    groups = ["--groups", "0,8"] if script == "probe_key_scales.py" else []
    result = run_script(script, "--model", small, "--input", prompts, "--max-tokens", "4", *groups)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "request 'long' (line 1): prompt has" in result.stderr
    assert "the model's context is 64" in result.stderr
    fits = write_prompts(tmp_path / "short.jsonl", 1)  # clipped to the room the context leaves
    ok(run_script(script, "--model", small, "--input", fits, "--max-tokens", "200", *groups, timeout=300))


@pytest.mark.slow
def test_probe_key_scales_refuses_mistakes_in_one_line(q4_model, tmp_path):
    for args, message in [
        (["--groups", "0,5"], "--groups [5]: each must divide the head's 16 dimensions"),
        (["--groups", "a"], "--groups 'a': not a list of numbers"),
        (["--blocks", "8,12"], "--blocks [12]: each must be a multiple of 8 positions"),
        (["--blocks", "x"], "--blocks 'x': not a list of numbers"),
        (["--precision", "int8"], "--precision 'int8': one of f32, int16"),
        (["--groups", ""], "--groups and --blocks name nothing to compare"),
        (["--model", tmp_path / "absent.gguf"], "absent.gguf"),
    ]:
        result = run_script("probe_key_scales.py", "--model", q4_model, *args)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert message in result.stderr


# --- the queue: bench_queue.py and chaos.py --------------------------------------------


def _private_env(tmp_path: Path) -> dict[str, str]:
    """No Redis URL (each script starts its own server) and a private specq home."""
    env = {k: v for k, v in os.environ.items() if k != "SPECQ_REDIS_URL"}
    return {**env, "SPECQ_HOME": str(tmp_path / "home"), "SPECQ_LOG_LEVEL": "WARNING"}


@pytest.mark.slow  # six whole `specq` commands: about 10 s
def test_bench_queue_small(tmp_path):
    small = "--requests 20 --workers 1 --max-tokens 2".split()
    out = ok(run_script("bench_queue.py", *small, env=_private_env(tmp_path)))
    report = json.loads(out)
    assert report["requests"] == report["results_lines"] == 20
    assert report["tokens"] == 40  # the toy model never ends a turn early
    for key in ("submit_s", "resubmit_s", "status_s", "decode_wall_s", "status_done_s", "results_s"):
        assert 0 < report[key] < 120, key
    for key in ("submit_peak_rss_mb", "worker_peak_rss_mb", "results_peak_rss_mb"):
        assert 10 < report[key] < 10_000, key
    assert 0 <= report["redis_seconds_summed"] <= report["worker_seconds_summed"]
    assert 0 <= report.get("redis_share_of_worker_time", 0) <= 1


@pytest.mark.slow  # a private Redis, a worker and the reference `specq generate`: about 6 s
def test_chaos_short(tmp_path):
    small = "--minutes 0.02 --requests 8 --batch 8 --workers 1 --max-tokens 4".split()
    result = run_script("chaos.py", *small, env=_private_env(tmp_path))
    report = json.loads(ok(result))
    assert report["requests"] >= 8 and report["batches"] >= 1 and report["workers"] == 1
    assert report["lost"] == report["not_completed"] == report["mismatched_outputs"] == 0
    assert report["tokens_counted_minus_results"] == 0 and report["held_never_recovered"] == 0
    assert set(report["faults"]) == set(report["recovery_seconds"]) == {"sigkill", "sigstop", "redis_kill"}


@pytest.mark.slow  # a private Redis, `specq serve` and a worker: about 10 s
def test_bench_server_small(tmp_path):
    small = "--requests 12 --workers 1 --max-tokens 3 --concurrent 4 --sync-max-tokens 6".split()
    report = json.loads(ok(run_script("bench_server.py", *small, env=_private_env(tmp_path))))
    assert report["status"] == "completed" and report["completed"] == report["output_lines"] == 12
    assert report["failed"] == 0 and report["in_input_order"] is True
    assert report["status_calls"] >= 1 and 0 < report["status_p50_ms"] <= report["status_max_ms"] < 10_000
    for key in ("upload_s", "create_s", "decode_wall_s", "download_s"):
        assert 0 < report[key] < 120, key
    assert report["sync_requests"] == report["sync_whole"] == 4  # every synchronous answer whole
    assert 0 < report["sync_first_token_p50_s"] <= report["sync_total_max_s"] < 120


@pytest.mark.slow  # spawns 2 x 2 processes that each import numba
def test_bench_worker_memory_small(q4_model):
    report = json.loads(ok(run_script("bench_worker_memory.py", "--model", q4_model, "--precision", "f32",
                                      "--processes", "2")))  # fmt: skip
    assert len(report["without_cache"]) == len(report["with_cache"]) == 2
    for row in report["without_cache"] + report["with_cache"]:
        assert row["rss"] > 0 and row["pss"] > 0 and row["load_s"] >= 0


# --- requantize.py and parity_llamacpp.py: llama-cpp-python is an optional extra -------

_HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def test_requantize_and_parity_llamacpp_name_the_missing_extra_in_one_line(toy_model_path, tmp_path):
    if _HAS_LLAMA_CPP:
        pytest.skip("llama-cpp-python is installed")
    for result in (
        run_script("requantize.py", tmp_path, "Q4_0"),
        run_script("parity_llamacpp.py", "--model", toy_model_path),
    ):
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "compare" in result.stderr


def test_requantize_refuses_an_unknown_type_or_no_directory(tmp_path):
    assert run_script("requantize.py").returncode == 2
    result = run_script("requantize.py", tmp_path, "Q9_9")
    assert result.returncode == 1 and "unknown type 'Q9_9'" in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.skipif(not _HAS_LLAMA_CPP, reason="llama-cpp-python (the compare extra) is not installed")
def test_requantize_writes_a_file_specq_computes_from_its_blocks(real_model_path, tmp_path):
    from specq.specdec.model import LlamaModel
    from specq.specdec.qkernels import QuantizedMatrix

    out = ok(run_script("requantize.py", tmp_path, "Q4_0", timeout=600))
    assert out.strip() == str(tmp_path / "smollm2-Q4_0.gguf")
    model = LlamaModel.load(out.strip())
    assert all(isinstance(lw.w_qkv, QuantizedMatrix) and lw.w_qkv.type_name == "Q4_1" for lw in model.weights.layers)
    table = ok(run_script("parity_llamacpp.py", "--model", out.strip(), "--new-tokens", "4", timeout=600))
    assert "top-1 agree" in table and len(table.strip().splitlines()) >= 3

"""`specq generate` through Click's test runner: data on stdout, progress and errors
on stderr, one-line errors with exit status 1 (2 for usage), nothing generated
unless every request is valid. All but one test use tiny toy models; the last runs
the real default model end to end."""

from __future__ import annotations

import json
import math
import os

import gguf
import numpy as np
import pytest
from click.testing import CliRunner, Result

from specq.cli import main
from specq.quality import greedy
from specq.specdec import gguf_file, int8
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.model import LlamaModel
from specq.specdec.tokenizer import Tokenizer
from specq.testing import toy_gguf

LINE_KEYS = {"custom_id", "text", "finish_reason", "usage", "specq"}
SPECQ_KEYS = {"token_ids", "prompt_token_ids", "metrics", "worker"}
METRIC_KEYS = {"target_forwards", "drafted", "accepted", "tau", "decode_seconds"}

# Prompts on which the default toy model's greedy output is long and repetitive enough
# for n-gram drafts to be accepted (checked below, so a change of toy shows up).
LONG_PROMPTS = ("repeat after me", "xyz", "a")


def generate(*args) -> Result:
    return CliRunner().invoke(main, ["generate", *(str(a) for a in args)])


def succeeded(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
    assert result.exception is None
    return result


def lines(result: Result) -> list[dict]:
    """The JSON objects on stdout, one per line (split on \\n only: a text may hold
    other characters that str.splitlines treats as line breaks)."""
    out = succeeded(result).stdout
    assert out.endswith("\n")
    return [json.loads(line) for line in out[:-1].split("\n")]


def records(result: Result) -> list[dict]:
    """The lines with their "specq" object's fields beside the others, for brevity
    (the first test checks the lines' real shape)."""
    return [{**{k: v for k, v in line.items() if k != "specq"}, **line["specq"]} for line in lines(result)]


def one_record(result: Result) -> dict:
    (rec,) = records(result)
    return rec


def write_jsonl(path, *objs) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        for obj in objs:
            fh.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    return str(path)


def user_error(result: Result, code: int, *fragments: str) -> str:
    """Checks a refused command: exit `code`, no Python exception escaped, nothing on
    stdout, exactly one line on stderr starting with "Error:" that holds every
    fragment; returns that line."""
    assert result.exit_code == code, f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    (line,) = errors
    if code == 1:  # not a usage error: the error is the last thing said
        assert result.stderr.rstrip("\n").splitlines()[-1] == line
    for fragment in fragments:
        assert fragment in line, line
    return line


@pytest.fixture(scope="module")
def toy_tokenizer(toy_model_path) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(toy_model_path))


# --- one prompt ---------------------------------------------------------------------


def test_prompt_json_prints_one_record_on_stdout(toy_model_path, toy_tokenizer):
    prompt = "repeat after me"
    result = generate("--model", toy_model_path, "--prompt", prompt, "--max-tokens", 20, "--json")
    (line,) = lines(result)
    assert set(line) == LINE_KEYS and set(line["specq"]) == SPECQ_KEYS
    assert line["specq"]["worker"] == ""  # generated here, by no worker
    rec = one_record(result)
    assert rec["custom_id"] == "prompt"
    assert rec["finish_reason"] == "length"
    assert all(isinstance(t, int) for t in rec["token_ids"] + rec["prompt_token_ids"])
    assert len(rec["token_ids"]) == 20
    assert rec["prompt_token_ids"] == toy_tokenizer.encode_chat([{"role": "user", "content": prompt}])
    assert rec["prompt_token_ids"][0] == toy_gguf.BOS_ID
    assert rec["text"] == toy_tokenizer.decode(rec["token_ids"])
    assert rec["usage"] == {
        "prompt_tokens": len(rec["prompt_token_ids"]),
        "completion_tokens": len(rec["token_ids"]),
        "total_tokens": len(rec["prompt_token_ids"]) + len(rec["token_ids"]),
    }
    m = rec["metrics"]
    assert METRIC_KEYS <= set(m)
    assert 1 <= m["target_forwards"] <= 20
    assert 0 <= m["accepted"] <= m["drafted"]
    assert m["tau"] >= 1.0
    assert m["decode_seconds"] > 0
    # Progress and the per-request summary go to stderr only.
    assert "loaded" in result.stderr and "prompt: 20 tokens (length)" in result.stderr
    assert "loaded" not in result.stdout and "tokens/s" not in result.stdout
    assert '"custom_id"' not in result.stderr


def test_plain_output_is_the_text_and_a_newline(toy_model_path):
    args = ("--model", toy_model_path, "--prompt", "hi", "--max-tokens", 40)
    rec = one_record(generate(*args, "--json"))
    assert rec["finish_reason"] == "stop"  # ended by <|im_end|>, which the text omits
    assert rec["token_ids"][-1] == toy_gguf.EOS_ID
    plain = succeeded(generate(*args))
    assert plain.stdout_bytes.decode("utf-8") == rec["text"] + "\n"


def test_raw_prompt_skips_the_chat_template(toy_model_path, toy_tokenizer):
    rec = one_record(
        generate("--model", toy_model_path, "--prompt", "hello", "--raw-prompt", "--max-tokens", 3, "--json")
    )
    assert rec["prompt_token_ids"] == toy_tokenizer.encode("hello")


def test_generation_stops_at_the_end_of_the_context(toy_model_file):
    path = toy_model_file(context_length=32)
    rec = one_record(generate("--model", path, "--prompt", "a", "--raw-prompt", "--max-tokens", 100, "--json"))
    assert rec["finish_reason"] == "length"
    assert rec["usage"]["total_tokens"] == 32


# --- input files --------------------------------------------------------------------


def test_input_file_gives_one_record_per_request_in_order(toy_model_path, tmp_path):
    path = write_jsonl(
        tmp_path / "in.jsonl",
        {"custom_id": "c", "prompt": "repeat after me", "max_tokens": 7},
        {"prompt": "hi"},
        {
            "custom_id": "a",
            "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "xyz"}],
            "max_tokens": 3,
        },
        "",
        {"prompt": "xyz", "max_tokens": 11},
    )
    recs = records(generate("--model", toy_model_path, "--input", path, "--json", "--max-tokens", 40))
    assert [r["custom_id"] for r in recs] == ["c", "request-2", "a", "request-5"]
    limits = [7, 40, 3, 11]
    for rec, limit in zip(recs, limits):
        n = rec["usage"]["completion_tokens"]
        assert n == len(rec["token_ids"])
        assert n <= limit
        if rec["finish_reason"] == "length":
            assert n == limit
        else:
            assert rec["finish_reason"] == "stop"
    # Both ways of finishing occur, so the checks above are not vacuous.
    assert [r["finish_reason"] for r in recs] == ["length", "stop", "stop", "length"]


def test_line_overrides_equal_the_same_flags(toy_model_path, tmp_path):
    path = write_jsonl(
        tmp_path / "in.jsonl", {"prompt": "a", "temperature": 0.8, "seed": 3, "top_p": 0.9, "max_tokens": 25}
    )
    from_file = one_record(generate("--model", toy_model_path, "--input", path, "--json"))
    from_flags = one_record(
        generate(
            "--model",
            toy_model_path,
            "--prompt",
            "a",
            "--temperature",
            0.8,
            "--seed",
            3,
            "--top-p",
            0.9,
            "--max-tokens",
            25,
            "--json",
        )
    )
    assert from_file["token_ids"] == from_flags["token_ids"]
    greedy = one_record(generate("--model", toy_model_path, "--prompt", "a", "--max-tokens", 25, "--json"))
    assert greedy["token_ids"] != from_file["token_ids"]  # the override did change something


def test_stream_prints_each_request_on_its_own_line(toy_model_path, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", {"prompt": "hi"}, {"prompt": "xyz", "max_tokens": 30})
    recs = records(generate("--model", toy_model_path, "--input", path, "--max-tokens", 40, "--json"))
    streamed = succeeded(generate("--model", toy_model_path, "--input", path, "--max-tokens", 40, "--stream"))
    assert streamed.stdout_bytes.decode("utf-8") == "".join(r["text"] + "\n" for r in recs)


# --- proposers and sampling ---------------------------------------------------------


def _long_prompts_file(tmp_path) -> str:
    return write_jsonl(tmp_path / "long.jsonl", *({"prompt": p} for p in LONG_PROMPTS), {"prompt": "hi"})


def test_greedy_output_is_the_same_for_every_proposer(toy_model_path, tmp_path):
    path = _long_prompts_file(tmp_path)
    # One request at a time: a request alone drafts by the constant figures, while in a
    # batch a greedy request drafts by this machine's timings (its tokens the same).
    common = ("--model", toy_model_path, "--input", path, "--max-tokens", 40, "--batch-size", 1, "--json")
    plain = records(generate(*common, "--proposer", "none"))
    ngram = records(generate(*common, "--proposer", "ngram"))
    # --fixed-k: a draft as big as the target never pays, so adaptive k would not draft.
    draft = records(generate(*common, "--proposer", "draft", "--draft-model", toy_model_path, "--fixed-k"))
    ids = [r["token_ids"] for r in plain]
    assert [r["token_ids"] for r in ngram] == ids
    assert [r["token_ids"] for r in draft] == ids
    assert [r["text"] for r in ngram] == [r["text"] for r in plain]
    assert all(r["metrics"]["drafted"] == 0 and r["metrics"]["tau"] == 1.0 for r in plain)
    # The speculative runs did speculate, and fewer target forwards were needed.
    assert sum(r["metrics"]["accepted"] for r in ngram) > 0
    assert sum(r["metrics"]["accepted"] for r in draft) > 0
    forwards = lambda recs: sum(r["metrics"]["target_forwards"] for r in recs)  # noqa: E731
    assert forwards(ngram) < forwards(plain)
    assert forwards(draft) < forwards(ngram)
    # A draft model identical to the target is always right when decoding greedily.
    for r in draft:
        assert r["metrics"]["accepted"] == r["metrics"]["drafted"]


@pytest.mark.parametrize("proposer", ["ngram", "none"])
def test_sampling_with_a_seed_is_reproducible_and_streams_the_same_text(toy_model_path, proposer):
    args = (
        "--model",
        toy_model_path,
        "--prompt",
        "a",
        "--temperature",
        0.8,
        "--max-tokens",
        40,
        "--proposer",
        proposer,
    )
    first = one_record(generate(*args, "--seed", 3, "--json"))
    second = one_record(generate(*args, "--seed", 3, "--json"))
    assert first == {**second, "metrics": first["metrics"]}  # timings differ, nothing else
    assert {k: v for k, v in first["metrics"].items() if not k.endswith("seconds")} == {
        k: v for k, v in second["metrics"].items() if not k.endswith("seconds")
    }
    other_seed = one_record(generate(*args, "--seed", 4, "--json"))
    assert other_seed["token_ids"] != first["token_ids"]
    streamed = succeeded(generate(*args, "--seed", 3, "--stream"))
    assert streamed.stdout_bytes.decode("utf-8") == first["text"] + "\n"
    assert streamed.stderr.count("tokens/s") == 1


# --- precision ------------------------------------------------------------------------

# int8 changes only the products with Q4_1 and Q8_0 matrices: a toy made of them.
QUANTIZED = dict(seed=6, tensor_type="Q4_1", embedding_type="Q8_0")
needs_int8 = pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 precision needs AVX2")


def test_the_default_precision_is_int16_where_the_cpu_runs_it(toy_model_file, tmp_path, monkeypatch):
    common = (
        "--model",
        toy_model_file(**QUANTIZED),
        "--input",
        _long_prompts_file(tmp_path),
        "--max-tokens",
        16,
        "--json",
    )
    result = generate(*common)
    assert f"precision {'int16' if int8.AVAILABLE else 'f32'}" in result.stderr
    default = records(result)
    chosen = records(generate(*common, "--precision", "int16" if int8.AVAILABLE else "f32"))
    assert [(r["token_ids"], r["text"]) for r in chosen] == [(r["token_ids"], r["text"]) for r in default]
    monkeypatch.setattr(int8.vec, "has_avx2", lambda: False)  # a CPU without AVX2: f32, no error
    assert "precision f32" in generate(*common).stderr


@needs_int8
def test_int8_precision_decodes_what_the_int8_model_decodes_greedily(toy_model_file, tmp_path):
    model_path = toy_model_file(**QUANTIZED)
    common = (
        "--model",
        model_path,
        "--input",
        _long_prompts_file(tmp_path),
        "--max-tokens",
        16,
        "--json",
        "--precision",
        "int8",
    )
    result = generate(*common)
    assert "precision int8" in result.stderr  # what was loaded, not only what was asked
    batched = records(result)
    alone = records(generate(*common, "--batch-size", 1))
    model = LlamaModel.load(model_path, "int8")
    end_ids = Tokenizer.from_gguf(GGUFFile(model_path)).end_of_turn_ids
    for r, one in zip(batched, alone):
        assert r["token_ids"] and r["finish_reason"] in ("stop", "length")
        # Exact at its precision: speculation and batching change no token.
        assert r["token_ids"] == one["token_ids"] == greedy(model, r["prompt_token_ids"], 16, end_ids)


def test_int8_on_a_cpu_without_avx2_is_one_error_line(toy_model_file, monkeypatch):
    monkeypatch.setattr(int8.vec, "has_avx2", lambda: False)  # what such a CPU reports
    user_error(
        generate("--model", toy_model_file(**QUANTIZED), "--prompt", "hi", "--precision", "int8"),
        1,
        "AVX2",
        "--precision f32",
    )


def test_an_unknown_precision_is_a_usage_error_naming_the_choices(toy_model_path):
    user_error(
        generate("--model", toy_model_path, "--prompt", "hi", "--precision", "bogus"),
        2,
        "--precision",
        "'bogus'",
        "f32",
        "int8",
    )


# --- refusals -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_files(toy_model_file, toy_model_path, tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("bad")
    paths = {"missing": str(d / "missing.gguf")}
    with open(d / "random.gguf", "wb") as fh:
        fh.write(os.urandom(4096))
    paths["random"] = str(d / "random.gguf")
    data = open(toy_model_path, "rb").read()
    for name, size in (
        ("truncated_header", 100),
        ("truncated_half", len(data) // 2),
        ("truncated_end", len(data) - 64),
    ):
        with open(d / f"{name}.gguf", "wb") as fh:
            fh.write(data[:size])
        paths[name] = str(d / f"{name}.gguf")
    paths["gpt2"] = toy_model_file(architecture="gpt2")
    paths["iq2"] = toy_model_file(d_ffn=256, tensor_types={"blk.1.ffn_down.weight": "IQ2_XXS"})
    paths["other_vocab"] = toy_model_file(n_merges=40)
    paths["small_context"] = toy_model_file(context_length=32)
    # Hand-written metadata: a number given as text, no heads, heads that do not share.
    for name, heads, kv_heads, cap in (("text_number", 2, 2, "fifty"), ("no_heads", 0, 0, 50.0), ("heads", 3, 2, 50.0)):
        writer = gguf.GGUFWriter(str(d / f"{name}.gguf"), "gemma2")
        writer.add_block_count(1)
        writer.add_context_length(64)
        writer.add_embedding_length(8)
        writer.add_feed_forward_length(8)
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv_heads)
        if isinstance(cap, str):
            writer.add_string("gemma2.attn_logit_softcapping", cap)
        else:
            writer.add_attn_logit_softcapping(cap)
        writer.add_tensor("token_embd.weight", np.zeros((2, 8), np.float32))
        gguf_file.write_file(writer)
        paths[name] = str(d / f"{name}.gguf")
    return paths


@pytest.mark.parametrize(
    "model, fragment",
    [
        ("missing", "not found"),
        ("random", "GGUF"),
        ("truncated_header", "GGUF"),
        ("truncated_half", "GGUF"),
        ("truncated_end", "truncated"),
        ("gpt2", "'gpt2'"),
        ("iq2", "IQ2_XXS"),
        ("text_number", "'gemma2.attn_logit_softcapping' is 'fifty', not a number"),
        ("no_heads", "0 query heads"),
        ("heads", "3 query heads, 2 key/value heads"),
    ],
)
def test_a_bad_model_file_is_one_error_line(bad_files, model, fragment):
    line = user_error(generate("--model", bad_files[model], "--prompt", "hi"), 1, fragment)
    assert os.path.basename(bad_files[model]) in line


def test_a_draft_model_with_another_vocabulary_is_refused(toy_model_path, bad_files):
    result = generate(
        "--model", toy_model_path, "--proposer", "draft", "--draft-model", bad_files["other_vocab"], "--prompt", "hi"
    )
    user_error(result, 1, "vocabulary", os.path.basename(bad_files["other_vocab"]))


def test_a_missing_draft_model_file_is_refused(toy_model_path, bad_files):
    result = generate(
        "--model", toy_model_path, "--proposer", "draft", "--draft-model", bad_files["missing"], "--prompt", "hi"
    )
    user_error(result, 1, "draft model file not found", os.path.basename(bad_files["missing"]))


@pytest.mark.parametrize("proposer", ["medusa", "hybrid"])
def test_a_missing_heads_file_is_named_as_one(toy_model_path, bad_files, proposer):
    result = generate(
        "--model", toy_model_path, "--proposer", proposer, "--medusa-heads", bad_files["missing"], "--prompt", "hi"
    )
    user_error(result, 1, "heads file not found", os.path.basename(bad_files["missing"]))


@pytest.mark.parametrize(
    "proposer, flag",
    [("draft", "--draft-model"), ("medusa", "--medusa-heads")],
)
def test_a_proposer_without_its_file_is_refused(toy_model_path, proposer, flag):
    user_error(generate("--model", toy_model_path, "--proposer", proposer, "--prompt", "hi"), 1, flag)


def test_a_prompt_longer_than_the_context_is_refused(bad_files):
    result = generate("--model", bad_files["small_context"], "--prompt", "a long prompt " * 10)
    user_error(result, 1, "context", "32")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("--temperature", -1), "--temperature"),
        (("--temperature", "nan"), "--temperature"),
        (("--temperature", "inf"), "--temperature"),
        (("--temperature", "hot"), "--temperature"),
        (("--top-p", 0), "--top-p"),
        (("--top-p", 1.5), "--top-p"),
        (("--top-p", "nan"), "--top-p"),
        (("--top-k", -1), "--top-k"),
        (("--max-tokens", 0), "--max-tokens"),
        (("--max-tokens", -5), "--max-tokens"),
        (("--seed", -1), "--seed"),
        (("--k", 0), "--k"),
        (("--k", 65), "--k"),
        (("--proposer", "medusa2"), "--proposer"),
        (("--accept", "maybe"), "--accept"),
        (("--stop", ""), "--stop"),
        (tuple(x for i in range(9) for x in ("--stop", f"s{i}")), "--stop"),
    ],
)
def test_out_of_range_options_are_usage_errors(toy_model_path, args, fragment):
    user_error(generate("--model", toy_model_path, "--prompt", "hi", *args), 2, fragment)


def test_prompt_and_input_together_or_neither_are_usage_errors(toy_model_path, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", {"prompt": "a"})
    user_error(generate("--model", toy_model_path, "--prompt", "hi", "--input", path), 2, "--prompt", "--input")
    user_error(generate("--model", toy_model_path), 2, "--prompt", "--input")


def test_empty_prompt_is_a_usage_error(toy_model_path):
    user_error(generate("--model", toy_model_path, "--prompt", ""), 2, "--prompt")


def test_json_and_stream_together_are_a_usage_error(toy_model_path):
    user_error(generate("--model", toy_model_path, "--prompt", "hi", "--json", "--stream"), 2, "--stream", "--json")


def test_malformed_jsonl_names_the_file_and_line(toy_model_path, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", {"prompt": "a"}, {"prompt": "b"}, '{"prompt": "c",')
    user_error(generate("--model", toy_model_path, "--input", path), 1, "in.jsonl", "line 3", "JSON")


@pytest.mark.parametrize(
    "bad_line, fragments",
    [
        ({"prompt": "c", "max_tokens": 0}, ("line 3", "max_tokens")),
        ({"prompt": "c", "temperature": -1}, ("line 3", "temperature")),
        ({"prompt": "c", "colour": "red"}, ("line 3", "colour")),
        ({"custom_id": "x"}, ("line 3", "prompt")),
        ({"prompt": "c", "custom_id": "request-1"}, ("line 3", "line 1", "request-1")),
    ],
)
def test_an_invalid_line_stops_everything_before_generation(toy_model_path, tmp_path, bad_line, fragments):
    path = write_jsonl(tmp_path / "in.jsonl", {"prompt": "a"}, {"prompt": "b"}, bad_line)
    result = generate("--model", toy_model_path, "--input", path, "--json")
    user_error(result, 1, *fragments)
    assert "tokens/s" not in result.stderr


def test_a_request_too_long_for_the_context_stops_everything(bad_files, tmp_path):
    path = write_jsonl(
        tmp_path / "in.jsonl", {"prompt": "a"}, {"prompt": "b"}, {"custom_id": "long", "prompt": "a long prompt " * 10}
    )
    result = generate("--model", bad_files["small_context"], "--input", path, "--json")
    user_error(result, 1, "context", "line 3", "'long'")
    assert "tokens/s" not in result.stderr  # no request was decoded


@pytest.mark.parametrize(
    "content, fragment",
    [(b"", "no requests"), (b"\n  \n", "no requests"), ('{"prompt": "caf\u00e9"}\n'.encode("latin-1"), "UTF-8")],
)
def test_empty_or_undecodable_input_files_are_refused(toy_model_path, tmp_path, content, fragment):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    user_error(generate("--model", toy_model_path, "--input", str(path)), 1, fragment, "in.jsonl")


def test_a_missing_input_file_is_refused(toy_model_path, tmp_path):
    user_error(
        generate("--model", toy_model_path, "--input", str(tmp_path / "nope.jsonl")), 1, "not found", "nope.jsonl"
    )


# --- the real model -------------------------------------------------------------------


@pytest.mark.slow
def test_the_default_model_answers_a_question():
    result = generate("--prompt", "What is the capital of France?", "--max-tokens", 12, "--json")
    (line,) = lines(result)
    assert set(line) == LINE_KEYS and set(line["specq"]) == SPECQ_KEYS
    assert line["specq"]["worker"] == ""  # generated here, by no worker
    rec = one_record(result)
    assert rec["custom_id"] == "prompt"
    assert "Paris" in rec["text"]
    assert rec["finish_reason"] in ("stop", "length")
    assert 1 <= len(rec["token_ids"]) <= 12
    assert rec["usage"]["completion_tokens"] == len(rec["token_ids"])
    assert rec["usage"]["prompt_tokens"] == len(rec["prompt_token_ids"])
    assert rec["usage"]["total_tokens"] == len(rec["prompt_token_ids"]) + len(rec["token_ids"])
    assert rec["prompt_token_ids"][0] == 1  # <|im_start|>
    assert METRIC_KEYS <= set(rec["metrics"])
    assert math.isfinite(rec["metrics"]["tau"]) and rec["metrics"]["tau"] >= 1.0
    assert "SmolLM2" in result.stderr and "30 layers" in result.stderr


def test_batched_generation_prints_the_same_records_in_input_order(toy_model_path, tmp_path):
    lines = [{"custom_id": f"r{i}", "prompt": p, "max_tokens": 10 + 9 * i} for i, p in enumerate(LONG_PROMPTS * 2)]
    path = write_jsonl(tmp_path / "b.jsonl", *lines)
    common = ("--model", toy_model_path, "--input", path, "--json", "--temperature", "0.7", "--seed", "5")
    one = records(generate(*common, "--batch-size", 1))
    many = records(generate(*common, "--batch-size", 4))
    assert [r["custom_id"] for r in many] == [f"r{i}" for i in range(len(lines))]
    assert [r["token_ids"] for r in many] == [r["token_ids"] for r in one]


def test_a_kv_memory_budget_bounds_a_batch_and_refuses_a_request_too_big_for_it(toy_model_path, tmp_path):
    lines = [{"custom_id": f"r{i}", "prompt": p, "max_tokens": 10 + 9 * i} for i, p in enumerate(LONG_PROMPTS * 2)]
    path = write_jsonl(tmp_path / "b.jsonl", *lines)
    common = ("--model", toy_model_path, "--input", path, "--json", "--batch-size", 4)
    free = records(generate(*common))
    bounded = generate(*common, "--kv-memory", "40KiB")
    assert [r["token_ids"] for r in records(bounded)] == [r["token_ids"] for r in free]
    assert "note: --kv-memory 40.0 KiB holds as few as" in bounded.stderr and "--batch-size 4" in bounded.stderr
    assert "note: --kv-memory" not in generate(*common).stderr
    # r1's cache takes 48 positions (14.4 KiB at int16's 308 bytes a position on the toy
    # model: 224 for float16 keys and 8-bit values, 84 for the frozen keys and their
    # value scales), r2's 49, allocated as 56 (whole blocks of 8): 16.8 KiB.
    user_error(
        generate(*common, "--kv-memory", "15KiB"),
        1,
        "request 'r2' (line 3)",
        "(56 positions at 308 bytes)",
        "more than --kv-memory 15.0 KiB",
    )
    user_error(generate(*common, "--kv-memory", "lots"), 2, "'lots' is not a size")


def test_stream_refuses_a_batch(toy_model_path):
    user_error(generate("--model", toy_model_path, "--prompt", "hi", "--stream", "--batch-size", 2), 2, "--stream")


# --- hostile input (issue 13): one line each, never a traceback ----------------------

HOSTILE_LINES = [
    ('{"prompt": "a\\ud800"}', ("line 2", "'prompt'", "not valid Unicode")),
    ('{"messages": [{"role": "user", "content": "\\udc00"}]}', ("line 2", "'messages[0].content'", "Unicode")),
    ('{"prompt": "a", "stop": "\\ud800"}', ("line 2", "'stop'", "Unicode")),
    ('{"prompt": "a", "custom_id": "\\ud800"}', ("line 2", "'custom_id'", "Unicode")),
    ('{"prompt": "a", "seed": %s}' % ("7" * 5000), ("line 2", "'seed'", "5000 digits")),
    ("[" * 100_000, ("line 2", "nested too deeply")),
    ('{"prompt": "a", "custom_id": "two\\nlines"}', ("line 2", "'custom_id'", "control character")),
    ('{"prompt": "a", "temperature": 1000}', ("line 2", "'temperature'", "100")),
    ('{"prompt": "a", "top_k": 10000000}', ("line 2", "'top_k'", "1000000")),
]


@pytest.mark.parametrize("bad_line, fragments", HOSTILE_LINES, ids=[f[1] for _, f in HOSTILE_LINES])
def test_a_hostile_input_line_is_one_error_line(toy_model_path, tmp_path, bad_line, fragments):
    path = write_jsonl(tmp_path / "in.jsonl", {"prompt": "a"}, bad_line)
    result = generate("--model", toy_model_path, "--input", path, "--json")
    user_error(result, 1, "in.jsonl", *fragments)
    assert "tokens/s" not in result.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("--temperature", 100.5), "100"),
        (("--temperature", "1e308"), "100"),
        (("--top-k", 1_000_001), "1000000"),
        (("--top-k", 10**30), "1000000"),
    ],
)
def test_options_above_their_bound_are_usage_errors_that_say_the_bound(toy_model_path, args, fragment):
    user_error(generate("--model", toy_model_path, "--prompt", "hi", *args), 2, args[0], fragment)


@pytest.mark.slow
def test_a_huge_max_tokens_is_clipped_by_the_context(toy_model_file, tmp_path):
    # The key/value cache is sized for prompt + max_tokens, at most the context: a
    # huge max_tokens ends at the context, as a slightly too large one does.
    path = toy_model_file(context_length=32)
    rec = one_record(generate("--model", path, "--prompt", "a", "--raw-prompt", "--max-tokens", 10**12, "--json"))
    assert rec["finish_reason"] == "length" and rec["usage"]["total_tokens"] == 32
    lines = write_jsonl(tmp_path / "in.jsonl", {"prompt": "a", "max_tokens": 10**30})
    rec = one_record(generate("--model", path, "--input", lines, "--raw-prompt", "--json"))
    assert rec["finish_reason"] == "length" and rec["usage"]["total_tokens"] == 32


# --- ids and Redis URLs: refused in one line before anything connects ----------------


def cli(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("batch_id", ["abc\n", "-abc", "a" * 65, "a b"])
def test_submit_refuses_a_bad_batch_id_before_connecting(toy_model_path, tmp_path, batch_id):
    path = write_jsonl(tmp_path / "in.jsonl", {"prompt": "a"})
    result = cli(
        "submit", path, "--model", toy_model_path, "--batch-id", batch_id, "--redis-url", "redis://127.0.0.1:1/0"
    )
    user_error(result, 1, "batch id", repr(batch_id))


@pytest.mark.parametrize(
    "url",
    [
        "redis://:secret@[::1/0",  # urlsplit: "Invalid IPv6 URL"
        "redis://:secret@[::1]:99999/0",
        "redis://127.0.0.1:1/0?password=secret",
        "redis://127.0.0.1:1/0?db=0&password=secret",
        "redis://user:secret@127.0.0.1:1/0",
        "unix://:secret@/nonexistent/specq.sock",
        "unix:///nonexistent/specq.sock?password=secret",
        "http://:secret@example/",
        "redis://:secret\uff20@127.0.0.1:1/0",  # urlsplit's NFKC check quotes the netloc
    ],
)
def test_a_bad_or_unreachable_redis_url_is_one_line_without_the_password(url):
    line = user_error(cli("status", "--redis-url", url), 1, "Redis")
    assert "secret" not in line


def test_an_openai_batch_line_prints_the_batch_output_line(toy_model_path, tmp_path):
    path = write_jsonl(
        tmp_path / "batch.jsonl",
        {
            "custom_id": "t1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "smol", "messages": [{"role": "user", "content": "a"}], "max_tokens": 7},
        },
    )
    (line,) = lines(generate("--model", toy_model_path, "--input", path, "--json"))
    assert set(line) == {"id", "custom_id", "response", "error", "specq"} and line["error"] is None
    body = line["response"]["body"]
    assert line["response"]["status_code"] == 200 and body["object"] == "chat.completion" and body["model"] == "smol"
    assert (
        body["choices"][0]["message"]["content"]
        == (plain := one_record(generate("--model", toy_model_path, "--prompt", "a", "--max-tokens", 7, "--json")))[
            "text"
        ]
    )
    assert line["specq"]["token_ids"] == plain["token_ids"]
    assert body["usage"]["completion_tokens"] == len(plain["token_ids"]) == 7

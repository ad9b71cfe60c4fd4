"""Prompt files: every malformed line is refused with an InputError naming the line
and the field, before any work starts; valid lines become PromptSpecs, and
`to_request` turns them into GenerationRequests on a real (toy) tokenizer."""

from __future__ import annotations

import json

import pytest

from specq.errors import InputError, ParameterError
from specq.requests.ids import check_batch_id, check_request_id
from specq.requests.inputs import (
    MAX_STOP_STRINGS,
    GenerationDefaults,
    OptionError,
    PromptSpec,
    check_option,
    parse_jsonl,
    parse_jsonl_lenient,
    read_jsonl,
    to_request,
)
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.tokenizer import Tokenizer
from specq.testing import toy_gguf


def lines(*objs) -> list[str]:
    """JSONL lines: dicts and lists are dumped, strings are taken verbatim."""
    return [(o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs]


def refused(*objs) -> str:
    """The message of the InputError that parse_jsonl raises for these lines."""
    with pytest.raises(InputError) as excinfo:
        parse_jsonl(lines(*objs))
    return str(excinfo.value)


# --- valid lines ------------------------------------------------------------------


def test_prompt_and_messages_lines_parse():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    specs = parse_jsonl(
        lines(
            {
                "custom_id": "a",
                "prompt": "Hello",
                "max_tokens": 7,
                "temperature": 0.5,
                "top_p": 0.9,
                "top_k": 40,
                "seed": 11,
                "stop": ["\n", "END"],
            },
            {"custom_id": "b", "messages": messages},
        )
    )
    assert [s.custom_id for s in specs] == ["a", "b"]
    assert [s.line for s in specs] == [1, 2]
    a, b = specs
    assert a.prompt == "Hello" and a.messages is None
    assert a.overrides == {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 11,
        "stop": ("\n", "END"),
    }
    assert b.prompt is None
    assert b.messages == tuple(messages)
    assert b.overrides == {}


def test_a_single_stop_string_becomes_a_tuple():
    (spec,) = parse_jsonl(lines({"prompt": "x", "stop": "END"}))
    assert spec.overrides["stop"] == ("END",)


def test_boundary_values_are_accepted():
    (spec,) = parse_jsonl(
        lines(
            {
                "prompt": "x",
                "max_tokens": 1,
                "temperature": 0,
                "top_p": 1,
                "top_k": 0,
                "seed": 0,
                "stop": ["s"] * MAX_STOP_STRINGS,
            },
        )
    )
    assert spec.overrides["max_tokens"] == 1 and spec.overrides["top_p"] == 1
    assert len(spec.overrides["stop"]) == MAX_STOP_STRINGS
    (spec,) = parse_jsonl(lines({"prompt": "x", "seed": 2**63 - 1, "temperature": 2.5}))
    assert spec.overrides["seed"] == 2**63 - 1


def test_default_custom_id_is_request_and_the_line_number():
    specs = parse_jsonl(lines({"prompt": "a"}, "", {"prompt": "b"}, {"custom_id": "mine", "prompt": "c"}))
    # Blank lines are skipped but still counted, so ids match what an editor shows.
    assert [s.custom_id for s in specs] == ["request-1", "request-3", "mine"]
    assert [s.line for s in specs] == [1, 3, 4]


def test_duplicate_custom_id_names_both_lines():
    msg = refused({"custom_id": "x", "prompt": "a"}, {"prompt": "b"}, {"custom_id": "x", "prompt": "c"})
    assert "line 3" in msg and "line 1" in msg and "'x'" in msg


def test_explicit_id_colliding_with_a_default_id_is_refused():
    msg = refused({"prompt": "a"}, {"custom_id": "request-1", "prompt": "b"})
    assert "line 2" in msg and "line 1" in msg and "request-1" in msg


# --- malformed lines --------------------------------------------------------------


def test_malformed_json_names_the_line():
    msg = refused({"prompt": "ok"}, {"prompt": "ok too"}, '{"prompt": "broken"')
    assert "line 3" in msg and "JSON" in msg


def test_trailing_garbage_is_malformed():
    msg = refused('{"prompt": "a"} x')
    assert "line 1" in msg and "JSON" in msg


@pytest.mark.parametrize("value", ['[{"prompt": "a"}]', '"a string"', "3", "null", "true"])
def test_a_line_that_is_not_an_object_is_refused(value):
    msg = refused({"prompt": "ok"}, value)
    assert "line 2" in msg and "object" in msg


def test_unknown_field_is_named():
    msg = refused({"prompt": "a", "max_token": 5})
    assert "line 1" in msg and "'max_token'" in msg


def test_missing_prompt_and_messages():
    msg = refused({"custom_id": "a", "max_tokens": 3})
    assert "line 1" in msg and "prompt" in msg and "messages" in msg


def test_both_prompt_and_messages():
    msg = refused({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})
    assert "line 1" in msg and "prompt" in msg and "messages" in msg


@pytest.mark.parametrize(
    "line, field",
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a"]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"messages": "Hi"}, "messages"),
        ({"messages": {"role": "user", "content": "Hi"}}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["Hi"]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}, "messages[1].role"),
        ({"messages": [{"content": "b"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "a", "name": "bob"}]}, "'name'"),
        ({"prompt": "a", "custom_id": 7}, "custom_id"),
        ({"prompt": "a", "custom_id": ""}, "custom_id"),
    ],
)
def test_wrong_types_name_the_line_and_field(line, field):
    msg = refused({"prompt": "fine"}, line)
    assert "line 2" in msg
    assert field in msg


@pytest.mark.parametrize(
    "name, value",
    [
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("max_tokens", 1.5),
        ("max_tokens", 2.0),
        ("max_tokens", True),
        ("max_tokens", "10"),
        ("max_tokens", None),
        ("temperature", -1),
        ("temperature", "hot"),
        ("temperature", True),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("top_k", -1),
        ("top_k", 2.5),
        ("seed", -1),
        ("seed", 2**63),
        ("seed", 1.0),
        ("stop", ["ok", 3]),
        ("stop", [""]),
        ("stop", ""),
        ("stop", 5),
        ("stop", {"a": 1}),
        ("stop", ["s"] * (MAX_STOP_STRINGS + 1)),
    ],
)
def test_absurd_option_values_are_refused(name, value):
    msg = refused({"prompt": "fine"}, {"prompt": "x", name: value})
    assert "line 2" in msg
    assert f"'{name}'" in msg


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("name", ["temperature", "top_p"])
def test_non_finite_numbers_that_python_json_accepts_are_refused(name, literal):
    # Python's json module parses NaN and Infinity although strict JSON has neither.
    msg = refused(f'{{"prompt": "x", "{name}": {literal}}}')
    assert "line 1" in msg and f"'{name}'" in msg


def test_too_many_stop_strings_says_how_many():
    msg = refused({"prompt": "x", "stop": [str(i) for i in range(MAX_STOP_STRINGS + 1)]})
    assert "line 1" in msg and "'stop'" in msg
    assert str(MAX_STOP_STRINGS + 1) in msg and str(MAX_STOP_STRINGS) in msg


def test_the_first_bad_line_is_reported():
    msg = refused({"prompt": "a"}, {"prompt": "b", "top_k": -1}, "{not json")
    assert "line 2" in msg and "top_k" in msg
    assert "line 3" not in msg


# --- files ------------------------------------------------------------------------


def test_read_jsonl_reads_a_file_and_names_it_in_errors(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b", "custom_id": "two"}\n', encoding="utf-8")
    specs = read_jsonl(str(path))
    assert [(s.custom_id, s.prompt) for s in specs] == [("request-1", "a"), ("two", "b")]
    path.write_text('{"prompt": "a"}\n{"prompt": "b", "colour": "red"}\n', encoding="utf-8")
    with pytest.raises(InputError) as excinfo:
        read_jsonl(str(path))
    msg = str(excinfo.value)
    assert str(path) in msg and "line 2" in msg and "'colour'" in msg


def test_read_jsonl_accepts_non_ascii_and_crlf(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes('{"prompt": "Größe? 東京"}\r\n\r\n{"prompt": "b"}\r\n'.encode())
    specs = read_jsonl(str(path))
    assert [s.prompt for s in specs] == ["Größe? 東京", "b"]
    assert [s.custom_id for s in specs] == ["request-1", "request-3"]


@pytest.mark.parametrize("content", ["", "\n", "   \n\t\n  \n"])
def test_empty_or_whitespace_only_file_is_refused(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as excinfo:
        read_jsonl(str(path))
    msg = str(excinfo.value)
    assert str(path) in msg and "no requests" in msg


def test_empty_lines_list_is_refused():
    with pytest.raises(InputError, match="no requests"):
        parse_jsonl([])


def test_non_utf8_file_is_refused(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"prompt": "a"}\n{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(InputError) as excinfo:
        read_jsonl(str(path))
    msg = str(excinfo.value)
    assert str(path) in msg and "UTF-8" in msg


def test_binary_file_is_refused(tmp_path):
    path = tmp_path / "random.jsonl"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError) as excinfo:
        read_jsonl(str(path))
    assert str(path) in str(excinfo.value)


def test_missing_file_is_refused(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(InputError) as excinfo:
        read_jsonl(str(path))
    assert "not found" in str(excinfo.value) and str(path) in str(excinfo.value)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(InputError):
        read_jsonl(str(tmp_path))


# --- to_request on the toy tokenizer ------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(toy_model_path) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(toy_model_path))


def test_to_request_uses_defaults_without_overrides(tokenizer):
    defaults = GenerationDefaults(
        max_tokens=9, temperature=0.7, top_p=0.8, top_k=5, seed=42, stop=("END",), accept="sample", k=3
    )
    req = to_request(PromptSpec(custom_id="a", line=1, prompt="hello"), tokenizer, defaults)
    assert req.max_tokens == 9
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.top_k, req.sampling.seed) == (0.7, 0.8, 5, 42)
    assert req.stop == ("END",)
    assert req.accept == "sample" and req.k == 3


def test_to_request_overrides_win_over_defaults(tokenizer):
    defaults = GenerationDefaults(max_tokens=9, temperature=0.7, top_p=0.8, top_k=5, seed=42, stop=("END",))
    (spec,) = parse_jsonl(
        lines({"prompt": "hello", "max_tokens": 3, "temperature": 0, "top_p": 0.5, "top_k": 2, "seed": 7, "stop": "!"})
    )
    req = to_request(spec, tokenizer, defaults)
    assert req.max_tokens == 3
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.top_k, req.sampling.seed) == (0.0, 0.5, 2, 7)
    assert req.stop == ("!",)
    # Integer JSON values for float options become floats.
    assert isinstance(req.sampling.temperature, float) and isinstance(req.sampling.top_p, float)


def test_a_prompt_goes_through_the_chat_template_unless_raw(tokenizer):
    spec = PromptSpec(custom_id="a", line=1, prompt="hello")
    chat = to_request(spec, tokenizer, GenerationDefaults()).prompt_ids
    raw = to_request(spec, tokenizer, GenerationDefaults(raw_prompt=True)).prompt_ids
    assert chat[0] == toy_gguf.BOS_ID  # <|im_start|>
    assert list(chat) == tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    assert list(raw) == tokenizer.encode("hello")
    assert raw[0] != toy_gguf.BOS_ID
    assert toy_gguf.EOS_ID not in raw


def test_messages_use_the_chat_template_even_with_raw_prompt(tokenizer):
    messages = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"})
    spec = PromptSpec(custom_id="a", line=1, messages=messages)
    want = tokenizer.encode("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")
    assert list(to_request(spec, tokenizer, GenerationDefaults()).prompt_ids) == want
    assert list(to_request(spec, tokenizer, GenerationDefaults(raw_prompt=True)).prompt_ids) == want


def test_to_request_errors_name_the_request_and_line(tokenizer):
    spec = PromptSpec(custom_id="bad", line=4, prompt="hello")
    with pytest.raises(Exception) as excinfo:
        to_request(spec, tokenizer, GenerationDefaults(stop=("",)))
    assert "'bad'" in str(excinfo.value) and "line 4" in str(excinfo.value)


# --- hostile lines (issue 13): one-line errors naming the line and field, never a crash


def openai_line(custom_id="o", content="Hi", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": content}], **body},
    }


# JSON's \ud800 escape decodes to a lone surrogate: a str Python holds but cannot
# encode, so it crashed the tokenizer, the JSON output and Redis.
LONE_SURROGATE_LINES = [
    ('{"prompt": "a\\ud800b"}', "prompt"),
    ('{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages[0].content"),
    ('{"prompt": "a", "stop": ["ok", "\\ud800"]}', "stop[1]"),
    ('{"prompt": "a", "stop": "\\ud800"}', "stop"),
    ('{"prompt": "a", "custom_id": "x\\ud800"}', "custom_id"),
    ('{"prompt": "a", "category": "\\uDBFF"}', "category"),
    (json.dumps(openai_line(content="\ud800")), "body.messages[0].content"),
    (json.dumps(openai_line(custom_id="\ud800")), "custom_id"),
]


@pytest.mark.parametrize("line, field", LONE_SURROGATE_LINES)
def test_a_lone_surrogate_is_refused_naming_the_field(line, field):
    msg = refused({"prompt": "fine"}, line)
    assert msg == f"line 2: field {field!r} is not valid Unicode (lone surrogate)"
    msg.encode("utf-8")  # the message itself can be printed


def test_a_valid_surrogate_pair_escape_is_accepted():
    (spec,) = parse_jsonl(lines('{"prompt": "\\ud83d\\ude00", "stop": "\\ud83d\\ude00"}'))
    assert spec.prompt == "\U0001f600" and spec.overrides["stop"] == ("\U0001f600",)


@pytest.mark.parametrize("name", ["seed", "max_tokens", "top_k", "temperature", "custom_id"])
def test_an_integer_with_thousands_of_digits_is_refused_naming_the_field(name):
    # Python refuses to convert integer strings of more than 4300 digits (a ValueError
    # that json.loads let escape).
    msg = refused(f'{{"prompt": "a", "{name}": {"9" * 5000}}}')
    assert msg.startswith("line 1: ") and f"'{name}'" in msg and "5000 digits" in msg
    assert len(msg) < 200


def test_an_integer_with_thousands_of_digits_in_an_openai_body_is_refused():
    line = json.dumps(openai_line()).replace('"Hi"}]', '"Hi"}], "seed": ' + "1" * 5000)
    msg = refused(line)
    assert msg.startswith("line 1: ") and "'seed'" in msg and "5000 digits" in msg


@pytest.mark.parametrize("line", ["[" * 100_000, '{"prompt": ' + "[" * 100_000, "[" * 100_000 + "]" * 100_000])
def test_json_nested_too_deeply_is_refused(line):
    msg = refused({"prompt": "fine"}, line)
    assert msg.startswith("line 2: ") and "nested too deeply" in msg


def test_deep_nesting_that_json_accepts_is_a_field_error():
    msg = refused('{"prompt": "a", "stop": ' + "[" * 500 + "]" * 500 + "}")
    assert msg.startswith("line 1: ") and "'stop'" in msg


def test_hostile_lines_become_invalid_lines_and_the_rest_goes_ahead():
    hostile = [line for line, _ in LONE_SURROGATE_LINES] + [
        '{"prompt": "a", "seed": %s}' % ("9" * 5000),
        "[" * 100_000,
        {"prompt": "a", "custom_id": "abc\n"},
        {"prompt": "a", "custom_id": "x" * 257},
    ]
    specs, invalid = parse_jsonl_lenient(lines({"prompt": "ok", "custom_id": "good"}, *hostile))
    assert [s.custom_id for s in specs] == ["good"]
    assert [bad.line for bad in invalid] == list(range(2, len(hostile) + 2))
    for bad in invalid:
        assert bad.message.startswith(f"line {bad.line}: ")
        bad.message.encode("utf-8")
    # Only a valid id is kept (the OpenAI line with a bad content); one that breaks the
    # rule would become a Redis field and an output value.
    assert {bad.line: bad.custom_id for bad in invalid if bad.custom_id is not None} == {8: "o"}


# --- request ids and batch ids --------------------------------------------------------


@pytest.mark.parametrize(
    "custom_id, fragment",
    [
        ("abc\n", "control character"),
        ("a\x00b", "control character"),
        ("tab\there", "control character"),
        ("del\x7f", "control character"),
        ("\r", "control character"),
        ("x" * 257, "256"),
        ("", "non-empty"),
    ],
)
@pytest.mark.parametrize("openai", [False, True], ids=["plain", "openai"])
def test_a_bad_custom_id_is_refused_naming_the_line_and_field(custom_id, fragment, openai):
    line = openai_line(custom_id=custom_id) if openai else {"prompt": "a", "custom_id": custom_id}
    msg = refused({"prompt": "fine"}, line)
    assert msg.startswith("line 2: field 'custom_id' ") and fragment in msg
    assert "\n" not in msg and len(msg) < 200  # one line, the value shown escaped and cut short


@pytest.mark.parametrize("custom_id", ["x" * 256, "a b", "Größe-東京-✓", "nightly:req.17", "1"])
def test_custom_ids_within_the_rule_are_accepted(custom_id):
    for line in ({"prompt": "a", "custom_id": custom_id}, openai_line(custom_id=custom_id)):
        (spec,) = parse_jsonl(lines(line))
        assert spec.custom_id == custom_id


@pytest.mark.parametrize("custom_id", ["abc\n", "", "x" * 257, "\ud800", 7, None])
def test_check_request_id_refuses_what_lines_refuse(custom_id):
    with pytest.raises(ParameterError) as excinfo:
        check_request_id(custom_id)
    assert "request id" in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_check_request_id_returns_a_valid_id():
    assert check_request_id("req-17") == "req-17"


@pytest.mark.parametrize("batch_id", ["abc\n", "abc\n\n", "", "-a", ".a", "a" * 65, "a b", "a/b", "a:b", "é"])
def test_check_batch_id_refuses_ids_outside_the_rule(batch_id):
    with pytest.raises(ParameterError) as excinfo:
        check_batch_id(batch_id)
    assert repr(batch_id) in str(excinfo.value)


@pytest.mark.parametrize("batch_id", ["a", "nightly", "b2026.12.01", "x_y-z", "9" + "a" * 63])
def test_check_batch_id_accepts_ids_within_the_rule(batch_id):
    assert check_batch_id(batch_id) == batch_id


# --- bounds on numeric options --------------------------------------------------------


@pytest.mark.parametrize(
    "name, value, bound",
    [
        ("temperature", 100.5, "100"),
        ("temperature", 1e308, "100"),
        ("top_k", 1_000_001, "1000000"),
        ("top_k", 10**30, "1000000"),
    ],
)
def test_numeric_options_above_their_bound_are_refused_saying_so(name, value, bound):
    with pytest.raises(OptionError) as excinfo:
        check_option(name, value)
    assert bound in str(excinfo.value)
    msg = refused({"prompt": "x", name: value})
    assert "line 1" in msg and f"'{name}'" in msg and bound in msg


@pytest.mark.parametrize("name, value", [("temperature", 100), ("temperature", 100.0), ("top_k", 1_000_000)])
def test_numeric_options_at_their_bound_are_accepted(name, value):
    assert check_option(name, value) == value


# --- the OpenAI completions endpoint ------------------------------------------------


def completions_line(custom_id="c", prompt="Once upon a time", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {"prompt": prompt, **body}}


def test_a_completions_line_is_a_raw_prompt(tokenizer):
    (spec,) = parse_jsonl(lines(completions_line(max_tokens=5, model="m")))
    assert spec.endpoint == "/v1/completions" and spec.openai and spec.prompt == "Once upon a time"
    assert spec.messages is None and spec.model == "m" and spec.overrides == {"max_tokens": 5}
    request = to_request(spec, tokenizer, GenerationDefaults())
    # No chat template: the prompt's own tokens, as OpenAI's completions API takes it.
    assert list(request.prompt_ids) == tokenizer.encode("Once upon a time")
    (chat,) = parse_jsonl(lines(openai_line(content="Once upon a time")))
    assert chat.endpoint == "/v1/chat/completions"
    assert list(to_request(chat, tokenizer, GenerationDefaults()).prompt_ids) != list(request.prompt_ids)


@pytest.mark.parametrize(
    "line, fragment",
    [
        (completions_line(prompt=["a", "b"]), "'prompt' must be a non-empty string"),
        (completions_line(prompt=""), "'prompt' must be a non-empty string"),
        ({**completions_line(), "body": {"messages": [{"role": "user", "content": "x"}]}}, "needs 'prompt'"),
        (openai_line(prompt="x"), "needs 'messages' (and no 'prompt')"),
        ({**completions_line(), "url": "/v1/embeddings"}, "'url' must be one of"),
    ],
)
def test_a_line_that_does_not_fit_its_endpoint_is_refused(line, fragment):
    assert fragment in refused(line)

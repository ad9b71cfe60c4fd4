"""Prompt files: JSONL lines with `prompt` or `messages`, or OpenAI Batch request
lines, validated as a whole before any work starts, with errors that name the line
and the field."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from specq.errors import InputError, SpecqError
from specq.requests.ids import is_valid_unicode, request_id_fault, shown
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import GenerationRequest
from specq.specdec.tokenizer import Tokenizer

OVERRIDE_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")
# "category" is a free label (the benchmark groups results by it); generation ignores it.
KNOWN_FIELDS = frozenset({"custom_id", "category", "prompt", "messages", *OVERRIDE_FIELDS})
ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 8
MAX_LINE_CHARS = 1_000_000  # a line larger than this is a mistake, not a prompt
# At 100 the softmax of any model's logits is all but uniform; more is a typo.
MAX_TEMPERATURE = 100
# Above the vocabulary top_k restricts nothing, so a larger value is meaningless.
MAX_TOP_K = 1_000_000

# The OpenAI Batch request line: {"custom_id", "method": "POST", "url":
# "/v1/chat/completions", "body": {...}}. Body fields outside these would change the
# meaning of the request (tools, n > 1, logprobs), so they are refused, not ignored.
CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"  # a raw prompt, no chat template, as OpenAI's completions API
OPENAI_URLS = (CHAT_URL, COMPLETIONS_URL)
OPENAI_LINE_FIELDS = frozenset({"custom_id", "method", "url", "body"})
OPENAI_BODY_FIELDS = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "n",
        "stream",
        "user",
    }
)


# Makes the error for a line: raise fail("what is wrong").
Fail = Callable[[str], InputError]


@dataclass(frozen=True)
class PromptSpec:
    """One request as the user wrote it: exactly one of `prompt` and `messages`, plus
    per-request overrides of the batch's generation options."""

    custom_id: str
    line: int
    category: str = ""
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    # An OpenAI Batch line's url (results come back in that API's shape); "" for a plain line.
    endpoint: str = ""
    model: str = ""  # the OpenAI body's "model", echoed in the result

    @property
    def openai(self) -> bool:
        return bool(self.endpoint)


@dataclass(frozen=True)
class InvalidLine:
    line: int
    custom_id: str | None
    message: str


def parse_line(obj: Any, line: int, where: str) -> PromptSpec:
    def fail(msg: str) -> InputError:
        return InputError(f"{where}line {line}: {msg}")

    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object, got {type(obj).__name__}")
    bad_text = lone_surrogate_path(obj)
    if bad_text is not None:
        raise fail(f"field {bad_text!r} is not valid Unicode (lone surrogate)")
    if "body" in obj or "url" in obj or "method" in obj:
        return parse_openai_line(obj, line, fail)
    unknown = sorted(set(obj) - KNOWN_FIELDS)
    if unknown:
        raise fail(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(KNOWN_FIELDS))})")
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise fail("needs exactly one of 'prompt' and 'messages'")
    prompt = messages = None
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise fail("field 'prompt' must be a non-empty string")
    else:
        messages = check_messages(obj["messages"], fail)
    custom_id = check_custom_id(obj.get("custom_id", f"request-{line}"), fail)
    category = obj.get("category", "")
    if not isinstance(category, str):
        raise fail("field 'category' must be a string")
    overrides = {}
    for name in OVERRIDE_FIELDS:
        if name in obj:
            try:
                overrides[name] = check_option(name, obj[name])
            except OptionError as exc:
                raise fail(f"field {name!r} {exc}") from None
    return PromptSpec(
        custom_id=custom_id, line=line, category=category, prompt=prompt, messages=messages, overrides=overrides
    )


def parse_openai_line(obj: dict, line: int, fail: Fail) -> PromptSpec:
    unknown = sorted(set(obj) - OPENAI_LINE_FIELDS)
    if unknown:
        raise fail(
            f"unknown field {unknown[0]!r} in an OpenAI Batch line (known: {', '.join(sorted(OPENAI_LINE_FIELDS))})"
        )
    custom_id = check_custom_id(obj.get("custom_id"), fail, " (required in an OpenAI Batch line)")
    if obj.get("method") != "POST":
        raise fail(f"field 'method' must be \"POST\", got {obj.get('method')!r}")
    url = obj.get("url")
    if url not in OPENAI_URLS:
        raise fail(f"field 'url' must be one of {', '.join(map(repr, OPENAI_URLS))}, got {url!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise fail("field 'body' must be an object")
    unknown = sorted(set(body) - OPENAI_BODY_FIELDS)
    if unknown:
        raise fail(f"body field {unknown[0]!r} is not supported (supported: {', '.join(sorted(OPENAI_BODY_FIELDS))})")
    if body.get("n", 1) != 1:
        raise fail(f"body field 'n' must be 1, got {body.get('n')!r}")
    if body.get("stream", False) is not False:
        raise fail("body field 'stream' must be false in a batch")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise fail("body field 'model' must be a string")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise fail("body has both 'max_tokens' and 'max_completion_tokens'; give one")
    messages, prompt = None, None
    if url == CHAT_URL:
        if "messages" not in body or "prompt" in body:
            raise fail(f"a {CHAT_URL} body needs 'messages' (and no 'prompt')")
        messages = check_messages(body["messages"], lambda msg: fail("body " + msg))
    else:
        if "prompt" not in body or "messages" in body:
            raise fail(f"a {COMPLETIONS_URL} body needs 'prompt' (and no 'messages')")
        prompt = body["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise fail("body field 'prompt' must be a non-empty string (one prompt a line)")
    overrides = {}
    for source, name in (
        ("max_tokens", "max_tokens"),
        ("max_completion_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("seed", "seed"),
        ("stop", "stop"),
    ):
        if source in body and body[source] is not None:
            try:
                overrides[name] = check_option(name, body[source])
            except OptionError as exc:
                raise fail(f"body field {source!r} {exc}") from None
    return PromptSpec(
        custom_id=custom_id, line=line, prompt=prompt, messages=messages, overrides=overrides, endpoint=url, model=model
    )


def check_custom_id(custom_id: Any, fail: Fail, note: str = "") -> str:
    """The request id, if it follows the rule of specq.requests.ids."""
    fault = request_id_fault(custom_id)
    if fault:
        raise fail(f"field 'custom_id' {fault}{note}, got {shown(custom_id)}")
    return custom_id


def lone_surrogate_path(obj: Any) -> str | None:
    """Where in a parsed line ("messages[0].content", a value or a field name) the
    first string holding a lone surrogate is; None if none does. Iterative, since
    json.loads accepts nesting deeper than a recursive walk would survive."""
    pending: list[tuple[str, Any]] = [("", obj)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            if not is_valid_unicode(value):
                return path
        elif isinstance(value, dict):
            children = [(f"{path}.{key}" if path else key, item) for key, item in value.items()]
            for child, _ in children:
                if not is_valid_unicode(child):
                    return child
            pending.extend(reversed(children))  # reversed: popped in the line's order
        elif isinstance(value, list):
            pending.extend(reversed([(f"{path}[{i}]", item) for i, item in enumerate(value)]))
    return None


def check_messages(messages: Any, fail: Fail) -> tuple[dict[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise fail("field 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise fail(f"messages[{i}] must be an object with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise fail(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise fail(f"messages[{i}].content must be a string")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise fail(f"messages[{i}] has unknown field {extra[0]!r}")
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)


class OptionError(ValueError):
    """A generation option out of range; the message completes "<option> ..."."""


def check_option(name: str, value: Any) -> Any:
    """Validate one generation option's type and range (shared by lines and flags);
    returns the value in canonical form (stop strings as a tuple)."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_num = is_int or (isinstance(value, float) and math.isfinite(value))
    if name == "max_tokens" and not (is_int and value >= 1):
        raise OptionError(f"must be an integer >= 1, got {value!r}")
    if name == "temperature" and not (is_num and 0 <= value <= MAX_TEMPERATURE):
        raise OptionError(f"must be a finite number in [0, {MAX_TEMPERATURE}], got {value!r}")
    if name == "top_p" and not (is_num and 0 < value <= 1):
        raise OptionError(f"must be a number in (0, 1], got {value!r}")
    if name == "top_k" and not (is_int and 0 <= value <= MAX_TOP_K):
        raise OptionError(f"must be an integer in [0, {MAX_TOP_K}] (0: no limit), got {value!r}")
    if name == "seed" and not (is_int and 0 <= value < 2**63):
        raise OptionError(f"must be an integer in [0, 2^63), got {value!r}")
    if name == "stop":
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
            raise OptionError("must be a non-empty string or a list of them")
        if len(stops) > MAX_STOP_STRINGS:
            raise OptionError(f"has {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed")
        return tuple(stops)
    return value


def parse_jsonl(lines: Iterable[str], where: str = "") -> list[PromptSpec]:
    """Every line parsed and checked; the first fault raises InputError naming it.
    Blank lines are skipped; custom_id must be unique."""
    specs, invalid = parse_jsonl_lenient(lines, where)
    if invalid:
        raise InputError(invalid[0].message)
    if not specs:
        raise InputError(f"{where.rstrip(': ') or 'input'}: no requests (the file is empty)")
    return specs


def parse_jsonl_lenient(lines: Iterable[str], where: str = "") -> tuple[list[PromptSpec], list[InvalidLine]]:
    """The valid requests and, in line order, every invalid line with its reason."""
    specs: list[PromptSpec] = []
    invalid: list[InvalidLine] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        obj = None
        try:
            if len(raw) > MAX_LINE_CHARS:
                raise InputError(f"{where}line {number}: longer than {MAX_LINE_CHARS} characters")
            obj = _loads(raw, f"{where}line {number}")
            spec = parse_line(obj, number, where)
            if spec.custom_id in seen:
                raise InputError(
                    f"{where}line {number}: custom_id {spec.custom_id!r} repeats line {seen[spec.custom_id]}"
                )
        except InputError as exc:
            custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
            # Only an id within the rule is kept: it becomes a Redis field and an output value.
            invalid.append(InvalidLine(number, custom_id if request_id_fault(custom_id) is None else None, str(exc)))
            continue
        seen[spec.custom_id] = number
        specs.append(spec)
    return specs, invalid


class HugeInteger:
    """An integer literal with more digits than Python converts (4300 by default,
    sys.get_int_max_str_digits): parsed as this marker, so the field that holds it
    is refused by name like any other wrong value."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _json_int(text: str) -> int | HugeInteger:
    try:
        return int(text)
    except ValueError:  # the digit limit; json only hands over well-formed integers
        return HugeInteger(len(text.lstrip("-")))


def _loads(raw: str, where_line: str) -> Any:
    try:
        return json.loads(raw, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where_line}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        # json.loads descends one C call per "[" or "{" and stops at Python's
        # recursion limit; no request nests that deep.
        raise InputError(f"{where_line}: JSON nested too deeply") from None


def read_jsonl(path: str) -> list[PromptSpec]:
    return parse_jsonl(_read_lines(path), where=f"{path}: ")


def read_jsonl_lenient(path: str) -> tuple[list[PromptSpec], list[InvalidLine]]:
    return parse_jsonl_lenient(_read_lines(path), where=f"{path}: ")


def _read_lines(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise InputError(f"input file not found: {path}")
    try:
        with open(path, encoding="utf-8-sig") as fh:  # tolerate a byte-order mark
            return fh.readlines()
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 text file") from None


@dataclass(frozen=True)
class GenerationDefaults:
    """Batch-wide options; a line's own fields override them."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    accept: str = "auto"
    k: int = 4  # measured best, with the adaptive length, on the default model (docs/performance.md)
    adaptive: bool = True
    raw_prompt: bool = False  # feed `prompt` as-is instead of as a user chat message


def to_request(spec: PromptSpec, tokenizer: Tokenizer, defaults: GenerationDefaults) -> GenerationRequest:
    """Tokenize one request: `messages` through the model's chat template; `prompt`
    as a single user message (or verbatim with raw_prompt)."""
    opts = {name: spec.overrides.get(name, getattr(defaults, name)) for name in OVERRIDE_FIELDS}
    if spec.messages is not None:
        prompt_ids = tokenizer.encode_chat(list(spec.messages))
    elif defaults.raw_prompt or spec.endpoint == COMPLETIONS_URL:
        prompt_ids = tokenizer.encode(spec.prompt)
    else:
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": spec.prompt}])
    try:
        return GenerationRequest(
            prompt_ids=tuple(prompt_ids),
            max_tokens=opts["max_tokens"],
            sampling=SamplingParams(
                temperature=float(opts["temperature"]),
                top_k=opts["top_k"],
                top_p=float(opts["top_p"]),
                seed=opts["seed"],
            ),
            accept=defaults.accept,
            stop=tuple(opts["stop"]),
            k=defaults.k,
            adaptive=defaults.adaptive,
        )
    except SpecqError as exc:
        raise type(exc)(f"request {spec.custom_id!r} (line {spec.line}): {exc}") from None

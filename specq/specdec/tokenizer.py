"""The tokenizer and chat template of a GGUF file.

Two kinds of vocabulary. Byte-level BPE (`tokenizer.ggml.model = gpt2`: SmolLM2,
Llama 3, Qwen): encoding is HuggingFace `tokenizers` (a BPE model built from the
vocabulary and merges), set up to split text the way llama.cpp does for the file's
`tokenizer.ggml.pre`. SentencePiece-style BPE by scores (`llama`: Llama 2, Mistral,
TinyLlama, Gemma): spm.py, with the special tokens split out here. Decoding is done here on
bytes for both: every token stands for a fixed byte string, so `decode` and
`StreamDecoder` agree by construction.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from specq.errors import InputError, ModelFileError
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.spm import SPACE, SpmEncoder

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

END_OF_TURN_NAMES = frozenset({"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>"})
ROLES = ("system", "user", "assistant")

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_LLAMA3 split, as in Llama 3's tokenizer.json.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PRE = ("llama-bpe", "llama3")
# llama.cpp's "qwen2": llama 3's regex with every digit alone.
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")

# Used when the file carries no template: `<|im_start|>{role}\n{content}<|im_end|>\n`.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (openai/gpt-2
    encoder.py): printable Latin-1 bytes stand for themselves, the other 68 bytes
    for U+0100 onwards (so space is 'Ġ' and newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


_UNICODE_TO_BYTE = {c: b for b, c in _gpt2_byte_to_unicode().items()}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """Pre-tokenization for llama.cpp's pre-tokenizer name. Names not listed here get
    GPT-2's regex, which is also llama.cpp's default for BPE vocabularies."""
    if pre == "smollm":  # llama.cpp: "\p{N}" (every digit alone), then the GPT-2 regex
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre == "qwen2":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre in LLAMA3_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _token_bytes(text: str, token_type: int, spm: bool = False) -> bytes:
    """The bytes a token contributes to decoded output (b"" for control tokens)."""
    if token_type in (CONTROL, UNKNOWN, UNUSED):
        return b""
    if token_type == USER_DEFINED:  # stored as plain text, not byte-level encoded
        return text.encode("utf-8")
    if token_type == BYTE and (m := _BYTE_TOKEN.fullmatch(text)):
        return bytes([int(m.group(1), 16)])
    if spm:  # plain text with spaces written as U+2581
        return text.replace(SPACE, " ").encode("utf-8")
    # A character outside GPT-2's table cannot come from a byte-level vocabulary;
    # keep it as its own UTF-8 rather than fail on an odd file.
    return b"".join(bytes([_UNICODE_TO_BYTE[c]]) if c in _UNICODE_TO_BYTE else c.encode("utf-8") for c in text)


def _merge_pair(merge: str, vocab: dict[str, int]) -> tuple[str, str]:
    """("Ġ", "t") for "Ġ t". Checked here because tokenizers panics (a BaseException,
    not an Exception) on a merge whose parts or result are not in the vocabulary."""
    cut = merge.find(" ", 1)  # from 1, as llama.cpp does, so a token " " still parses
    left, right = merge[:cut], merge[cut + 1 :]
    if cut < 0 or left not in vocab or right not in vocab or left + right not in vocab:
        raise ModelFileError(f"BPE merge {merge!r} does not fit the vocabulary")
    return left, right


class StreamDecoder:
    """Incremental decoding of one sequence of token ids.

    The concatenation of every `push` result and the final `flush` equals
    `Tokenizer.decode` of all the ids pushed. A UTF-8 character split across tokens
    is held back until the token completing it arrives, so `push` never returns half
    a character as U+FFFD; bytes that can never form a character become U+FFFD as
    soon as that is certain.
    """

    def __init__(self, token_bytes: tuple[bytes, ...], strip_space: bool = False) -> None:
        self._token_bytes = token_bytes
        # Python's incremental UTF-8 decoder does exactly the holding back, and with
        # errors="replace" yields what a one-shot bytes.decode would, piece by piece.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = strip_space  # until the first character: Tokenizer.decode's rule

    def push(self, ids: Sequence[int]) -> str:
        return self._stripped(self._utf8.decode(b"".join(self._token_bytes[i] for i in ids)))

    def flush(self) -> str:
        return self._stripped(self._utf8.decode(b"", final=True))

    def _stripped(self, text: str) -> str:
        if self._strip_space and text:
            self._strip_space = False
            return text[1:] if text[0] == " " else text
        return text


class Tokenizer:
    """A GGUF vocabulary (`gpt2` byte-level BPE, or `llama` SentencePiece-style BPE by
    scores), its special tokens and chat template."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        *,
        pre: str,
        bos_id: int | None,
        eos_id: int | None,
        add_bos: bool,
        chat_template: str | None,
        scores: Sequence[float] | None = None,
        unknown_id: int | None = None,
        add_space_prefix: bool = True,
    ) -> None:
        """scores: the `llama` model's piece scores (merges then unused); None for `gpt2`."""
        self._tokens = tuple(tokens)
        self.vocab_size = len(self._tokens)
        self.bos_id, self.eos_id, self._add_bos = bos_id, eos_id, add_bos
        self.end_of_turn_ids = frozenset(
            [i for i, t in enumerate(self._tokens) if t in END_OF_TURN_NAMES] + ([eos_id] if eos_id is not None else [])
        )
        spm = scores is not None
        self._token_bytes = tuple(_token_bytes(t, k, spm) for t, k in zip(self._tokens, token_types))
        # A SentencePiece vocabulary's text starts with the space its encoding puts in
        # front; decoding takes it off again, as HuggingFace's decoder for these does.
        self._strip_space = spm and add_space_prefix
        try:
            self._template = _template_environment().from_string(chat_template or CHATML_TEMPLATE)
        except jinja2.TemplateSyntaxError as exc:
            raise ModelFileError(f"the model's chat template does not parse: {exc}") from exc
        if spm:
            self._hf = None
            self._spm = SpmEncoder(self._tokens, scores, unknown_id)
            self._add_space_prefix = add_space_prefix
            self._special_ids: dict[str, int] = {}
            for i, (t, k) in enumerate(zip(self._tokens, token_types)):
                if k in (CONTROL, USER_DEFINED) and t:
                    self._special_ids.setdefault(t, i)
            # Longest first, so that a special token containing another wins.
            specials = sorted(self._special_ids, key=len, reverse=True)
            self._specials = re.compile("|".join(map(re.escape, specials))) if specials else None
            return
        self._spm = None

        vocab: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            vocab.setdefault(t, i)  # a repeated string encodes to its first id
        pairs = [_merge_pair(m, vocab) for m in merges]
        # ignore_merges: Llama 3 takes a whole pre-token that is in the vocabulary as is.
        bpe = models.BPE(vocab, pairs, ignore_merges=pre in LLAMA3_PRE)
        self._hf = HFTokenizer(bpe)
        self._hf.pre_tokenizer = _pre_tokenizer(pre)
        # Control and user-defined tokens are matched whole wherever they occur in text.
        self._hf.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, k in zip(self._tokens, token_types)
                if k in (CONTROL, USER_DEFINED)
            ]
        )

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Tokenizer:
        """Raises ModelFileError unless the file holds a `gpt2` vocabulary with merges
        or a `llama` one with scores."""
        model = f.require("tokenizer.ggml.model")
        if model not in ("gpt2", "llama"):
            raise ModelFileError(
                f"unsupported tokenizer model {model!r} in {f.path} (specq supports 'gpt2', byte-level BPE, "
                "and 'llama', SentencePiece-style BPE)"
            )
        tokens = list(f.require("tokenizer.ggml.tokens"))
        if not tokens:
            raise ModelFileError(f"empty vocabulary in {f.path}")
        types = list(f.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise ModelFileError(f"{f.path} has {len(tokens)} tokens but {len(types)} token types")
        ids = {}
        for name in ("bos", "eos"):
            tid = f.number(f"tokenizer.ggml.{name}_token_id", default=None)
            if tid is not None and not 0 <= tid < len(tokens):
                raise ModelFileError(f"{name} token id {tid} is outside the vocabulary of {f.path}")
            ids[name] = tid
        if model == "llama":
            scores = list(f.require("tokenizer.ggml.scores"))
            if len(scores) != len(tokens):
                raise ModelFileError(f"{f.path} has {len(tokens)} tokens but {len(scores)} scores")
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores):
                raise ModelFileError(f"{f.path}: tokenizer.ggml.scores holds a value that is not a number")
            unknown = f.number("tokenizer.ggml.unknown_token_id", default=None)
            return cls(
                tokens,
                types,
                [],
                pre="default",
                bos_id=ids["bos"],
                eos_id=ids["eos"],
                # llama.cpp's defaults for these vocabularies when the file is silent.
                add_bos=bool(f.get("tokenizer.ggml.add_bos_token", True)),
                chat_template=f.get("tokenizer.chat_template"),
                scores=scores,
                unknown_id=unknown if unknown is not None and 0 <= unknown < len(tokens) else None,
                add_space_prefix=bool(f.get("tokenizer.ggml.add_space_prefix", True)),
            )
        return cls(
            tokens,
            types,
            list(f.require("tokenizer.ggml.merges")),
            pre=str(f.get("tokenizer.ggml.pre", "default")),
            bos_id=ids["bos"],
            eos_id=ids["eos"],
            add_bos=bool(f.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=f.get("tokenizer.chat_template"),
        )

    def token_strings(self) -> tuple[str, ...]:
        """The vocabulary as stored in the file, indexed by id."""
        return self._tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of text. Special tokens written in the text (e.g. "<|im_start|>")
        become their single ids. BOS is prepended only if the file asks for it and the
        text does not already start with it. Characters with a byte that has no token
        (some vocabularies lack rare bytes) are dropped, as llama.cpp and HF do."""
        ids = self._encode_spm(text) if self._spm is not None else self._hf.encode(text, add_special_tokens=False).ids
        if self._add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    def _encode_spm(self, text: str) -> list[int]:
        """Special tokens whole; each fragment of text between them as spm.py says,
        with a space in front of it (the first, and any after a special token)."""
        ids: list[int] = []
        at = 0
        matches = self._specials.finditer(text) if self._specials is not None else ()
        for m in [*matches, None]:
            fragment = text[at : m.start() if m else len(text)]
            if fragment:
                if self._add_space_prefix:
                    fragment = " " + fragment
                ids += self._spm.encode(fragment.replace(" ", SPACE))
            if m:
                ids.append(self._special_ids[m.group()])
                at = m.end()
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, control tokens omitted; invalid UTF-8 becomes U+FFFD. A
        SentencePiece vocabulary's leading space (the prefix its encoding adds) is
        dropped."""
        text = b"".join(self._token_bytes[i] for i in ids).decode("utf-8", errors="replace")
        return text[1:] if self._strip_space and text[:1] == " " else text

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self._token_bytes, self._strip_space)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation, rendered with the model's own template
        (ChatML when the file has none). Raises InputError for malformed messages or
        when the template rejects them."""
        _check_messages(messages)
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token="" if self.bos_id is None else self._tokens[self.bos_id],
                eos_token="" if self.eos_id is None else self._tokens[self.eos_id],
            )
        except jinja2.TemplateError as exc:
            raise InputError(f"the chat template rejected the messages: {exc}") from exc

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Prompt ids for a conversation, ending with the assistant's turn opener."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=True))


def _template_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    return env


def _raise_exception(message: str) -> None:
    """`raise_exception` as HF templates call it to refuse a conversation."""
    raise jinja2.TemplateError(message)


def _check_messages(messages: Any) -> None:
    """Raises InputError naming the first bad message (numbered from 1)."""
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else f"a {type(messages).__name__}"
        raise InputError(f"messages must be a non-empty list, got {got}")
    for n, m in enumerate(messages, start=1):
        if not isinstance(m, dict):
            raise InputError(f"message {n} is not an object but a {type(m).__name__}")
        for key in ("role", "content"):
            if key not in m:
                raise InputError(f"message {n} has no {key!r}")
            if not isinstance(m[key], str):
                raise InputError(f"message {n} has a non-string {key!r} ({type(m[key]).__name__})")
        if m["role"] not in ROLES:
            raise InputError(f"message {n} has role {m['role']!r}; expected one of {ROLES}")

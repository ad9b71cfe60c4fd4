"""SentencePiece-style vocabularies (`tokenizer.ggml.model = llama`): spm.py's
encoding against a plain restatement of the rule (merge the adjacent pair whose
piece scores highest, leftmost on ties; bytes for what no piece covers), special
tokens, the space prefix, decoding back to the text, llama.cpp's tokenizer on the
same file where llama-cpp-python is installed, and a model with such a vocabulary
generating."""

from __future__ import annotations

import llama_cpp_record
import numpy as np
import pytest

from specq.specdec.gguf_file import GGUFFile
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.spm import SPACE, SpmEncoder
from specq.specdec.tokenizer import Tokenizer
from specq.testing.toy_gguf import BOS_ID, EOS_ID, spm_vocab

ALPHABET = list("the cat sat on a mat, in here; rent at 1999!\n") + ["é", "日本", "🙂", "\t", "  "]


def reference_encode(tokens: list[str], scores: list[float], text: str) -> list[int]:
    ids = {t: i for i, t in reversed(list(enumerate(tokens)))}
    symbols = list(text)
    while True:
        best, best_score = None, None
        for i in range(len(symbols) - 1):
            piece = symbols[i] + symbols[i + 1]
            if piece in ids and (best is None or scores[ids[piece]] > best_score):
                best, best_score = i, scores[ids[piece]]
        if best is None:
            break
        symbols[best : best + 2] = [symbols[best] + symbols[best + 1]]
    out = []
    for s in symbols:
        out += [ids[s]] if s in ids else [ids[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
    return out


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(ALPHABET, size=rng.integers(1, 60))) for _ in range(n)]


LLAMA_CPP_TEXTS = [*random_texts(200, seed=2), "<|im_start|>user\nthe cat<|im_end|> sat"]


@pytest.fixture(scope="module")
def spm_file(toy_model_file) -> str:
    return toy_model_file(seed=30, tokenizer="spm")


def test_the_encoder_follows_the_merge_rule():
    tokens, _, scores = spm_vocab()
    encoder = SpmEncoder(tokens, scores, unknown_id=0)
    for text in random_texts(300):
        text = (" " + text).replace(" ", SPACE)
        assert encoder.encode(text) == reference_encode(tokens, scores, text), text


def test_equal_scores_merge_the_leftmost_pair_first():
    # "ab" and "bc" score the same: in "abc" the leftmost pair wins.
    tokens = ["<unk>", "a", "b", "c", "ab", "bc"]
    encoder = SpmEncoder(tokens, [0, 0, 0, 0, -1.0, -1.0], unknown_id=0)
    assert encoder.encode("abc") == [4, 3]
    assert encoder.encode("xbc") == [0, 5]  # no byte tokens here: the unknown token


def test_the_tokenizer_splits_out_special_tokens_and_prefixes_a_space(spm_file):
    tok = Tokenizer.from_gguf(GGUFFile(spm_file))
    tokens, _, scores = spm_vocab()

    def piece_ids(fragment: str) -> list[int]:
        return reference_encode(tokens, scores, (" " + fragment).replace(" ", SPACE))

    assert tok.encode("the cat") == [BOS_ID, *piece_ids("the cat")]  # BOS: llama.cpp's default for these
    text = "<|im_start|>user\nthe cat<|im_end|>\nhi"
    assert tok.encode(text) == [BOS_ID, *piece_ids("user\nthe cat"), EOS_ID, *piece_ids("\nhi")]
    ids = tok.encode_chat([{"role": "user", "content": "in here"}])
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 2  # the template's opener, and the assistant's


def test_decoding_gives_the_text_back_whole_and_streamed(spm_file):
    tok = Tokenizer.from_gguf(GGUFFile(spm_file))
    for text in random_texts(100, seed=1):
        ids = tok.encode(text)
        assert tok.decode(ids) == text  # the BOS is a control token; the prefix space comes off
        stream = tok.stream_decoder()
        pieces = [stream.push(ids[i : i + 2]) for i in range(0, len(ids), 2)]
        assert "".join(pieces) + stream.flush() == text


def test_llama_cpps_tokenizer_agrees_on_the_same_file(spm_file):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the compare extra) is not installed")
    llama = llama_cpp.Llama(model_path=spm_file, vocab_only=True, verbose=False)
    tok = Tokenizer.from_gguf(GGUFFile(spm_file))
    given = []
    for text in LLAMA_CPP_TEXTS:
        # A text that starts with BOS gets no second one from specq (llama.cpp adds it).
        add_bos = not text.startswith("<|im_start|>")
        want = llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        assert tok.encode(text) == want, text
        assert tok.decode(want) == llama.detokenize(want[1:]).decode("utf-8", errors="replace").removeprefix(" ")
        given.append(want)
    llama_cpp_record.check_or_record("spm", "ids", given)


def test_the_ids_llama_cpps_tokenizer_gave_on_the_same_file(spm_file):
    """llama.cpp's token ids for the same texts, recorded (tests/data/llama_cpp.json):
    CI holds the tokenizer to them without llama-cpp-python."""
    tok = Tokenizer.from_gguf(GGUFFile(spm_file))
    recorded = llama_cpp_record.load()["spm"]["ids"]
    assert len(recorded) == len(LLAMA_CPP_TEXTS)
    for text, want in zip(LLAMA_CPP_TEXTS, recorded):
        assert tok.encode(text) == want, text


def test_a_model_with_a_sentencepiece_vocabulary_generates(spm_file):
    from specq.specdec.engine import Engine
    from specq.specdec.proposers import NgramProposer, NoProposer
    from specq.specdec.state import GenerationRequest

    model, tok = load_model_and_tokenizer(spm_file)
    ids = tok.encode_chat([{"role": "user", "content": "the cat sat on the mat"}])
    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=40, k=3, adaptive=False)
    plain = Engine(model, tok, NoProposer()).run(request)
    drafted = Engine(model, tok, NgramProposer()).run(request)
    assert list(drafted.output_ids) == list(plain.output_ids) and len(plain.output_ids) > 0
    assert drafted.metrics.drafted > 0
    stream = tok.stream_decoder()
    streamed = "".join(stream.push([i]) for i in plain.output_ids) + stream.flush()
    assert streamed == tok.decode(plain.output_ids) != ""

"""A decode state's text, whole or as far as it is final: the one rule, shared by the
engine, the command line's streaming and the server's (which has the tokenizer but
not the model)."""

from __future__ import annotations

from specq.specdec.state import DecodeState
from specq.specdec.stops import held_back
from specq.specdec.tokenizer import Tokenizer


def completion_text(tokenizer: Tokenizer, state: DecodeState) -> str:
    """The completion's text: end-of-turn tokens dropped, cut before a stop string."""
    text = tokenizer.decode(state.output_ids)
    return text if state.stop_text_index is None else text[: state.stop_text_index]


def final_text_so_far(tokenizer: Tokenizer, state: DecodeState) -> str:
    """The part of the text that is final already: no incomplete UTF-8 character and
    no suffix that might still become a stop string. Grows monotonically as the state
    does, and is always a prefix of the finished state's completion_text."""
    if state.finished:
        return completion_text(tokenizer, state)
    text = tokenizer.stream_decoder().push(state.output_ids)
    return text[: len(text) - held_back(text, state.request.stop)]

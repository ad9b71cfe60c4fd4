"""The two kinds of ids a user chooses, and their one rule each (README: "Ids").

A batch id names Redis keys and RQ jobs and is typed on command lines, so it is
kept to a small safe alphabet. A request id (`custom_id`) comes from input files
written by other tools (OpenAI Batch files use free-form ids), so it may hold any
printable text; it is refused only where it would break something: empty, too long
to show, a control character (a newline splits the output files and terminals), or
a lone surrogate (not encodable, so it cannot reach Redis or a UTF-8 file).

This module imports nothing of specq's but its errors: inputs and config both use it.
"""

from __future__ import annotations

import re
from typing import Any

from specq.errors import ParameterError

# fullmatch, not match with "$": "$" also matches before a trailing newline.
BATCH_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_REQUEST_ID_CHARS = 256
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
SHOWN_CHARS = 40  # an offending id is shown cut to this many characters


def check_batch_id(batch_id: str) -> str:
    if not (isinstance(batch_id, str) and BATCH_ID_PATTERN.fullmatch(batch_id)):
        raise ParameterError(
            f"batch id {batch_id!r} must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return batch_id


def request_id_fault(custom_id: Any) -> str | None:
    """None for a valid request id; otherwise why not, as words that complete
    "custom_id ..." (callers show the value with `shown`)."""
    if not isinstance(custom_id, str) or not custom_id:
        return "must be a non-empty string"
    if not is_valid_unicode(custom_id):
        return "is not valid Unicode (lone surrogate)"
    if len(custom_id) > MAX_REQUEST_ID_CHARS:
        return f"has {len(custom_id)} characters; at most {MAX_REQUEST_ID_CHARS} are allowed"
    control = CONTROL_CHARACTERS.search(custom_id)
    if control:
        return f"has a control character ({control.group()!r} at position {control.start()})"
    return None


def check_request_id(custom_id: Any) -> str:
    fault = request_id_fault(custom_id)
    if fault:
        raise ParameterError(f"request id {shown(custom_id)} {fault}")
    return custom_id


def is_valid_unicode(text: str) -> bool:
    """False if `text` holds a lone surrogate (which JSON's \\ud800 escape yields):
    Python keeps such a str, but no UTF-8 file, terminal or Redis can take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value: Any) -> str:
    """The value for a one-line message: repr escapes newlines and surrogates."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return repr(value[:SHOWN_CHARS]) + "..."
    return repr(value)

"""JSON Lines output that every line splitter agrees on."""

from __future__ import annotations

import json
from typing import Any

# Valid inside a JSON string, yet line breaks to Python's str.splitlines and to
# JavaScript: model text can contain them, and a result line must stay one line.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def dumps_line(obj: Any) -> str:
    """One JSON object, UTF-8 text kept readable, without a trailing newline."""
    text = json.dumps(obj, ensure_ascii=False)
    for raw, escaped in _LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text

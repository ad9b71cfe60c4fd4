from __future__ import annotations

import json

from specq.jsonl import dumps_line


def test_text_with_unicode_line_breaks_stays_one_line_and_round_trips():
    obj = {"text": "a\u2028b\u2029c\u0085d\ne\u00e9\U0001f600", "n": 1}
    line = dumps_line(obj)
    assert line.splitlines() == [line]
    assert json.loads(line) == obj
    assert "\u00e9" in line  # readable UTF-8, not escaped

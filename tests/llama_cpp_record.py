"""llama.cpp's outputs on the toy files, recorded in tests/data/llama_cpp.json so that
CI, which does not install llama-cpp-python, still checks specq against an
independent implementation. The tests that run llama.cpp itself (where it is
installed) check that the record is current, and rewrite it when the environment
variable SPECQ_RECORD_LLAMA_CPP=1 is set."""

from __future__ import annotations

import json
import os
from pathlib import Path

PATH = Path(__file__).parent / "data" / "llama_cpp.json"
ROWS = (0, 11, 23)  # the logit rows kept of each toy forward (all rows' argmax are kept)


def load() -> dict:
    return json.loads(PATH.read_text())


def check_or_record(section: str, key: str, value) -> None:
    """value is what llama.cpp gives now: it must equal the record (or is written)."""
    record = load() if PATH.exists() else {}
    if os.environ.get("SPECQ_RECORD_LLAMA_CPP") == "1":
        record.setdefault(section, {})[key] = value
        PATH.write_text(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
        return
    assert record.get(section, {}).get(key) == value, (
        f"tests/data/llama_cpp.json is stale for {section}/{key}: rerun these tests with SPECQ_RECORD_LLAMA_CPP=1"
    )

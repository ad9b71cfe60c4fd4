"""The target model's own greedy answers to a prompt corpus, the heads' training data.

Heads trained on the model's own outputs learn what the verifier will accept, not
what some other writer would have said (Medusa-2's self-distillation). Answers are
appended to a JSONL file as they finish, so an interrupted run continues where it
stopped: a finished answer is never decoded twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specq.errors import InputError
from specq.jsonl import dumps_line
from specq.specdec.engine import Engine
from specq.specdec.state import GenerationRequest


@dataclass(frozen=True)
class Answer:
    custom_id: str
    category: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


def read_answers(path: str) -> dict[str, Answer]:
    """The answers already in `path`; a last line cut short by a kill is ignored
    (and rewritten by the next run)."""
    answers: dict[str, Answer] = {}
    if not os.path.exists(path):
        return answers
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            answers[rec["custom_id"]] = Answer(
                rec["custom_id"], rec.get("category", ""), tuple(rec["prompt_ids"]), tuple(rec["output_ids"])
            )
    return answers


def distill(
    engine: Engine,
    requests: Sequence[tuple[str, str, GenerationRequest]],
    path: str,
    *,
    batch_size: int = 8,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> list[Answer]:
    """Greedy answers to (custom_id, category, request), in the given order;
    reuses those already in `path` and appends the rest as they finish."""
    have = read_answers(path)
    todo = [(cid, cat, req) for cid, cat, req in requests if cid not in have]
    _drop_torn_tail(path)
    states = [engine.start(req) for _, _, req in todo]
    with open(path, "a", encoding="utf-8") as out:
        for index, state in engine.generate_many(states, group_size=batch_size):
            if not state.finished:
                continue
            cid, cat, req = todo[index]
            answer = Answer(cid, cat, tuple(req.prompt_ids), tuple(state.output_ids))
            out.write(
                dumps_line(
                    {
                        "custom_id": cid,
                        "category": cat,
                        "prompt_ids": list(answer.prompt_ids),
                        "output_ids": list(answer.output_ids),
                    }
                )
                + "\n"
            )
            out.flush()
            have[cid] = answer
            progress(len(have), len(requests))
    return [have[cid] for cid, _, _ in requests]


def _drop_torn_tail(path: str) -> None:
    """Cut a last line that a kill left without its newline, so appends stay lines."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


def read_results(path: str) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(custom_id, prompt ids, output ids) of every answered request in a results
    file of `specq run`, `specq results` or `specq generate --json` (each line's
    "specq" object holds the ids); error lines, which answer nothing, are skipped."""
    found = []
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    if rec.get("error"):
                        continue
                    ids = rec["specq"]
                    prompt, output = ids["prompt_token_ids"], ids["token_ids"]
                    if not all(isinstance(t, int) for t in [*prompt, *output]) or not prompt:
                        raise TypeError
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise InputError(
                        f"{path} line {number}: not a specq result (a line of `specq run`'s or "
                        '`specq results`\' output, whose "specq" object holds prompt_token_ids and token_ids)'
                    ) from None
                found.append((str(rec.get("custom_id", "")), tuple(prompt), tuple(output)))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return found

"""A request's result: one record, from which every output line is derived.

`specq generate --json`, `specq results`, `specq run` and the OpenAI Batch output all
print `Result.line()`; a worker stores `Result.stored()` in Redis and `results`
rebuilds the record from it. The lines (documented in the README):

- plain input: {"custom_id", "text", "finish_reason", "usage",
  "specq": {"token_ids", "prompt_token_ids", "metrics", "worker"}}
- an OpenAI Batch request line: the Batch output line ({"id", "custom_id",
  "response": {"status_code", "request_id", "body": a chat.completion}, "error"}),
  with the same "specq" object beside it.

Failures are error lines of the same two shapes (`error_line`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from specq.requests.inputs import CHAT_URL, COMPLETIONS_URL
from specq.specdec.state import DecodeState


@dataclass(frozen=True)
class Result:
    custom_id: str
    text: str
    finish_reason: str  # "stop" or "length"
    token_ids: list[int]
    prompt_token_ids: list[int]
    metrics: dict[str, Any]
    completed_at: float = 0.0
    worker: str = ""  # "" when generated locally

    @classmethod
    def of(cls, custom_id: str, text: str, state: DecodeState, worker: str = "") -> Result:
        return cls(
            custom_id,
            text,
            state.finish_reason or "",
            list(state.output_ids),
            list(state.request.prompt_ids),
            state.metrics.to_dict(),
            round(time.time(), 3),
            worker,
        )

    @property
    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.prompt_token_ids), len(self.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def stored(self) -> dict[str, Any]:
        """What a worker writes into Redis. The prompt's ids are left out: the request
        record beside it holds them. The keys are those of every specq version, so
        results stored by any of them read back."""
        return {
            "custom_id": self.custom_id,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "token_ids": self.token_ids,
            "usage": self.usage,
            "metrics": self.metrics,
            "completed_at": self.completed_at,
            "worker": self.worker,
        }

    @classmethod
    def from_stored(cls, d: dict[str, Any], prompt_token_ids: list[int]) -> Result:
        return cls(
            d["custom_id"],
            d["text"],
            d["finish_reason"],
            list(d["token_ids"]),
            list(prompt_token_ids),
            d["metrics"],
            float(d.get("completed_at") or 0.0),
            d.get("worker") or "",
        )

    def line(self, *, endpoint: str = "", model: str = "", batch_id: str = "") -> dict[str, Any]:
        """The output line: plain for endpoint "", else the Batch output line of that
        OpenAI endpoint (a chat.completion, or a text_completion for /v1/completions)."""
        extra = {
            "token_ids": self.token_ids,
            "prompt_token_ids": self.prompt_token_ids,
            "metrics": self.metrics,
            "worker": self.worker,
        }
        if not endpoint:
            return {
                "custom_id": self.custom_id,
                "text": self.text,
                "finish_reason": self.finish_reason,
                "usage": self.usage,
                "specq": extra,
            }
        rid = request_id(batch_id, self.custom_id)
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish_reason, "logprobs": None}
        if endpoint == COMPLETIONS_URL:
            kind, prefix, choice = "text_completion", "cmpl", {"text": self.text, **choice}
        else:
            kind, prefix = "chat.completion", "chatcmpl"
            choice = {"message": {"role": "assistant", "content": self.text}, **choice}
        body = {
            "id": f"{prefix}-{rid}",
            "object": kind,
            "created": int(self.completed_at),
            "model": model or "specq",
            "choices": [{"index": 0, **choice}],
            "usage": self.usage,
        }
        return {
            "id": f"batch_req_{rid}",
            "custom_id": self.custom_id,
            "response": {"status_code": 200, "request_id": rid, "body": body},
            "error": None,
            "specq": extra,
        }


def error_line(
    custom_id: str, code: str, message: str, *, openai: bool = False, line: int | None = None, batch_id: str = ""
) -> dict[str, Any]:
    error = {"code": code, "message": message}
    if not openai:
        return {"custom_id": custom_id, "error": error, "line": line}
    rid = request_id(batch_id, custom_id)
    return {"id": f"batch_req_{rid}", "custom_id": custom_id, "response": None, "error": error}


def request_id(batch_id: str, custom_id: str) -> str:
    """The Batch output's request id: stable for a (batch, custom_id), so exporting
    twice writes the same file."""
    return hashlib.sha256(f"{batch_id}\0{custom_id}".encode()).hexdigest()[:24]


def endpoint_of(spec: dict[str, Any]) -> str:
    """A stored request record's endpoint; records from before the completions
    endpoint say only whether they were OpenAI (chat) lines."""
    return spec.get("endpoint") or (CHAT_URL if spec.get("openai") else "")

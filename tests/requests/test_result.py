"""The one result record: what a worker stores reads back to the same lines."""

from __future__ import annotations

import json

import pytest

from specq.requests.result import Result, endpoint_of, error_line

RESULT = Result(
    "req-1",
    "Paris.",
    "stop",
    [5, 6, 2],
    [1, 9, 9, 4],
    {"tau": 1.5, "target_forwards": 2},
    1_800_000_000.25,
    "host.1.abc",
)


@pytest.mark.parametrize("endpoint", ["", "/v1/chat/completions", "/v1/completions"])
def test_a_stored_result_reads_back_to_the_same_line(endpoint):
    stored = json.loads(json.dumps(RESULT.stored()))  # through Redis as JSON
    again = Result.from_stored(stored, RESULT.prompt_token_ids)
    assert again == RESULT
    assert again.line(endpoint=endpoint, model="m", batch_id="b") == RESULT.line(
        endpoint=endpoint, model="m", batch_id="b"
    )


def test_each_endpoint_gets_its_own_body():
    chat = RESULT.line(endpoint="/v1/chat/completions")["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"] == "Paris."
    completion = RESULT.line(endpoint="/v1/completions")["response"]["body"]
    assert completion["object"] == "text_completion" and completion["id"].startswith("cmpl-")
    assert completion["choices"] == [{"index": 0, "text": "Paris.", "finish_reason": "stop", "logprobs": None}]


def test_records_from_before_the_completions_endpoint_keep_their_shape():
    assert endpoint_of({"openai": True}) == "/v1/chat/completions"
    assert endpoint_of({"openai": False}) == endpoint_of({}) == ""
    assert endpoint_of({"openai": True, "endpoint": "/v1/completions"}) == "/v1/completions"


def test_usage_counts_the_prompt_and_the_completion():
    assert RESULT.usage == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert RESULT.stored()["usage"] == RESULT.usage  # kept in the stored record, as every version wrote it


def test_the_batch_request_id_is_stable_and_differs_by_batch():
    a = RESULT.line(endpoint="/v1/chat/completions", batch_id="b1")
    assert a == RESULT.line(endpoint="/v1/chat/completions", batch_id="b1")
    assert a["id"] != RESULT.line(endpoint="/v1/chat/completions", batch_id="b2")["id"]
    assert a["id"] == "batch_req_" + a["response"]["request_id"]


def test_error_lines_of_both_shapes():
    assert error_line("r", "engine_error", "boom", line=3) == {
        "custom_id": "r",
        "error": {"code": "engine_error", "message": "boom"},
        "line": 3,
    }
    batch = error_line("r", "cancelled", "cancelled before it completed", openai=True, batch_id="b")
    assert batch["response"] is None and batch["error"]["code"] == "cancelled"

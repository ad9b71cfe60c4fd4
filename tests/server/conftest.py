"""A running `specq serve` on the toy model, and the official client pointed at it."""

from __future__ import annotations

import openai
import pytest
from queue_helpers import stop_process
from server_helpers import KEY, start_server


@pytest.fixture
def server(queue_env, long_model_path, client):
    """(base URL, environment) of a running `specq serve` on the toy model, on a Redis
    emptied for the test (the client fixture flushes it)."""
    env = {**queue_env, "SPECQ_API_KEY": KEY}
    proc, url = start_server(env, long_model_path, "--max-tokens", "12", "--batch-size", "4")
    yield url, env
    stop_process(proc)


@pytest.fixture
def api(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)

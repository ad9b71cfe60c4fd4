"""Synchronous completions through `specq serve` with the official client: answers
equal `specq generate`'s, streams add up to them, a running batch does not starve
them, and faults (a client that leaves, a worker killed mid-stream) change nothing
a client sees."""

from __future__ import annotations

import json
import os
import signal
import time

import openai
import pytest
import redis
from queue_helpers import specq, start_worker, stop_process, wait_until
from server_helpers import KEY, start_server

from specq.queue import keys
from specq.queue.vocabulary import RequestState

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "tell me a story about numbers"}]


def generated(env: dict, model: str, body: dict, tmp_path, url: str = "/v1/chat/completions") -> dict:
    """`specq generate`'s answer to the same request, as a Batch line's body."""
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"custom_id": "x", "method": "POST", "url": url, "body": body}) + "\n")
    local = specq(["generate", "--input", str(path), "--json", "--model", model], env, timeout=120)
    return json.loads(local.stdout)["response"]["body"]


@pytest.fixture
def worker(server, client):
    proc = start_worker(server[1])
    wait_until(lambda: client.zcard(keys.WORKERS) >= 1, 60, "the worker's first heartbeat")
    yield proc
    stop_process(proc)


def sync_states(client) -> dict[str, str]:
    """The states of every request in the synchronous batches, as stored."""
    out = {}
    for batch_id in client.zrange(keys.BATCHES, 0, -1):
        if batch_id.startswith(b"sync-"):
            out.update(
                {k.decode(): v.decode() for k, v in client.hgetall(keys.BatchKeys(batch_id.decode()).state).items()}
            )
    return out


def test_a_chat_completion_equals_generate_and_is_forgotten_once_answered(
    api, server, worker, long_model_path, client, tmp_path
):
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": 20}
    answer = api.chat.completions.create(**body)
    expected = generated(server[1], long_model_path, body, tmp_path)
    assert answer.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert answer.choices[0].finish_reason == expected["choices"][0]["finish_reason"] == "length"
    assert answer.usage.completion_tokens == 20 and answer.usage.prompt_tokens == expected["usage"]["prompt_tokens"]
    assert answer.id.startswith("chatcmpl-") and answer.model == "toy"
    assert answer.model_extra["specq"]["token_ids"] and answer.model_extra["specq"]["metrics"]["target_forwards"] > 0
    assert sync_states(client) == {}  # delivered: nothing of it is left in Redis
    completion = api.completions.create(model="toy", prompt="once upon a time", max_tokens=15, temperature=0.7, seed=3)
    expected = generated(
        server[1],
        long_model_path,
        {"prompt": "once upon a time", "max_tokens": 15, "temperature": 0.7, "seed": 3},
        tmp_path,
        "/v1/completions",
    )
    assert completion.object == "text_completion" and completion.choices[0].text == expected["choices"][0]["text"]


def test_a_stream_arrives_in_pieces_that_add_up_to_the_answer(api, worker):
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": 60, "stop": ["zz"]}
    whole = api.chat.completions.create(**body).choices[0].message.content
    chunks = list(api.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(pieces) > 3, "the answer came in one piece: nothing was streamed"
    assert "".join(pieces) == whole
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"] or finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > chunks[-1].usage.completion_tokens > 0
    assert len({c.id for c in chunks}) == 1
    texts = [c.choices[0].text for c in api.completions.create(model="toy", prompt="a b c", max_tokens=30, stream=True)]
    assert "".join(texts) == api.completions.create(model="toy", prompt="a b c", max_tokens=30).choices[0].text


def test_bad_requests_are_400s_naming_the_field_and_no_worker_is_a_503(api, server):
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        api.chat.completions.create(model="toy", messages=MESSAGES, frequency_penalty=1.0)
    with pytest.raises(openai.BadRequestError, match="messages"):
        api.chat.completions.create(model="toy", messages=[])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        api.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=10**9)
    with pytest.raises(openai.BadRequestError, match="stream"):
        api.chat.completions.create(model="toy", messages=MESSAGES, extra_body={"stream": "yes"})
    with pytest.raises(openai.InternalServerError, match="no specq worker"):
        api.chat.completions.create(model="toy", messages=MESSAGES)


def test_a_running_batch_yields_to_a_synchronous_request(api, server, tmp_path, client, long_model_path):
    """One worker, busy with a batch that lasts many seconds: a synchronous request is
    answered long before the batch ends (the worker hands the batch back,
    checkpointed, and takes it up again), and the batch's outputs stay exact."""
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"q{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "toy", "messages": [{"role": "user", "content": f"count {i}"}], "max_tokens": 400},
            }
        )
        + "\n"
        for i in range(16)
    )
    path = tmp_path / "long.jsonl"
    path.write_text(lines)
    uploaded = api.files.create(file=path.open("rb"), purpose="batch")
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    proc = start_worker(server[1])
    try:
        wait_until(lambda: api.batches.retrieve(batch.id).model_extra["specq"]["tokens"] > 50, 60, "the batch to run")
        started = time.monotonic()
        answer = api.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=10)
        waited = time.monotonic() - started
        status = api.batches.retrieve(batch.id)
        assert answer.usage.completion_tokens == 10
        assert status.status == "in_progress", f"the request waited for the whole batch ({waited:.1f} s)"
        stats = {k.decode(): float(v) for k, v in client.hgetall(keys.BatchKeys(batch.id).stats).items()}
        assert stats.get("resumes_preempt", 0) >= 1  # the batch was handed back for it
        deadline = time.monotonic() + 300
        while api.batches.retrieve(batch.id).status != "completed":
            assert time.monotonic() < deadline, "the batch did not finish after yielding"
            time.sleep(0.5)
    finally:
        stop_process(proc)
    out = [json.loads(x) for x in api.files.content(api.batches.retrieve(batch.id).output_file_id).text.splitlines()]
    local = specq(
        ["generate", "--input", str(path), "--json", "--model", long_model_path, "--batch-size", "4"],
        server[1],
        timeout=300,
    ).stdout
    expected = [json.loads(x) for x in local.splitlines()]
    assert [o["specq"]["token_ids"] for o in out] == [e["specq"]["token_ids"] for e in expected]


@pytest.fixture
def slow_api(queue_env, slow_model_path, client):
    """A server on the slower toy model (a long answer lasts seconds) that follows one
    synchronous request at a time, and a worker."""
    env = {**queue_env, "SPECQ_API_KEY": KEY}
    server, url = start_server(env, slow_model_path, "--max-sync-requests", "1")
    worker = start_worker(env)
    try:
        wait_until(lambda: client.zcard(keys.WORKERS) >= 1, 60, "the worker's first heartbeat")
        yield openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    finally:
        stop_process(worker)
        stop_process(server)


def test_a_client_that_leaves_mid_stream_cancels_its_request(slow_api, client):
    stream = slow_api.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=900, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    wait_until(lambda: set(sync_states(client).values()) == {RequestState.CANCELLED}, 20, "the request to be cancelled")
    # The worker is free again: the next request is answered.
    assert slow_api.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=5).usage.completion_tokens == 5


def test_more_synchronous_requests_than_allowed_get_a_429(slow_api):
    stream = slow_api.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=900, stream=True)
    next(c for c in stream if c.choices and c.choices[0].delta.content)  # text: followed now
    with pytest.raises(openai.RateLimitError, match="1 synchronous requests are in progress"):
        slow_api.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=5)
    stream.close()

    def answered() -> bool:
        try:
            return slow_api.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=5) is not None
        except openai.RateLimitError:
            return False

    wait_until(answered, 20, "the place to be free again")


def test_a_worker_killed_mid_stream_changes_nothing_the_client_sees(api, server, worker, client):
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": 300, "temperature": 0.8, "seed": 11}
    whole = api.chat.completions.create(**body).choices[0].message.content
    second = start_worker(server[1])
    pieces: list[str] = []
    killed = None
    try:
        for chunk in api.chat.completions.create(**body, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if len(pieces) == 5 and killed is None:
                killed = kill_the_decoder(client)
    finally:
        stop_process(second)
    assert killed is not None and "".join(pieces) == whole


def kill_the_decoder(client) -> int:
    """SIGKILL the worker process that holds a synchronous request's lease."""
    for batch_id in client.zrange(keys.BATCHES, 0, -1):
        k = keys.BatchKeys(batch_id.decode())
        for rid in client.smembers(k.running):
            owner = client.get(k.lease(rid.decode()))
            if owner:
                pid = int(owner.decode().rsplit("#", 1)[0].split(".")[-2])
                os.kill(pid, signal.SIGKILL)
                return pid
    raise AssertionError("no worker holds a synchronous request")


def test_a_redis_restart_mid_stream_changes_nothing_the_client_sees(own_redis, slow_model_path):
    """Redis stopped (its append-only file written) and started again while a worker
    decodes a streamed request: the server's readers wait for it, the worker hands
    the request back from its latest state, and the stream goes on to the very text
    the uninterrupted request gives."""
    server, env = own_redis
    env = {**env, "SPECQ_API_KEY": KEY}
    proc, url = start_server(env, slow_model_path)
    worker = start_worker(env)
    api = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": 600, "temperature": 0.7, "seed": 5}
    try:
        wait_until(lambda: api.models.list() is not None, 30, "the server")
        whole = None

        def answered() -> bool:
            nonlocal whole
            try:
                whole = api.chat.completions.create(**body).choices[0].message.content
            except openai.InternalServerError:  # no worker heartbeat yet
                return False
            return True

        wait_until(answered, 60, "a first answer")
        pieces: list[str] = []
        restarted = False
        for chunk in api.chat.completions.create(**body, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if len(pieces) == 10 and not restarted:
                server.stop()
                time.sleep(1.5)
                server.ensure_running()
                restarted = True
        assert restarted and "".join(pieces) == whole
        # The restart met the request mid-decode: it was handed back and resumed.
        client = redis.Redis(unix_socket_path=str(server.socket))
        (batch_id,) = [b for b in client.zrange(keys.BATCHES, 0, -1) if b.startswith(b"sync-")]
        stats = client.hgetall(keys.BatchKeys(batch_id.decode()).stats)
        assert float(stats.get(b"resume_prefills", 0)) >= 1, stats
    finally:
        stop_process(worker)
        stop_process(proc)

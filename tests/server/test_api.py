"""`specq serve` driven as a user would: the real server (uvicorn in a subprocess on a
loopback port), a real Redis, a real worker process, and the official `openai`
client with only base_url and api_key set."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import openai
import pytest
from queue_helpers import specq, start_worker, stop_process, wait_until
from server_helpers import KEY, get


def batch_lines(n: int, max_tokens: int = 10, url: str = "/v1/chat/completions") -> str:
    """n OpenAI Batch request lines for `url`: chat messages, or a raw prompt for
    /v1/completions."""
    lines = []
    for i in range(n):
        body: dict = {"model": "toy", "max_tokens": max_tokens}
        if url == "/v1/completions":
            body["prompt"] = f"once {i} " * (1 + i % 3)
        else:
            body["messages"] = [{"role": "user", "content": f"tell {i} " * (1 + i % 3)}]
        custom_id = f"c{i}" if url == "/v1/completions" else f"q{i}"
        lines.append(json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n")
    return "".join(lines)


def upload(api, tmp_path, text: str, name: str = "in.jsonl"):
    path = tmp_path / name
    path.write_text(text)
    with open(path, "rb") as fh:
        return api.files.create(file=fh, purpose="batch"), path


def poll(api, batch_id: str, until: tuple[str, ...], timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = api.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout} s")


def comparable(line: dict) -> dict:
    """What must equal `specq generate`'s line: the text, ids and usage, not the ids
    the Batch format derives from the batch, nor timings."""
    body = line["response"]["body"]
    return {
        "custom_id": line["custom_id"],
        "choices": body["choices"],
        "usage": body["usage"],
        "token_ids": line["specq"]["token_ids"],
    }


@pytest.mark.slow
def test_a_batch_runs_through_the_openai_client_and_equals_generate(api, server, tmp_path, long_model_path):
    url, env = server
    uploaded, path = upload(api, tmp_path, batch_lines(5))
    assert uploaded.purpose == "batch" and uploaded.bytes == path.stat().st_size and uploaded.id.startswith("file-")
    assert api.files.retrieve(uploaded.id).filename == "in.jsonl"
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "nightly"}
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 5 and batch.metadata == {"run": "nightly"}
    worker = start_worker(env, "--burst")
    try:
        done = poll(api, batch.id, ("completed",))
    finally:
        stop_process(worker)
    assert done.request_counts.completed == 5 and done.request_counts.failed == 0 and done.error_file_id is None
    assert done.completed_at >= done.created_at and done.output_file_id
    content = api.files.content(done.output_file_id).content
    assert api.files.retrieve(done.output_file_id).bytes == len(content) > 0
    got = [json.loads(line) for line in content.decode().splitlines()]
    local = specq(
        [
            "generate",
            "--input",
            str(path),
            "--json",
            "--model",
            long_model_path,
            "--max-tokens",
            "12",
            "--batch-size",
            "4",
        ],
        env,
    )
    expected = [json.loads(line) for line in local.stdout.splitlines()]
    assert [comparable(g) for g in got] == [comparable(e) for e in expected]
    assert all(g["id"] == "batch_req_" + g["response"]["request_id"] and g["error"] is None for g in got)
    # The batch is the queue's too: `specq status` sees it, finished.
    status = json.loads(specq(["status", batch.id, "--json"], env).stdout)
    assert status["counts"]["completed"] == 5
    assert [b.id for b in api.batches.list(limit=10)] == [batch.id]
    with pytest.raises(openai.BadRequestError, match="completed"):
        api.batches.cancel(batch.id)


@pytest.mark.slow
def test_a_malformed_file_makes_a_failed_batch_naming_the_line(api, tmp_path):
    lines = batch_lines(3).splitlines()
    lines[1] = '{"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {"max_tokens": 5}}'
    uploaded, _ = upload(api, tmp_path, "\n".join(lines) + "\n")
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at and batch.request_counts.total == 0
    (error,) = batch.errors.data
    assert error.line == 2 and "line 2" in error.message and "messages" in error.message


def test_keys_ids_and_fields_are_checked(server, api, tmp_path):
    url, _ = server
    stranger = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.batches.list()
    with pytest.raises(openai.AuthenticationError):
        stranger.files.create(file=("x.jsonl", b"{}"), purpose="batch")
    assert get(url + "/v1/batches")[0] == 401  # no Authorization header at all
    with pytest.raises(openai.NotFoundError):
        api.batches.retrieve("batch_" + "0" * 24)
    with pytest.raises(openai.NotFoundError):
        api.files.content("file-" + "0" * 24)
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve("../../etc/passwd")
    uploaded, _ = upload(api, tmp_path, batch_lines(1))
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="metadata"):
        api.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"k" * 65: "v"},
        )
    assert api.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(uploaded.id)
    assert json.loads(get(url + "/health")[1]) == {"status": "ok", "redis": True}
    assert "specq_requests" in get(url + "/metrics")[1]


@pytest.mark.slow
def test_pause_resume_and_cancel(api, server, tmp_path):
    url, env = server
    uploaded, _ = upload(api, tmp_path, batch_lines(6))

    def create():
        return api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")

    doomed, kept = create(), create()
    for batch in (doomed, kept):
        paused = api.post(f"/batches/{batch.id}/pause", cast_to=openai.types.Batch)
        assert paused.status == "in_progress" and paused.model_extra["specq"]["paused"] is True
    worker = start_worker(env)
    try:
        time.sleep(2)
        # Paused before any worker came: nothing was decoded.
        assert api.batches.retrieve(doomed.id).request_counts.completed == 0
        assert api.batches.retrieve(kept.id).request_counts.completed == 0
        cancelled = api.batches.cancel(doomed.id)
        assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at
        final = poll(api, doomed.id, ("cancelled",), timeout=60)
        assert api.batches.cancel(doomed.id).status == "cancelled"  # cancelling twice is harmless
        # Resuming a cancelled batch leaves it cancelled; resuming the paused one runs it.
        assert api.post(f"/batches/{doomed.id}/resume", cast_to=openai.types.Batch).status == "cancelled"
        assert api.post(f"/batches/{kept.id}/resume", cast_to=openai.types.Batch).status == "in_progress"
        done = poll(api, kept.id, ("completed",), timeout=120)
    finally:
        stop_process(worker)
    assert final.request_counts.total == final.request_counts.failed == 6 and final.request_counts.completed == 0
    assert final.cancelled_at >= final.created_at and final.error_file_id
    errors = [json.loads(line) for line in api.files.content(final.error_file_id).text.splitlines()]
    assert [e["error"]["code"] for e in errors] == ["cancelled"] * 6 and errors[0]["response"] is None
    assert done.request_counts.completed == 6 and done.model_extra["specq"]["paused"] is False


@pytest.mark.slow
def test_a_worker_killed_mid_batch_changes_no_output(api, server, tmp_path, long_model_path):
    url, env = server
    uploaded, path = upload(api, tmp_path, batch_lines(8, max_tokens=12))
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    first = start_worker(env)
    wait_until(lambda: api.batches.retrieve(batch.id).model_extra["specq"]["tokens"] > 0, 60, "decoding to start")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = start_worker(env)
    try:
        done = poll(api, batch.id, ("completed",), timeout=180)
    finally:
        stop_process(second)
    got = [json.loads(line) for line in api.files.content(done.output_file_id).text.splitlines()]
    local = specq(["generate", "--input", str(path), "--json", "--model", long_model_path, "--max-tokens", "12"], env)
    assert [comparable(g) for g in got] == [comparable(json.loads(x)) for x in local.stdout.splitlines()]


def test_serve_refuses_to_listen_beyond_loopback_without_a_key(queue_env, long_model_path):
    env = {k: v for k, v in queue_env.items() if k != "SPECQ_API_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "specq", "serve", "--host", "0.0.0.0", "--model", long_model_path],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--api-key" in proc.stderr and "Traceback" not in proc.stderr


def test_serve_on_a_port_in_use_is_one_line(queue_env, long_model_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "specq", "serve", "--port", str(port), "--model", long_model_path],
            env=queue_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"]


@pytest.mark.slow
def test_a_completions_batch_gives_text_completions_as_generate_does(api, server, tmp_path, long_model_path):
    url, env = server
    uploaded, path = upload(api, tmp_path, batch_lines(3, max_tokens=8, url="/v1/completions"))
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    worker = start_worker(env, "--burst")
    try:
        done = poll(api, batch.id, ("completed",))
    finally:
        stop_process(worker)
    got = [json.loads(line) for line in api.files.content(done.output_file_id).text.splitlines()]
    assert all(g["response"]["body"]["object"] == "text_completion" for g in got)
    local = specq(["generate", "--input", str(path), "--json", "--model", long_model_path, "--max-tokens", "12"], env)
    expected = [json.loads(line) for line in local.stdout.splitlines()]
    key = lambda line: (line["custom_id"], line["response"]["body"]["choices"], line["specq"]["token_ids"])  # noqa: E731
    assert [key(g) for g in got] == [key(e) for e in expected]


@pytest.mark.slow
def test_lines_must_name_the_batch_endpoint(api, tmp_path):
    mixed = (
        batch_lines(2) + batch_lines(1, max_tokens=8, url="/v1/completions") + '{"custom_id": "p", "prompt": "plain"}\n'
    )
    uploaded, _ = upload(api, tmp_path, mixed)
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [(3, "mismatched_endpoint"), (4, "mismatched_endpoint")]
    assert "'/v1/completions'" in batch.errors.data[0].message and "no url" in batch.errors.data[1].message


def raw_request(url: str, method: str, path: str, body_chunks: list[bytes], headers: dict[str, str]) -> tuple[int, str]:
    """A request sent chunked (no Content-Length), as a hostile client may send it."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.putrequest(method, path)
        for k, v in {**headers, "Transfer-Encoding": "chunked"}.items():
            conn.putheader(k, v)
        conn.endheaders()
        try:
            for chunk in body_chunks:
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed before the whole body was sent
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.mark.slow
def test_the_key_and_the_body_bounds_come_before_the_body_is_read(server):
    url, _ = server
    big = [b"x" * 65536] * 4  # 256 KiB of JSON body, over the 64 KiB bound, with no Content-Length
    # Without the key, nothing is read: 401, even for a body that is not JSON at all.
    assert raw_request(url, "POST", "/v1/batches", [b"{not json"], {})[0] == 401
    assert raw_request(url, "POST", "/v1/batches", big, {})[0] == 401
    status, body = raw_request(url, "POST", "/v1/batches", big, {"Authorization": f"Bearer {KEY}"})
    assert status == 413 and "larger than the limit" in json.loads(body)["error"]["message"]
    # The server is still whole.
    assert get(url + "/health")[0] == 200


@pytest.mark.slow
def test_an_unreadable_file_or_a_lost_batch_is_said_not_a_500(api, server, client, tmp_path):
    url, _ = server
    path = tmp_path / "utf16.jsonl"
    path.write_bytes(batch_lines(2).encode("utf-16"))
    with open(path, "rb") as fh:
        uploaded = api.files.create(file=fh, purpose="batch")
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.errors.data[0].code == "invalid_file"
    assert "UTF-8" in batch.errors.data[0].message and "/files/" not in batch.errors.data[0].message
    good, _ = upload(api, tmp_path, batch_lines(2))
    kept = api.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h")
    for key in client.scan_iter(f"specq:batch:{kept.id}*"):
        client.delete(key)  # someone deleted the batch's keys by hand
    lost = api.batches.retrieve(kept.id)
    assert lost.status == "failed" and lost.errors.data[0].code == "batch_damaged"
    assert {b.id for b in api.batches.list()} == {batch.id, kept.id}  # the listing still works
    with pytest.raises(openai.BadRequestError, match="no batch"):
        api.post(f"/batches/{kept.id}/pause", cast_to=openai.types.Batch)


def test_a_batch_past_its_window_expires_keeping_what_completed(api, server, tmp_path, client):
    """Expiry is checked against the time given, so the test need not wait 24 hours:
    the server's own code, on the server's Redis, reads the batch a day later."""
    from specq.server import batches

    uploaded, _ = upload(api, tmp_path, batch_lines(3))
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.expires_at == batch.created_at + 24 * 3600 and batch.expired_at is None
    rec = batches.record(client, batch.id)
    assert batches.to_api(client, batch.id, rec, now=batch.created_at + 3600)["status"] == "in_progress"
    assert batches.expire_overdue(client, now=batch.created_at + 24 * 3600 + 1) == 1
    expired = api.batches.retrieve(batch.id)
    assert expired.status == "expired" and expired.expired_at >= batch.created_at + 24 * 3600
    assert expired.request_counts.failed == 3 and expired.output_file_id is None
    errors = [json.loads(x) for x in api.files.content(expired.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["q0", "q1", "q2"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert api.files.retrieve(expired.error_file_id).bytes == len(api.files.content(expired.error_file_id).content)

"""Synchronous completions: POST /v1/chat/completions and /v1/completions, answered
while the client waits, or streamed as server-sent events (`stream: true`).

Each request is appended to the server's synchronous batch (queue/sync.py) and
decoded by the workers like any other; the server follows its checkpoints, written
every round, and sends the text that is final so far (no half a UTF-8 character, no
prefix of a stop string). A worker killed mid-request changes nothing the client
sees: another resumes it from its last checkpoint, exactly.

A client that goes away cancels its request; a finished request is forgotten once
its answer is delivered (or, if the server never delivered it, by the janitor).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from specq.errors import SpecqError
from specq.queue import sync
from specq.queue.control import Target, cancel
from specq.queue.store import BatchStore
from specq.queue.submit import RequestChecker
from specq.queue.vocabulary import RequestState
from specq.requests import checkpoint
from specq.requests.config import BatchConfig
from specq.requests.inputs import CHAT_URL, parse_line
from specq.requests.result import Result, request_id
from specq.server import MAX_SYNC_REQUESTS
from specq.server.news import POLL_S, News
from specq.specdec.completion_text import final_text_so_far

FINISHED = (RequestState.COMPLETED, RequestState.FAILED, RequestState.CANCELLED)
JANITOR_S = 30.0
# A reader that cannot reach Redis keeps trying this long (a restart takes seconds).
REDIS_PATIENCE_S = 60.0

log = logging.getLogger("specq.server")


class CompletionError(Exception):
    """Refused before anything was enqueued: (status, message, param)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass(frozen=True)
class Snapshot:
    state: str | None  # None: the request is gone from Redis
    text: str  # final so far
    result: dict[str, Any] | None
    error: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        return self.state is None or self.state in FINISHED


@dataclass(frozen=True)
class Submitted:
    custom_id: str
    url: str
    record: dict[str, Any]
    stream: bool
    include_usage: bool
    created: int

    def ident(self, batch_id: str) -> str:
        prefix = "chatcmpl" if self.url == CHAT_URL else "cmpl"
        return f"{prefix}-{request_id(batch_id, self.custom_id)}"


class SyncCompletions:
    def __init__(
        self,
        client: redis.Redis,
        config: BatchConfig,
        queue: str,
        model_file: str,
        model_name: str,
        max_in_flight: int = MAX_SYNC_REQUESTS,
    ) -> None:
        self.client = client
        self.max_in_flight = max_in_flight
        self.config = sync.sync_config(config)
        self.queue = queue
        self.batch_id = sync.sync_batch_id(self.config, queue)
        self.store = BatchStore(client, self.batch_id)
        self.checker = RequestChecker(model_file)
        self.model_name = model_name
        self.news: News | None = None
        self._janitor: asyncio.Task | None = None

    # --- the server's life -----------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.news = News(self.client, self.batch_id, loop)
        self.news.start()
        self._janitor = loop.create_task(self._sweep_forever())

    def stop(self) -> None:
        if self.news is not None:
            self.news.stop()
        if self._janitor is not None:
            self._janitor.cancel()

    async def _sweep_forever(self) -> None:
        """Forget requests finished for a whole pass that nobody here is reading: the
        answers of clients gone, or of a server that stopped (another server with the
        same options shares the batch, and reads its answers within POLL_S)."""
        seen: set[str] = set()
        while True:
            await asyncio.sleep(JANITOR_S)
            try:
                seen = await run_in_threadpool(self._sweep, seen)
            except (redis.RedisError, OSError):
                pass  # next pass

    def _sweep(self, seen_before: set[str]) -> set[str]:
        finished = {rid for rid, st in self.store.states().items() if st in FINISHED}
        following = set(self.news.waiters) if self.news else set()
        for rid in (finished & seen_before) - following:
            sync.forget(self.client, self.batch_id, rid)
        return finished

    # --- one request -------------------------------------------------------------
    async def respond(self, url: str, body: dict[str, Any], request: Request) -> Response:
        # The requests being followed (their readers' wake-up events) are the ones in flight.
        if self.news is not None and len(self.news.waiters) >= self.max_in_flight:
            raise CompletionError(
                429, f"{self.max_in_flight} synchronous requests are in progress already; retry later"
            )
        submitted = await run_in_threadpool(self._submit, url, body)
        if submitted.stream:
            return StreamingResponse(
                self._events(submitted),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await self._whole(submitted, request)

    def _submit(self, url: str, body: dict[str, Any]) -> Submitted:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise CompletionError(400, "'stream' must be true or false", "stream")
        options = body.get("stream_options")
        if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
            raise CompletionError(400, "'stream_options' is {\"include_usage\": bool}, with stream", "stream_options")
        custom_id = "req-" + secrets.token_hex(12)
        line = {
            "custom_id": custom_id,
            "method": "POST",
            "url": url,
            "body": {k: v for k, v in body.items() if k not in ("stream", "stream_options")},
        }
        try:
            record = self.checker.record(parse_line(line, 1, ""), self.config)
        except SpecqError as exc:
            raise CompletionError(400, _as_request_error(str(exc))) from None
        if not sync.listening_workers(self.client, self.queue):
            raise CompletionError(
                503, f"no specq worker is running for queue {self.queue!r}; start one with `specq worker`"
            )
        sync.enqueue(self.client, self.batch_id, self.config, self.queue, custom_id, record)
        include_usage = bool((options or {}).get("include_usage"))
        return Submitted(custom_id, url, record, stream, include_usage, int(time.time()))

    async def _whole(self, submitted: Submitted, request: Request) -> Response:
        last = None
        async with contextlib.aclosing(self._follow(submitted.custom_id)) as snapshots:
            async for snap in snapshots:
                last = snap
                if not snap.finished and await request.is_disconnected():
                    break
        self._let_go(submitted.custom_id, last)
        if last is None or not last.finished:
            return Response(status_code=499)  # nobody is there to read it
        if last.result is None:
            status, error = _failure(last)
            return JSONResponse({"error": error}, status)
        line = self._result(submitted, last.result)
        return JSONResponse({**line["response"]["body"], "specq": line["specq"]})

    async def _events(self, submitted: Submitted) -> AsyncIterator[str]:
        last = None
        sent = ""
        try:
            if submitted.url == CHAT_URL:
                yield _event(self._chunk(submitted, delta={"role": "assistant", "content": ""}))
            async with contextlib.aclosing(self._follow(submitted.custom_id)) as snapshots:
                async for snap in snapshots:
                    last = snap
                    text = snap.result["text"] if snap.result else snap.text
                    if len(text) > len(sent) and text.startswith(sent):
                        yield _event(self._chunk(submitted, piece=text[len(sent) :]))
                        sent = text
                    elif not text.startswith(sent):
                        log.error("request %s: its text no longer extends what was streamed", submitted.custom_id)
            if last is not None and last.result is not None:
                line = self._result(submitted, last.result)
                body = line["response"]["body"]
                yield _event(self._chunk(submitted, finish=body["choices"][0]["finish_reason"]))
                if submitted.include_usage:
                    yield _event({**self._chunk(submitted), "choices": [], "usage": body["usage"]})
                yield "data: [DONE]\n\n"
            elif last is not None:
                yield _event({"error": _failure(last)[1]})
        finally:
            # Reached also when the client went away (the stream is cancelled).
            self._let_go(submitted.custom_id, last)

    def _chunk(self, submitted: Submitted, *, delta: dict | None = None, piece: str = "", finish: str | None = None):
        if submitted.url == CHAT_URL:
            kind = "chat.completion.chunk"
            choice = {"delta": delta if delta is not None else ({"content": piece} if piece else {})}
        else:
            kind, choice = "text_completion", {"text": piece}
        return {
            "id": submitted.ident(self.batch_id),
            "object": kind,
            "created": submitted.created,
            "model": submitted.record.get("model") or self.model_name,
            "choices": [{"index": 0, **choice, "finish_reason": finish, "logprobs": None}],
        }

    def _result(self, submitted: Submitted, stored: dict[str, Any]) -> dict[str, Any]:
        result = Result.from_stored(stored, submitted.record["request"]["prompt_ids"])
        model = submitted.record.get("model") or self.model_name
        line = result.line(endpoint=submitted.url, model=model, batch_id=self.batch_id)
        line["response"]["body"]["created"] = submitted.created
        return line

    async def _follow(self, rid: str) -> AsyncIterator[Snapshot]:
        """A snapshot now, then one each time a worker says the request changed (or
        every POLL_S), until it is finished."""
        event = asyncio.Event()
        assert self.news is not None
        self.news.waiters[rid] = event
        failing_since = None
        try:
            while True:
                event.clear()
                try:
                    snap = await run_in_threadpool(self._read, rid)
                except (redis.RedisError, OSError):
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > REDIS_PATIENCE_S:
                        raise
                    await asyncio.sleep(POLL_S)
                    continue
                failing_since = None
                yield snap
                if snap.finished:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), POLL_S)
        finally:
            self.news.waiters.pop(rid, None)

    def _read(self, rid: str) -> Snapshot:
        k = self.store.keys
        pipe = self.client.pipeline(transaction=False)
        for key in (k.state, k.ckpt, k.result, k.error):
            pipe.hget(key, rid)
        state, saved, result, error = [v.decode() if v is not None else None for v in pipe.execute()]
        text = ""
        if saved and not result:
            with contextlib.suppress(SpecqError):  # unreadable: shown from the next one
                text = final_text_so_far(self.checker.tokenizer, checkpoint.decode(saved, None))
        return Snapshot(state, text, json.loads(result) if result else None, json.loads(error) if error else None)

    def _let_go(self, rid: str, last: Snapshot | None) -> None:
        """Forget a request whose answer went out; cancel one whose client left (the
        janitor forgets it once its worker has let go of it)."""
        try:
            if last is not None and last.finished:
                sync.forget(self.client, self.batch_id, rid)
            else:
                cancel(Target(self.store, rid))
                self.client.lrem(self.store.keys.pending, 0, rid)
        except (redis.RedisError, OSError) as exc:
            log.warning("could not let go of request %s (%s); the janitor will", rid, exc.__class__.__name__)


def _failure(snap: Snapshot) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI-shaped error of a request that finished without a result."""
    if snap.state is None:
        return 500, {"message": "the request is gone from the queue (deleted?)", "type": "server_error", "code": "lost"}
    if snap.state == RequestState.CANCELLED:
        message = "the request was cancelled (specq cancel on the synchronous batch?)"
        return 503, {"message": message, "type": "server_error", "code": "cancelled"}
    error = snap.error or {}
    message = error.get("message") or "the request failed"
    return 500, {"message": message, "type": "server_error", "code": error.get("reason") or "failed"}


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


_LINE_PREFIX = re.compile(r"^(line 1: |request '[^']*' \(line 1\): )")


def _as_request_error(message: str) -> str:
    """A Batch line's error, said of a request body: no line number to name."""
    return _LINE_PREFIX.sub("", message)

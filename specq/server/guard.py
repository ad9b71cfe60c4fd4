"""The server's outer gate, a plain ASGI middleware that runs before the application
reads a byte of the body: the API key on every /v1 route, and a bound on every
request body, counted as it arrives (a chunked upload sends no Content-Length, and
FastAPI parses bodies before it runs route dependencies)."""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


class Guard:
    def __init__(self, app: ASGIApp, *, api_key: str | None, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key is not None else None
        self.limit_for = limit_for  # path -> the largest body it may send

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        if scope["path"].startswith("/v1/") and not self._authorized(headers.get("authorization", b"")):
            await _respond(
                send,
                401,
                error_body(
                    "missing or wrong API key (Authorization: Bearer KEY)", "invalid_request_error", "invalid_api_key"
                ),
            )
            return
        limit = self.limit_for(scope["path"])
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _respond(send, 413, _too_large(limit))
            return
        await self._bounded(scope, receive, send, limit)

    def _authorized(self, given: bytes) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = given.partition(b" ")
        # Constant time in the token: how much of it matches leaks nothing.
        return scheme.lower() == b"bearer" and hmac.compare_digest(token, self.api_key)

    async def _bounded(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        received = 0
        answered = False  # by this gate: whatever the application sends after is dropped

        async def counted() -> Message:
            nonlocal received, answered
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if not started:
                        await _respond(send, 413, _too_large(limit))
                        answered = True
                    raise BodyTooLarge()
            return message

        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if answered:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if not answered:
                raise


def _too_large(limit: int) -> bytes:
    return error_body(f"request body is larger than the limit of {limit} bytes", "invalid_request_error")


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})

"""The HTTP application: the OpenAI Files and Batches APIs, specq's pause and resume,
synchronous completions (completions.py), the status page (page.py), /health and
Prometheus /metrics. Every route is a short read or write on the queue; decoding is
the workers' (there is no second path to the engine).

The API key and the bounds on request bodies are checked by the Guard around the
application (guard.py), before a byte of a body is read.

Errors have OpenAI's shape ({"error": {"message", "type", "param", "code"}}), so the
official client raises its own exception classes for them (401, 404, 400, 413, 429).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from specq.errors import SpecqError
from specq.jsonl import dumps_line
from specq.queue import control, keys
from specq.queue.connection import RedisUnavailable
from specq.queue.results import iter_results
from specq.queue.server_checks import require_noeviction
from specq.queue.status import BatchDamaged, overview, worker_details
from specq.queue.store import BatchStore
from specq.queue.submit import prepare, submit
from specq.requests.config import BatchConfig
from specq.requests.inputs import CHAT_URL, COMPLETIONS_URL
from specq.server import MAX_SYNC_REQUESTS, batches, page
from specq.server.completions import CompletionError, SyncCompletions
from specq.server.files import PURPOSES, FileStore, FileTooLarge
from specq.server.guard import Guard

# A batch request's JSON body is a few hundred bytes; anything near this is not one.
MAX_JSON_BODY = 64 * 2**10
# A completion request holds its prompt: the model's whole context is some 30 KiB of
# text, JSON escapes can multiply it by six.
MAX_COMPLETION_BODY = 2**20
PAGE_LIMIT = 100
EXPIRY_CHECK_S = 60.0
log = logging.getLogger("specq.server")


@dataclass(frozen=True)
class Settings:
    client: redis.Redis
    config: BatchConfig  # what the API's batches are decoded with (resolved once, at start)
    model_file: str
    model_name: str  # the id /v1/models lists
    queue: str
    files_dir: Path
    api_key: str | None = None
    max_file_bytes: int = 200 * 2**20
    max_sync_requests: int = MAX_SYNC_REQUESTS


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def _error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status)


def create_app(settings: Settings) -> Guard:
    store = FileStore(settings.files_dir, settings.max_file_bytes)
    client = settings.client
    completions = SyncCompletions(
        client,
        settings.config,
        settings.queue,
        settings.model_file,
        settings.model_name,
        max_in_flight=settings.max_sync_requests,
    )

    async def expire_forever() -> None:
        while True:
            await asyncio.sleep(EXPIRY_CHECK_S)
            try:
                await run_in_threadpool(batches.expire_overdue, client)
            except (redis.RedisError, SpecqError, OSError) as exc:
                log.warning("expiring overdue batches failed (%s); next pass", exc.__class__.__name__)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        completions.start()
        expiry = asyncio.get_running_loop().create_task(expire_forever())
        try:
            yield
        finally:
            expiry.cancel()
            completions.stop()

    app = FastAPI(title="specq", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(CompletionError)
    async def completion_error(request: Request, exc: CompletionError) -> JSONResponse:
        type_ = "server_error" if exc.status >= 500 else "invalid_request_error"
        return _error(exc.status, exc.message, type_, exc.param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        return _error(
            400, f"{where or 'request'}: {first.get('msg', 'invalid')}", "invalid_request_error", where or None
        )

    @app.exception_handler(redis.RedisError)
    async def redis_error(request: Request, exc: redis.RedisError) -> JSONResponse:
        log.warning("%s %s: Redis failed: %s: %s", request.method, request.url.path, exc.__class__.__name__, exc)
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.ReadOnlyError)):
            return _error(503, "the queue's Redis is unavailable; retry", "server_error")
        return _error(500, f"the queue's Redis refused a command: {exc}", "server_error")

    @app.exception_handler(SpecqError)
    async def specq_error(request: Request, exc: SpecqError) -> JSONResponse:
        # specq's own faults, raised by the queue's code: the user's (400), Redis (503),
        # or a batch whose keys were damaged (500, saying what is wrong).
        if isinstance(exc, RedisUnavailable):
            return _error(503, str(exc), "server_error")
        if isinstance(exc, BatchDamaged):
            return _error(500, f"batch damaged: {exc}", "server_error")
        return _error(400, str(exc), "invalid_request_error")

    @app.get("/health")
    def health() -> dict[str, Any]:
        try:
            client.ping()
        except redis.RedisError:
            return JSONResponse({"status": "unavailable", "redis": False}, 503)
        return {"status": "ok", "redis": True}

    @app.get("/metrics")
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from specq.queue.metrics import SpecqCollector

        registry = CollectorRegistry()
        registry.register(SpecqCollector(client))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/")
    def status_page() -> Response:
        return Response(page.HTML, media_type="text/html", headers={"Content-Security-Policy": page.CSP})

    @app.get("/status.js")
    def status_script() -> Response:
        return Response(page.SCRIPT, media_type="text/javascript", headers={"Content-Security-Policy": page.CSP})

    @app.get("/v1/specq/status")
    def queue_status() -> dict[str, Any]:
        """What the status page shows: every batch of the queue (the API's and the
        command line's alike) and the workers alive."""
        found = overview(client)
        return {"batches": found["batches"], "workers": worker_details(client, found["workers_alive"])}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        created = int(os.path.getmtime(settings.model_file))
        return {
            "object": "list",
            "data": [{"id": settings.model_name, "object": "model", "created": created, "owned_by": "specq"}],
        }

    # --- synchronous completions -------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(body: dict[str, Any], request: Request) -> Response:
        return await completions.respond(CHAT_URL, body, request)

    @app.post("/v1/completions")
    async def text_completions(body: dict[str, Any], request: Request) -> Response:
        return await completions.respond(COMPLETIONS_URL, body, request)

    # --- files -----------------------------------------------------------------
    @app.post("/v1/files")
    async def create_file(file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]) -> dict[str, Any]:
        if purpose not in PURPOSES:
            raise ApiError(400, f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}", param="purpose")

        async def chunks():
            while chunk := await file.read(1 << 20):
                yield chunk

        try:
            stored = await store.add(file.filename or "upload.jsonl", purpose, chunks())
        except FileTooLarge as exc:
            raise ApiError(413, str(exc), param="file") from None
        return stored.to_api()

    @app.get("/v1/files")
    def list_files(purpose: str | None = None) -> dict[str, Any]:
        found = [f.to_api() for f in store.list() if purpose in (None, f.purpose)]
        return {"object": "list", "data": found, "has_more": False}

    @app.get("/v1/files/{file_id}")
    def get_file(file_id: str) -> dict[str, Any]:
        stored = store.get(file_id)
        if stored is not None:
            return stored.to_api()
        result = _result_file(file_id)
        return {
            "id": file_id,
            "object": "file",
            "bytes": _result_bytes(result),
            "created_at": result["created_at"],
            "filename": f"{result['kind']}.jsonl",
            "purpose": "batch_output",
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }

    @app.get("/v1/files/{file_id}/content")
    def file_content(file_id: str) -> Response:
        path = store.path(file_id)
        if path is not None:
            return StreamingResponse(_read_file(path), media_type="application/jsonl")
        return StreamingResponse(_result_lines(_result_file(file_id)), media_type="application/jsonl")

    @app.delete("/v1/files/{file_id}")
    def delete_file(file_id: str) -> dict[str, Any]:
        if not store.delete(file_id):
            raise ApiError(404, f"no file {file_id!r}", code="not_found")
        return {"id": file_id, "object": "file", "deleted": True}

    def _result_file(file_id: str) -> dict[str, Any]:
        found = batches.batch_of_result_file(file_id)
        rec = batches.record(client, found[0]) if found else None
        if rec is None or not BatchStore(client, found[0]).exists():
            raise ApiError(404, f"no file {file_id!r}", code="not_found")
        return {
            "batch_id": found[0],
            "kind": found[1],
            "created_at": int(float(rec["created_at"])),
            "expired": bool(rec.get("expired_at")),
            "bytes": rec.get(f"{found[1]}_bytes"),
            "ended": bool(rec.get("ended_at") or rec.get("expired_at")),
        }

    def _result_lines(result: dict[str, Any]):
        for _, out, err in iter_results(BatchStore(client, result["batch_id"])):
            line = out if result["kind"] == "output" else err
            if line is None:
                continue
            if result["expired"] and line["error"] and line["error"]["code"] == "cancelled":
                line["error"] = {"code": "batch_expired", "message": "the batch expired before this request completed"}
            yield (dumps_line(line) + "\n").encode()

    def _result_bytes(result: dict[str, Any]) -> int:
        """The file's size: counted from its lines, and kept once the batch has ended
        (its lines no longer change)."""
        if result["bytes"] is not None:
            return int(result["bytes"])
        size = sum(len(chunk) for chunk in _result_lines(result))
        if result["ended"]:
            client.hset(keys.api_batch(result["batch_id"]), f"{result['kind']}_bytes", size)
        return size

    # --- batches ---------------------------------------------------------------
    @app.post("/v1/batches")
    def create_batch(body: dict[str, Any]) -> dict[str, Any]:
        input_file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        window, metadata = body.get("completion_window"), body.get("metadata")
        if endpoint not in batches.ENDPOINTS:
            raise ApiError(
                400, f"endpoint must be one of {', '.join(batches.ENDPOINTS)}, got {endpoint!r}", param="endpoint"
            )
        if window not in batches.COMPLETION_WINDOWS:
            raise ApiError(400, f"completion_window must be 24h, got {window!r}", param="completion_window")
        _check_metadata(metadata)
        path = store.path(input_file_id) if isinstance(input_file_id, str) else None
        if path is None:
            raise ApiError(404, f"no file {input_file_id!r}", param="input_file_id", code="not_found")
        require_noeviction(client)
        batch_id = batches.new_batch_id()
        now = time.time()
        fields = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": window,
            "metadata": metadata,
            "created_at": f"{now:.3f}",
        }
        filename = store.get(input_file_id).filename

        def shown(message: str) -> str:
            return message.replace(str(path), filename)  # the server's own paths are not the user's business

        def failed(errors: list[dict[str, Any]]) -> None:
            batches.save(
                client,
                batch_id,
                {**fields, "failed_at": f"{time.time():.3f}", "errors": {"object": "list", "data": errors}},
            )

        try:
            # The tokenizer the synchronous requests use, read once at start.
            records, invalid = prepare(str(path), settings.config, settings.model_file, completions.checker)
        except (SpecqError, OSError) as exc:  # an unreadable file: not UTF-8, say, or deleted meanwhile
            failed([{"code": "invalid_file", "message": shown(str(exc)), "param": None, "line": None}])
            return batches.to_api(client, batch_id, batches.record(client, batch_id))
        errors = [
            {"code": "invalid_request", "message": shown(bad.message), "param": None, "line": bad.line}
            for bad in invalid
        ]
        # As OpenAI's: every line names the batch's endpoint.
        errors += [
            _endpoint_error(line, record["endpoint"], endpoint)
            for line, _, record in records
            if record["endpoint"] != endpoint
        ]
        errors.sort(key=lambda e: e["line"])
        if errors or not records:
            failed(
                errors or [{"code": "empty_file", "message": "the file holds no requests", "param": None, "line": None}]
            )
            return batches.to_api(client, batch_id, batches.record(client, batch_id))
        try:
            submit(
                client,
                str(path),
                settings.config,
                model_file=settings.model_file,
                batch_id=batch_id,
                queue=settings.queue,
                prepared=(records, invalid),
            )
        except (SpecqError, OSError) as exc:
            failed([{"code": "invalid_file", "message": shown(str(exc)), "param": None, "line": None}])
        else:
            # Recorded once the queue holds the batch: no API batch is left half made
            # (a Redis error above is a 503 and leaves nothing the API lists).
            batches.save(client, batch_id, fields)
        return batches.to_api(client, batch_id, batches.record(client, batch_id))

    @app.get("/v1/batches")
    def list_batches(limit: int = 20, after: str | None = None) -> dict[str, Any]:
        if not 1 <= limit <= PAGE_LIMIT:
            raise ApiError(400, f"limit must be between 1 and {PAGE_LIMIT}", param="limit")
        ids, more = batches.listed(client, after, limit)
        data = [batches.to_api(client, b, rec) for b in ids if (rec := batches.record(client, b)) is not None]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }

    def _known(batch_id: str) -> dict[str, Any]:
        rec = batches.record(client, batch_id)
        if rec is None:
            raise ApiError(404, f"no batch {batch_id!r}", code="not_found")
        return rec

    @app.get("/v1/batches/{batch_id}")
    def get_batch(batch_id: str) -> dict[str, Any]:
        return batches.to_api(client, batch_id, _known(batch_id))

    def _control(batch_id: str, action: Callable[[control.Target], dict[str, int]]) -> dict[str, Any]:
        rec = _known(batch_id)
        if rec.get("failed_at"):
            raise ApiError(400, f"batch {batch_id} failed validation; there is nothing to {action.__name__}")
        action(control.resolve(client, batch_id))  # an InputError (the queue lost the batch) is a 400
        return batches.to_api(client, batch_id, batches.record(client, batch_id))

    @app.post("/v1/batches/{batch_id}/cancel")
    def cancel_batch(batch_id: str) -> dict[str, Any]:
        rec = _known(batch_id)
        status = batches.to_api(client, batch_id, rec)["status"]
        if status in ("completed", "failed"):
            raise ApiError(400, f"batch {batch_id} is {status}; only a batch in progress can be cancelled")
        if not rec.get("cancelling_at"):
            batches.save(client, batch_id, {"cancelling_at": f"{time.time():.3f}"})
        return _control(batch_id, control.cancel)

    @app.post("/v1/batches/{batch_id}/pause")
    def pause_batch(batch_id: str) -> dict[str, Any]:
        return _control(batch_id, control.pause)

    @app.post("/v1/batches/{batch_id}/resume")
    def resume_batch(batch_id: str) -> dict[str, Any]:
        return _control(batch_id, control.resume)

    def body_limit(path: str) -> int:
        if path == "/v1/files":
            return settings.max_file_bytes + 2**20
        return MAX_COMPLETION_BODY if path in batches.ENDPOINTS else MAX_JSON_BODY

    return Guard(app, api_key=settings.api_key, limit_for=body_limit)


def _endpoint_error(line: int, got: str, endpoint: str) -> dict[str, Any]:
    said = f"url {got!r}" if got else "no url (not a Batch request line)"
    return {
        "code": "mismatched_endpoint",
        "param": "url",
        "line": line,
        "message": f"line {line}: {said}, but the batch's endpoint is {endpoint!r}",
    }


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if (
        not isinstance(metadata, dict)
        or len(metadata) > batches.MAX_METADATA_PAIRS
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= batches.MAX_METADATA_KEY
            and len(v) <= batches.MAX_METADATA_VALUE
            for k, v in metadata.items()
        )
    ):
        raise ApiError(
            400,
            "metadata must be at most 16 string pairs (keys up to 64 characters, values up to 512)",
            param="metadata",
        )


def _read_file(path: Path):
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            yield chunk

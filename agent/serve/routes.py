"""The HTTP routes of `flywheel serve`, one module-level handler each, on `router`.

Handlers read what they serve from `http.app.state.served` (a `Served`, set by app.py's
`build_app`). A completion request goes: API key, follow the registry, parse and check the body,
then either one engine call in a worker thread (a client disconnect cancels it) or a stream of
server-sent events. A bad request is a 400, an engine failure a 500, and neither stops the server.

This module imports FastAPI at its top; app.py imports it only when an app is built, so
`flywheel serve --help` answers without FastAPI.
"""

# No `from __future__ import annotations`: FastAPI resolves the handlers' annotations.

import json
import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from agent.confidence import KEY as CONFIDENCE_KEY
from agent.engine import BadRequest, Cancelled, Delta, Engine, EngineError, Request, Result
from agent.serve.app import ServerConfig, StreamJob, next_delta
from agent.serve.metrics import ServerMetrics
from agent.serve.request_body import chat_request, completion_request, parse_body
from agent.serve.response_body import ResponseShape, error_body

log = logging.getLogger("flywheel.serve")
router = APIRouter()


@dataclass
class Served:
    """What one app serves: the engine, the server's settings, its counters, and the registry
    watcher (agent.registry.RegistryWatcher, or None) checked before each request."""

    engine: Engine
    config: ServerConfig
    metrics: ServerMetrics
    watcher: Any = None


def _served(http: HTTPRequest) -> Served:
    return http.app.state.served


async def _follow_registry(served: Served) -> None:
    """Switch to the registry's newly promoted version if there is one (one stat otherwise)."""
    if served.watcher is not None:
        await anyio.to_thread.run_sync(served.watcher.check)


def _fail(
    served: Served, status: int, message: str, kind: str, route: str, code: str | None = None
) -> JSONResponse:
    served.metrics.requests.labels(route, str(status)).inc()
    return JSONResponse(error_body(message, kind, code), status_code=status)


def _authorized(served: Served, http: HTTPRequest) -> bool:
    if served.config.api_key is None:
        return True
    header = http.headers.get("authorization", "")
    return secrets.compare_digest(header.encode(), f"Bearer {served.config.api_key}".encode())


def _unauthorized(served: Served, route: str) -> JSONResponse:
    return _fail(
        served,
        401,
        "missing or wrong API key: send `Authorization: Bearer <key>` with the key given "
        "to `flywheel serve --api-key`",
        "authentication_error",
        route,
        "invalid_api_key",
    )


async def http_error(http: HTTPRequest, exc: HTTPException) -> JSONResponse:
    """Unknown routes and wrong methods as OpenAI-style error bodies."""
    return JSONResponse(
        error_body(f"{http.method} {http.url.path}: {exc.detail}", "invalid_request_error"),
        status_code=exc.status_code,
    )


@router.get("/health")
async def health(http: HTTPRequest):
    return {"status": "ok", "model_version": _served(http).engine.model_version}


@router.get("/metrics")
async def prometheus(http: HTTPRequest):
    served = _served(http)
    if not _authorized(served, http):
        return _unauthorized(served, "/metrics")
    from prometheus_client import CONTENT_TYPE_LATEST

    body = served.metrics.render(served.engine.model_version)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(http: HTTPRequest):
    served = _served(http)
    if not _authorized(served, http):
        return _unauthorized(served, "/v1/models")
    await _follow_registry(served)
    served.metrics.requests.labels("/v1/models", "200").inc()
    card = {
        "id": served.config.served_model_name,
        "object": "model",
        "created": 0,
        "owned_by": "flywheel",
        "max_model_len": served.engine.context_length,
        "version": served.engine.model_version,
    }
    show_min = served.engine.show_min_confidence
    if show_min is not None:  # the model's own rule for inline suggestions travels with it
        card[CONFIDENCE_KEY] = show_min
    return {"object": "list", "data": [card]}


@router.post("/v1/completions")
async def completions(http: HTTPRequest):
    return await _complete(http, "/v1/completions", completion_request)


@router.post("/v1/chat/completions")
async def chat_completions(http: HTTPRequest):
    return await _complete(http, "/v1/chat/completions", chat_request)


async def _complete(http: HTTPRequest, route: str, make: Callable[..., Request]):
    """A completion route: check, make the engine request, answer whole or as a stream; every
    failure becomes an error body with its status."""
    served = _served(http)
    if not _authorized(served, http):
        return _unauthorized(served, route)
    cancel = threading.Event()
    await _follow_registry(served)
    try:
        body = parse_body(await http.body())
        name = served.config.served_model_name
        if body.get("model") not in (None, name):
            return _fail(
                served,
                404,
                f"model {body['model']!r} is not served here; this server serves "
                f"{name!r} (see /v1/models)",
                "invalid_request_error",
                route,
                "model_not_found",
            )
        request = make(body, cancel)
        shape = ResponseShape(request, body, name, served.engine.model_version)
        if body.get("stream"):
            return await _start_stream(served, route, request, shape)
        return await _answer_whole(served, http, route, request, shape)
    except BadRequest as exc:
        return _fail(served, 400, str(exc), "invalid_request_error", route)
    except Cancelled:
        served.metrics.cancelled.inc()
        return _fail(served, 499, "the request was cancelled", "cancelled", route)
    except EngineError as exc:
        log.error("engine error on %s: %s", route, exc)
        return _fail(served, 500, f"engine error: {exc}", "server_error", route)
    except Exception as exc:  # never let one request take the server down
        log.exception("unexpected error on %s", route)
        message = f"internal error: {type(exc).__name__}: {exc}"
        return _fail(served, 500, message, "server_error", route)


async def _answer_whole(
    served: Served, http: HTTPRequest, route: str, request: Request, shape: ResponseShape
) -> dict:
    metrics = served.metrics
    metrics.running.inc()
    try:
        result = await _run_to_end(served.engine, http, request)
    finally:
        metrics.running.dec()
    metrics.record(result.metrics)
    if request.cancel.is_set():
        metrics.cancelled.inc()
    metrics.requests.labels(route, "200").inc()
    return shape.response(result)


async def _run_to_end(engine: Engine, http: HTTPRequest, request: Request) -> Result:
    """engine.generate in a worker thread; a client disconnect sets the cancel event."""

    async def watch_disconnect() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass
        request.cancel.set()

    error: Exception | None = None
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watch_disconnect)
        try:
            result = await anyio.to_thread.run_sync(engine.generate, request)
        except Exception as exc:  # raised below, outside the task group (no ExceptionGroup)
            error = exc
        tasks.cancel_scope.cancel()
    if error is not None:
        raise error
    return result


async def _start_stream(
    served: Served, route: str, request: Request, shape: ResponseShape
) -> StreamingResponse:
    # Start here so that a bad request is still a plain 400, not an error event.
    stream = await anyio.to_thread.run_sync(served.engine.stream, request)
    job = StreamJob(stream, request, served.metrics)
    try:
        first = await anyio.to_thread.run_sync(next_delta, stream)
    except BaseException:
        await anyio.to_thread.run_sync(job.close, True)
        raise
    served.metrics.requests.labels(route, "200").inc()
    return StreamingResponse(
        _events(served.metrics, job, first, shape),
        media_type="text/event-stream",
        background=BackgroundTask(job.close, False),
    )


async def _events(
    metrics: ServerMetrics, job: StreamJob, first: Delta | None, shape: ResponseShape
):
    """Server-sent events for a started stream; runs the engine in worker threads."""

    def event(obj: dict) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    ended = False
    try:
        for chunk in shape.start(job.request.params.n):
            yield event(chunk)
        delta = first
        while delta is not None:
            for chunk in shape.delta(delta):
                yield event(chunk)
            delta = await anyio.to_thread.run_sync(next_delta, job.stream)
        result = job.stream.result
        metrics.record(result.metrics)
        for chunk in shape.end(result):
            yield event(chunk)
        ended = True
        yield "data: [DONE]\n\n"
    except Cancelled:
        pass  # the client went away; `job.close` counts it
    except Exception as exc:  # the status line is gone: report in the stream, then stop
        ended = True
        log.exception("error while streaming %s", job.request.request_id)
        kind = "invalid_request_error" if isinstance(exc, BadRequest) else "server_error"
        yield event(error_body(f"{type(exc).__name__}: {exc}", kind))
        yield "data: [DONE]\n\n"
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(job.close, ended)

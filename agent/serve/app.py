"""The HTTP app: routes, API-key check, engine calls in worker threads, SSE streaming.

`build_app(engine, ServerConfig(...), watcher)` returns a FastAPI app; cli.py runs it with uvicorn.
Request bodies are checked in request_body.py, responses shaped in response_body.py, counters kept
in metrics.py. A bad request is a 400, an engine failure a 500, and neither stops the server; a
client that disconnects cancels its request (`Request.cancel`).
"""

# No `from __future__ import annotations`: FastAPI resolves the handlers' annotations, and the
# handlers live inside `build_app` so that `flywheel serve --help` does not import FastAPI.

import json
import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.engine import BadRequest, Cancelled, Delta, Engine, EngineError, Request, Result, Stream
from agent.serve.metrics import ServerMetrics
from agent.serve.request_body import chat_request, completion_request, parse_body
from agent.serve.response_body import ResponseShape, error_body

log = logging.getLogger("flywheel.serve")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"  # interface to bind; 0.0.0.0 exposes the server to the network
    port: int = 8000  # TCP port
    api_key: str | None = None  # if set, clients must send `Authorization: Bearer <api_key>`
    served_model_name: str = "flywheel"  # the model id in /v1/models and in responses

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise BadRequest(f"port must be in [0, 65535], got {self.port}")


def _next(stream: Stream) -> Delta | None:
    try:
        return next(stream)
    except StopIteration:
        return None


class StreamJob:
    """One streaming request's engine stream, closed exactly once whichever way it ends.

    `close(ended=False)` means the client went away first: the request is cancelled (the engine
    stops within one step) and counted as cancelled. It is called from the event stream's own
    cleanup and again, as a safety net, after the response (a no-op the second time).
    """

    def __init__(self, stream: Stream, request: Request, metrics: "ServerMetrics") -> None:
        self.stream, self.request, self.metrics = stream, request, metrics
        self._lock = threading.Lock()
        self._closed = False
        metrics.running.inc()

    def close(self, ended: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.metrics.running.dec()
            if not ended:
                self.request.cancel.set()
                self.metrics.cancelled.inc()
            try:
                self.stream.close()
            except ValueError:  # still running in a worker thread: the cancel event ends it
                log.warning("stream %s closed while running", self.request.request_id)


def build_app(engine: Engine, config: ServerConfig | None = None, watcher: Any = None):
    """The FastAPI app serving `engine`. Run it with uvicorn (see `main`).

    `watcher` (agent.registry.RegistryWatcher): before each request, switch to the registry's
    newly promoted version if there is one (one stat when nothing changed)."""
    import anyio
    from fastapi import FastAPI
    from fastapi import Request as HTTPRequest
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException

    config = config or ServerConfig()
    metrics = ServerMetrics()
    app = FastAPI(title="flywheel serve", docs_url=None, redoc_url=None)
    app.state.engine, app.state.metrics = engine, metrics

    async def follow_registry() -> None:
        if watcher is not None:
            await anyio.to_thread.run_sync(watcher.check)

    def fail(status: int, message: str, kind: str, route: str, code: str | None = None):
        metrics.requests.labels(route, str(status)).inc()
        return JSONResponse(error_body(message, kind, code), status_code=status)

    def authorized(http: HTTPRequest) -> bool:
        if config.api_key is None:
            return True
        header = http.headers.get("authorization", "")
        return secrets.compare_digest(header.encode(), f"Bearer {config.api_key}".encode())

    def unauthorized(route: str):
        return fail(
            401,
            "missing or wrong API key: send `Authorization: Bearer <key>` with the key given "
            "to `flywheel serve --api-key`",
            "authentication_error",
            route,
            "invalid_api_key",
        )

    @app.exception_handler(HTTPException)
    async def http_error(http: HTTPRequest, exc: HTTPException):
        return JSONResponse(
            error_body(f"{http.method} {http.url.path}: {exc.detail}", "invalid_request_error"),
            status_code=exc.status_code,
        )

    @app.get("/health")
    async def health():
        return {"status": "ok", "model_version": engine.model_version}

    @app.get("/metrics")
    async def prometheus(http: HTTPRequest):
        if not authorized(http):
            return unauthorized("/metrics")
        from prometheus_client import CONTENT_TYPE_LATEST

        body = metrics.render(engine.model_version)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(http: HTTPRequest):
        if not authorized(http):
            return unauthorized("/v1/models")
        await follow_registry()
        metrics.requests.labels("/v1/models", "200").inc()
        card = {
            "id": config.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "flywheel",
            "max_model_len": engine.context_length,
            "version": engine.model_version,
        }
        return {"object": "list", "data": [card]}

    async def run_to_end(http: HTTPRequest, request: Request) -> Result:
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

    async def handle(http: HTTPRequest, route: str, make: Callable[..., Request]):
        if not authorized(http):
            return unauthorized(route)
        cancel = threading.Event()
        await follow_registry()
        try:
            body = parse_body(await http.body())
            if body.get("model") not in (None, config.served_model_name):
                return fail(
                    404,
                    f"model {body['model']!r} is not served here; this server serves "
                    f"{config.served_model_name!r} (see /v1/models)",
                    "invalid_request_error",
                    route,
                    "model_not_found",
                )
            request = make(body, cancel)
            shape = ResponseShape(request, body, config.served_model_name, engine.model_version)
            if body.get("stream"):
                # Start here so that a bad request is still a plain 400, not an error event.
                stream = await anyio.to_thread.run_sync(engine.stream, request)
                job = StreamJob(stream, request, metrics)
                try:
                    first = await anyio.to_thread.run_sync(_next, stream)
                except BaseException:
                    await anyio.to_thread.run_sync(job.close, True)
                    raise
                metrics.requests.labels(route, "200").inc()
                return StreamingResponse(
                    sse(job, first, shape),
                    media_type="text/event-stream",
                    background=BackgroundTask(job.close, False),
                )
            metrics.running.inc()
            try:
                result = await run_to_end(http, request)
            finally:
                metrics.running.dec()
            metrics.record(result.metrics)
            if cancel.is_set():
                metrics.cancelled.inc()
            metrics.requests.labels(route, "200").inc()
            return shape.response(result)
        except BadRequest as exc:
            return fail(400, str(exc), "invalid_request_error", route)
        except Cancelled:
            metrics.cancelled.inc()
            return fail(499, "the request was cancelled", "cancelled", route)
        except EngineError as exc:
            log.error("engine error on %s: %s", route, exc)
            return fail(500, f"engine error: {exc}", "server_error", route)
        except Exception as exc:  # never let one request take the server down
            log.exception("unexpected error on %s", route)
            return fail(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", route)

    async def sse(job: StreamJob, first: Delta | None, shape: ResponseShape):
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
                delta = await anyio.to_thread.run_sync(_next, job.stream)
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

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        return await handle(http, "/v1/completions", completion_request)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        return await handle(http, "/v1/chat/completions", chat_request)

    return app

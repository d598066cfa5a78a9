"""The HTTP app: its settings, the life of a streamed request, and the app put together.

`build_app(engine, ServerConfig(...), watcher)` returns a FastAPI app serving the routes of
routes.py; cli.py runs it with uvicorn. Request bodies are checked in request_body.py, responses
shaped in response_body.py, counters kept in metrics.py. A client that disconnects cancels its
request (`Request.cancel`). FastAPI is imported only inside `build_app`, so that
`flywheel serve --help` answers without it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from agent.engine import BadRequest, Delta, Engine, Request, Stream
from agent.serve.metrics import ServerMetrics

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


def next_delta(stream: Stream) -> Delta | None:
    """The stream's next delta; None at its end."""
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

    def __init__(self, stream: Stream, request: Request, metrics: ServerMetrics) -> None:
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
    """The FastAPI app serving `engine`. Run it with uvicorn (see cli.py's `main`).

    `watcher` (agent.registry.RegistryWatcher): before each request, switch to the registry's
    newly promoted version if there is one (one stat when nothing changed)."""
    from fastapi import FastAPI
    from starlette.exceptions import HTTPException

    from agent.serve import routes

    app = FastAPI(title="flywheel serve", docs_url=None, redoc_url=None)
    app.state.served = routes.Served(engine, config or ServerConfig(), ServerMetrics(), watcher)
    app.add_exception_handler(HTTPException, routes.http_error)
    app.include_router(routes.router)
    return app

"""The engine behind the language server: opened off the event loop, swapped on model change.

What it does: opens `agent.engine.open_engine` in a worker thread the first time a feature needs
it (so `initialize` answers at once), runs every engine call in worker threads (the event loop
keeps reading the client while a model decodes), counts running calls to report busy/idle, and
swaps the weights when the `model` setting changes. Every state change goes to `on_status`, which
the server turns into a `flywheel/status` notification. A base model that is not yet in the cache
(the first start: `agent.base.ensure_base` assembles and converts it, about a minute and a half) is
converted first, in a worker, with its progress sent to `on_progress(fraction, message)` on the
event loop, which the server shows as LSP work-done progress.

What it does not do: build prompts or decide what to record. A failed load is remembered: callers
get `EngineError` with the reason at once (no retry storm) until the model setting changes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent.engine import (
    Cancelled,
    Engine,
    EngineConfig,
    EngineError,
    Request,
    Result,
    SpeculativeConfig,
)
from agent.engine.config import default_dtype, default_speculative
from lsp.settings import ModelSettings

log = logging.getLogger("flywheel.lsp")


class ModelHost:
    def __init__(
        self,
        on_status: Callable[[dict[str, Any]], None],
        on_error: Callable[[str], None],
        workers: int = 4,
        on_progress: Callable[[float, str], None] | None = None,
    ) -> None:
        self.on_status = on_status
        self.on_error = on_error
        self.on_progress = on_progress
        self._errors_shown: set[str] = set()
        self.engine: Engine | None = None
        self.settings: ModelSettings | None = None
        self.error: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="flywheel-engine")
        self._loading: asyncio.Future[Engine] | None = None
        self._opening = False
        self._preparing: dict[str, Any] | None = None  # {percentage, message} of a first start
        self._running = 0
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return self.engine.model_version if self.engine is not None else ""

    @property
    def show_min(self) -> float | None:
        """The serving model's confidence threshold (agent/confidence.py): its folder's, or the
        one its server reports; None shows every suggestion."""
        return self.engine.show_min_confidence if self.engine is not None else None

    def status(self) -> dict[str, Any]:
        if self.error:
            state = "error"
        elif self._opening:
            state = "loading"
        elif self.engine is None:
            state = "stopped"
        else:
            state = "busy" if self._running else "idle"
        status = {"state": state, "modelVersion": self.version, "message": self.error or ""}
        if state == "loading" and self._preparing is not None:
            status["progress"] = dict(self._preparing)  # the base's conversion on a first start
        return status

    def _report(self) -> None:
        try:
            self.on_status(self.status())
        except Exception:  # a closed transport must not break a request
            log.debug("status notification failed", exc_info=True)

    async def get(self, settings: ModelSettings) -> Engine:
        """The engine for `settings`, opened (or swapped) first if needed."""
        if self.engine is not None and settings == self.settings:
            return self.engine
        if self.error and settings == self.settings:
            raise EngineError(self.error)
        if self._loading is None or self._loading.done() or settings != self.settings:
            self._opening = True
            self._loading = asyncio.ensure_future(self._open(settings))
            # _open logs and reports its own failure; a caller that stops waiting (a cancelled
            # request, a shutdown) must not leave it to asyncio as "never retrieved"
            self._loading.add_done_callback(_retrieved)
            self._report()
        return await asyncio.shield(self._loading)

    async def _open(self, settings: ModelSettings) -> Engine:
        loop = asyncio.get_running_loop()
        old, old_settings = self.engine, self.settings
        self.settings, self.error, self._opening = settings, None, True
        try:
            config = await loop.run_in_executor(
                self._pool, _prepare, settings, self._progress_from(loop)
            )
            same_backend = old_settings is not None and _kind(config) == _kind(
                engine_config(old_settings)
            )
            if old is not None and same_backend:
                await loop.run_in_executor(self._pool, old.swap, settings.name)
                engine = old
            else:
                engine = await loop.run_in_executor(self._pool, _open_engine, config)
                if old is not None:
                    self._pool.submit(old.close)
        except Exception as exc:
            self._opening = False
            self.engine = None if old is None else old
            self.error = _describe(exc, settings)
            self.error_once(self.error)
            self._report()
            raise EngineError(self.error) from exc
        self.engine, self._opening = engine, False
        self._report()
        return engine

    def _progress_from(self, loop: asyncio.AbstractEventLoop) -> Callable[[float, str], None]:
        """A progress callback for a worker thread that hands each report to the event loop."""

        def progress(fraction: float, message: str) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._prepared, fraction, message)

        return progress

    def _prepared(self, fraction: float, message: str) -> None:
        """A preparation report, on the event loop: to `on_progress` (work-done progress) and
        into the status (a client can show it as it likes; VS Code as a notification)."""
        done = fraction >= 1.0
        percentage = max(0, min(100, round(fraction * 100)))
        self._preparing = None if done else {"percentage": percentage, "message": message}
        if self.on_progress is not None:
            self.on_progress(fraction, message)
        self._report()

    def error_once(self, message: str) -> None:
        """Log an engine error and tell the user, once per distinct message."""
        if message in self._errors_shown:
            return
        self._errors_shown.add(message)
        log.error("%s", message)
        try:
            self.on_error(message)
        except Exception:
            log.debug("error notification failed", exc_info=True)

    async def call(self, fn: Callable[[Request], Any], request: Request) -> Any:
        """Run `fn(request)` (engine.generate, ...) in a worker; cancel the request if abandoned."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._running += 1
            first = self._running == 1
        if first:
            self._report()
        try:
            return await loop.run_in_executor(self._pool, _unless_cancelled, fn, request)
        except asyncio.CancelledError:
            if request.cancel is not None:
                request.cancel.set()
            raise
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                self._report()

    async def generate(self, settings: ModelSettings, request: Request) -> Result:
        engine = await self.get(settings)
        return await self.call(engine.generate, request)

    def close(self) -> None:
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                log.debug("engine close failed", exc_info=True)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _unless_cancelled(fn: Callable[[Request], Any], request: Request) -> Any:
    """A request cancelled while it waited for a worker (superseded) never reaches the engine."""
    if request.cancelled:
        raise Cancelled("cancelled before it started")
    return fn(request)


def _retrieved(task: asyncio.Future) -> None:
    """Mark a finished task's exception as seen (it was logged where it was raised)."""
    if not task.cancelled():
        task.exception()


def engine_config(settings: ModelSettings) -> EngineConfig:
    """The engine the `model` settings ask for; "auto" is `default_speculative` and
    `default_dtype`."""
    method = settings.speculative
    if method == "auto":
        method = default_speculative(settings.name)
    dtype = settings.dtype
    if dtype == "auto":
        dtype = default_dtype(settings.name, settings.backend, settings.device)
    return EngineConfig(
        model=settings.name,
        backend=settings.backend,
        device=settings.device,
        dtype=dtype,
        speculative=SpeculativeConfig(method),
        own_thread=True,  # completions, next edits and agent tasks call from many threads
    )


def _prepare(settings: ModelSettings, progress: Callable[[float, str], None]) -> EngineConfig:
    """In a worker: convert the base `settings` needs (once; reporting to `progress`), then the
    engine config, which reads the model folder."""
    from agent.base import ensure_base
    from agent.model import base_needed

    which = base_needed(settings.name)
    if which is not None:
        reported = []

        def report(fraction: float, message: str) -> None:
            reported.append(fraction)
            progress(fraction, message)

        try:
            ensure_base(which, report)
        except Exception:
            if reported:  # a progress the client shows must end
                progress(1.0, "the model could not be prepared")
            raise
    return engine_config(settings)


def _kind(config: EngineConfig) -> tuple:
    """What a weight swap keeps: a change here needs a new engine (a URL is another backend)."""
    return config.backend, config.device, config.dtype, config.speculative.method


def _open_engine(config: EngineConfig) -> Engine:
    from agent.engine import open_engine

    return open_engine(config)


def _describe(exc: BaseException, settings: ModelSettings) -> str:
    if isinstance(exc, ImportError):
        return (
            f"the {settings.backend} engine backend is not available ({exc}); "
            "install Flywheel with its dependencies or choose another model.backend"
        )
    return (
        f"cannot open model {settings.name!r}: {exc}. Set flywheel.model.name to a checkpoint "
        "folder, 'default', or an OpenAI-compatible URL"
    )

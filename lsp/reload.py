"""Hot reload for the language server: follow the model registry's promoted version.

`flywheel lsp --model registry` starts on the registry's promoted version (verified against its
manifest) and runs `RegistryFollower.run` on the event loop: every `--reload-interval` seconds
it asks `agent.registry.RegistryWatcher` (in a worker thread: a stat, and hashing when something
changed) whether another verified version is promoted. If so it points the server's model
setting at that version's folder and lets the engine host swap to it (`ModelHost.get` ->
`Engine.swap`): requests already running finish on the old weights, new ones wait for the swap.
The host then sends `flywheel/status` with the new `modelVersion`, and the server tells the user
(`window/showMessage`, "Flywheel now uses model ..."). A rollback is a promotion like any other.

Every suggestion and task records the engine's version (the registry id); each switch is also
recorded as a telemetry `model_version` event (id, path, promoted_at), and the completion cache
(suggestions of the old weights) is dropped.

The registry's completion lane (agent/registry.py) is followed the same way: when a version
serves inline completions alone (one trained on the user's repository, say), a second engine host
loads it, and the server's completions and next edits (`CompletionService.host`,
`NextEditService.host`) run on it while the agent keeps the promoted version; the status names
it as `completionModelVersion`. When the lane is rolled back to nothing, completions return to
the promoted version and the second engine is closed.

What it does not do: follow a registry when the user's settings chose another model (it only
acts while the server's model is a folder of this registry), or load anything unverified.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from lsprotocol import types

from agent.engine import EngineError
from agent.registry import Registry, RegistryError, RegistryWatcher
from lsp.model_host import ModelHost

log = logging.getLogger("flywheel.lsp")


class RegistryFollower:
    def __init__(self, root: str | Path, interval_s: float = 2.0) -> None:
        self.registry = Registry(root)
        self.watcher = RegistryWatcher(
            self.registry, swap=_no_swap, version=None, interval_s=interval_s
        )
        # the completion lane: its version is the promoted one until one of its own is set
        self.completions = RegistryWatcher(
            self.registry, swap=_no_swap, version=None, interval_s=interval_s, lane="completion"
        )

    def initial_model(self) -> str:
        """The promoted version's verified folder (RegistryError when there is none)."""
        promoted = self.registry.promoted()
        if promoted is None:
            raise RegistryError(
                f"no version of the registry {self.registry.root} is promoted yet: "
                "flywheel models add PATH --promote --force, or flywheel cycle"
            )
        folder = self.registry.verify(promoted)
        self.watcher.mark(promoted)
        self.completions.mark(promoted)  # a completion version of its own loads on the first poll
        return str(folder)

    def follows(self, model_name: str) -> bool:
        return Path(model_name).parent == self.registry.root / "versions"

    async def run(self, ls: Any) -> None:
        """Poll forever (the task ends with the server's event loop)."""
        while True:
            await asyncio.sleep(self.watcher.interval_s)
            try:
                await self.check(ls)
            except Exception:  # one bad poll must not end hot reload
                log.exception("registry follow failed")

    async def check(self, ls: Any) -> str | None:
        """Switch the server to a newly promoted version (and its completions to the completion
        lane's); returns the promoted version it switched to, or None."""
        if not self.follows(ls.settings.model.name):
            await self._serve_completions(ls, None)  # the user chose another model: all of it
            return None
        switched = await self._check_promoted(ls)
        await self._check_completions(ls)
        return switched

    async def _check_promoted(self, ls: Any) -> str | None:
        loop = asyncio.get_running_loop()
        target = await loop.run_in_executor(None, self.watcher.pending)
        if target is None:
            return None
        version, folder = target
        model = dataclasses.replace(ls.settings.model, name=str(folder))
        ls.settings = dataclasses.replace(ls.settings, model=model)
        ls.defaults = dataclasses.replace(ls.defaults, model=model)
        try:
            await ls.host.get(model)
        except EngineError as exc:  # the host told the user; keep what runs now
            self.watcher.defer(f"could not load {version}: {exc}")
            return None
        if ls.host.version != version:
            self.watcher.defer(f"{folder} loaded as {ls.host.version!r}, not {version}")
            return None
        self.watcher.mark(version)
        # Cached suggestions came from the old weights: drop them (rebuilt on the next request).
        ls.completions.cache = None
        if ls.recorder is not None:
            record = self.registry.get(version)
            ls.recorder.record(
                "model_version",
                id=version,
                parent=record.get("parent"),
                stage=record.get("stage"),
                path=str(folder),
                promoted_at=record.get("promoted_at") or time.time(),
            )
        log.info("now serving %s from the registry", version)
        return version

    async def _check_completions(self, ls: Any) -> None:
        loop = asyncio.get_running_loop()
        target = await loop.run_in_executor(None, self.completions.pending)
        if target is None:
            return
        version, folder = target
        own = version != self.watcher.version  # else the promoted version: the server's host
        try:
            await self._serve_completions(ls, (version, folder) if own else None)
        except EngineError as exc:  # the host told the user; completions stay where they are
            self.completions.defer(f"could not load {version} for completions: {exc}")
            return
        self.completions.mark(version)
        if own:
            ls.say_once(
                f"inline completions now come from {version}; the agent stays on "
                f"{self.watcher.version}",
                types.MessageType.Info,
            )
        log.info("completions now come from %s", version)

    async def _serve_completions(self, ls: Any, target: tuple[str, Path] | None) -> None:
        """Completions and next edits from `target` (version, folder) on a second engine host,
        or (None) from the server's own host again. EngineError when the version fails to load
        or loads as another."""
        current = ls.completions.host
        if target is None:
            if current is not ls.host:
                ls.completions.host = ls.next_edits.host = ls.host
                ls.completion_model = None
                ls.completions.cache = None
                ls._send_status(ls.host.status())
                # requests still on it end as cancelled; closing waits for its threads
                await asyncio.get_running_loop().run_in_executor(None, current.close)
            return
        version, folder = target
        model = dataclasses.replace(ls.settings.model, name=str(folder))
        host = current
        if host is ls.host:  # the status of either host is the server's, with both versions
            host = ModelHost(
                on_status=lambda _: ls._send_status(ls.host.status()), on_error=ls._show_error
            )
        try:
            await host.get(model)
            if host.version != version:
                raise EngineError(f"{folder} loaded as {host.version!r}, not {version}")
        except EngineError:
            if host is not current:
                host.close()
            raise
        ls.completions.host = ls.next_edits.host = host
        ls.completion_model = model
        ls.completions.cache = None
        ls._send_status(ls.host.status())


def _no_swap(folder: str) -> str:
    raise AssertionError("the language server swaps through its engine host")

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

from agent.engine import EngineError
from agent.registry import Registry, RegistryWatcher

log = logging.getLogger("flywheel.lsp")


class RegistryFollower:
    def __init__(self, root: str | Path, interval_s: float = 2.0) -> None:
        self.registry = Registry(root)
        self.watcher = RegistryWatcher(
            self.registry, swap=_no_swap, version=None, interval_s=interval_s
        )

    def initial_model(self) -> str:
        """The promoted version's verified folder (RegistryError when there is none)."""
        promoted = self.registry.promoted()
        if promoted is None:
            from agent.registry import RegistryError

            raise RegistryError(
                f"no version of the registry {self.registry.root} is promoted yet: "
                "flywheel models add PATH --promote --force, or flywheel cycle"
            )
        folder = self.registry.verify(promoted)
        self.watcher.mark(promoted)
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
        """Switch the server to a newly promoted version; returns it, or None."""
        if not self.follows(ls.settings.model.name):
            return None
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


def _no_swap(folder: str) -> str:
    raise AssertionError("the language server swaps through its engine host")

"""The model's first-run preparation, shown in the editor while it happens.

On a first start the base model is assembled and converted into the cache (agent/base.py,
about a minute and a half); `ModelHost` hands each of `ensure_base`'s progress reports to a
`LoadProgress` on the event loop. Each report becomes:

  - a work-done progress with a percentage (`window/workDoneProgress/create`, then `$/progress`
    begin, report ... end on one token), when the client supports it: Neovim shows it through
    `LspProgress` / `vim.lsp.status()`, VS Code's language client in its status bar;
  - one `window/logMessage` line, for every client (the server's output panel or log).

The fraction 1.0 ends the progress. Reports are sent in order by one task, so `begin` always
comes after the client answered `create`. Nothing here writes to stdout itself: the messages
go through the server's LSP writer like any other.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from lsprotocol import types

log = logging.getLogger("flywheel.lsp")

TITLE = "Flywheel: preparing the model"
TOKEN_PREFIX = "flywheel-model-"
_tokens = itertools.count(1)


class LoadProgress:
    def __init__(self, ls: Any) -> None:
        self.ls = ls  # the FlywheelServer
        self._queue: asyncio.Queue[tuple[float, str]] | None = None
        self._sender: asyncio.Future | None = None

    def __call__(self, fraction: float, message: str) -> None:
        """One report (on the event loop): queued, sent in order by one task."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._sender = asyncio.ensure_future(self._send_all(self._queue))
        self._queue.put_nowait((fraction, message))

    async def _send_all(self, queue: asyncio.Queue[tuple[float, str]]) -> None:
        token: str | None = None
        while True:
            fraction, message = await queue.get()
            ls = self.ls
            if ls.client_gone:
                return
            percentage = max(0, min(100, round(fraction * 100)))
            ls.window_log_message(
                types.LogMessageParams(
                    type=types.MessageType.Info,
                    message=f"Flywheel: preparing the model: {percentage}% {message}",
                )
            )
            if token is None and fraction < 1.0:
                token = await self._begin(message, percentage)
            elif token is not None and fraction < 1.0:
                ls.work_done_progress.report(
                    token, types.WorkDoneProgressReport(message=message, percentage=percentage)
                )
            if token is not None and fraction >= 1.0:
                ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
                token = None
            if fraction >= 1.0 and queue.empty():  # done: a later preparation starts anew
                self._queue = self._sender = None
                return

    async def _begin(self, message: str, percentage: int) -> str | None:
        """A new work-done progress, or None when the client has no such support."""
        ls = self.ls
        caps = ls.client_capabilities.window
        if not (caps and caps.work_done_progress):
            return None
        token = f"{TOKEN_PREFIX}{next(_tokens)}"
        try:
            await asyncio.wait_for(ls.work_done_progress.create_async(token), timeout=5)
        except Exception as exc:  # the client refused or did not answer: the log lines remain
            log.warning("the client did not create a progress (%s); logging only", exc)
            return None
        ls.work_done_progress.begin(
            token,
            types.WorkDoneProgressBegin(
                title=TITLE, message=message, percentage=percentage, cancellable=False
            ),
        )
        return token

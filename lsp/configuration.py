"""The client's settings for the server: the "flywheel" section, pulled and applied.

Settings arrive three ways: `initializationOptions` (server.py's `initialize`), the answer to
`workspace/configuration` (pulled after `initialized` and on every change notification without
settings), and `workspace/didChangeConfiguration` with the section inline. Each overlays the
current settings (lsp/settings.py parses and checks them); a changed telemetry setting reopens
the recorder.

What it does not do: fail on a reply that does not fit. A client that answers `null`, or not a
list, or never answers leaves the settings as they are, logged once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException

from lsp.protocol import short
from lsp.settings import parse_settings

if TYPE_CHECKING:
    from lsp.server import FlywheelServer

CONFIGURATION_TIMEOUT_S = 10.0  # a client that never answers workspace/configuration


async def pull_configuration(ls: FlywheelServer) -> None:
    """Ask the client for the "flywheel" section. A reply that does not fit (`null`, not a
    list) fails at once (lsp/protocol.py): the settings stay as they are, logged once."""
    caps = ls.client_capabilities.workspace
    if not (caps and caps.configuration):
        return
    try:
        items = await asyncio.wait_for(
            ls.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="flywheel")])
            ),
            timeout=CONFIGURATION_TIMEOUT_S,
        )
    except TimeoutError:
        reason = f"no answer within {CONFIGURATION_TIMEOUT_S:g} s"
    except JsonRpcException as exc:
        reason = short(exc) or f"error {exc.code}"
    else:
        items = list(items) if isinstance(items, list | tuple) else items
        if isinstance(items, list) and items and isinstance(items[0], dict | type(None)):
            if items[0] is not None:
                apply_settings(ls, items[0])
            return
        reason = f"expected a list with one object, got {short(items, 80)}"
    ls.protocol.log_once(
        "configuration", f"workspace/configuration gave no settings ({reason}); using the defaults"
    )


def apply_settings(ls: FlywheelServer, data: Any) -> None:
    """Overlay the client's "flywheel" section on the current settings; warn about bad values.
    A setting the client sends as `null` goes back to the server's own (flags, file)."""
    old = ls.settings
    ls.settings, warnings = parse_settings(data, old, ls.defaults)
    for w in warnings:
        ls.say_once(w)
    if ls.settings.telemetry != old.telemetry:
        ls.open_recorder()

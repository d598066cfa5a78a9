"""`flywheel lsp`: start the language server on stdio (what editors run) or TCP (debugging).

    flywheel lsp                                  # stdio, the editor starts it
    flywheel lsp --model ./ckpt --consent metrics # defaults that client settings may override
    flywheel lsp --tcp --port 2087                # attach a client by hand; logs to stderr
    flywheel lsp --setup                          # the lines that set up Neovim and VS Code

This is the only place that reads the environment: the telemetry database defaults to
$FLYWHEEL_DB, else $XDG_DATA_HOME/flywheel/telemetry.db (~/.local/share when unset).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import BinaryIO

from agent.model import add_model_argument


class _OnceFilter(logging.Filter):
    """Let the first record with this message through; pygls logs every malformed message."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message, self.seen = message, False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != self.message:
            return True
        seen, self.seen = self.seen, True
        return not seen


class _CancelledRequestFilter(logging.Filter):
    """Drop asyncio's traceback for a request cancelled because the client went away.

    When stdin closes, asyncio cancels the running handlers and pygls then reads the cancelled
    future's result, which asyncio logs as an error; the server has already recorded the cancel.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM: stop tasks and completions, flush telemetry, exit now.

    The stdin reader thread may be blocked in a read that nothing interrupts, so the process
    exits with os._exit once everything is on disk instead of unwinding the event loop.
    """
    from lsp.server import SERVER

    try:
        SERVER.close()
    finally:
        os._exit(0)


def guard_stdout() -> BinaryIO:
    """The LSP channel, and nothing else on stdout.

    File descriptor 1 is copied to a private descriptor that only the LSP writer gets; then
    descriptor 1 and `sys.stdout` are pointed at stderr. A library's `print`, a C extension's
    write to fd 1 or a child process that inherits it all land on stderr (the editor's log),
    never in the middle of an LSP message."""
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "wb")  # buffered: the writer flushes each message
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def setup_lines() -> str:
    """The few lines that set up each editor with this checkout's client and `flywheel`."""
    import json
    import shutil
    from pathlib import Path

    clients = Path(__file__).resolve().parent / "clients"
    beside = Path(sys.executable).parent / "flywheel"
    program = str(beside) if beside.exists() else shutil.which("flywheel") or "flywheel"
    plugin, vsix = clients / "nvim", clients / "vscode" / "flywheel.vsix"
    return "\n".join(
        [
            "Neovim 0.11+ (ghost text and next edits need 0.12), in init.lua:",
            f"  vim.opt.runtimepath:append({json.dumps(str(plugin))})",
            f'  vim.lsp.config("flywheel", {{ cmd = {{ {json.dumps(program)}, "lsp" }} }})',
            '  vim.lsp.enable("flywheel")',
            "",
            "VS Code (builds the extension once, then installs it):",
            f"  bash {clients / 'vscode' / 'build.sh'}",
            f"  code --install-extension {vsix}",
            f'and in settings.json: "flywheel.server.command": [{json.dumps(program)}, "lsp"]',
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel lsp",
        description="The Flywheel language server: inline completions, agent tasks with "
        "reviewable edits, feedback and kept-code tracking, over LSP.",
    )
    transport = p.add_argument_group("transport")
    transport.add_argument("--tcp", action="store_true", help="serve TCP instead of stdio")
    transport.add_argument("--host", default="127.0.0.1", help="TCP address (default 127.0.0.1)")
    transport.add_argument("--port", type=int, default=2087, help="TCP port (default 2087)")
    transport.add_argument(
        "--setup", action="store_true", help="print the lines that set up each editor, and exit"
    )
    model = p.add_argument_group("defaults (the client's settings override them)")
    add_model_argument(model, default=None, default_help="'default'")
    model.add_argument("--consent", choices=("off", "metrics", "code"), help="telemetry consent")
    model.add_argument("--db", help="telemetry SQLite file (default: $FLYWHEEL_DB or XDG data)")
    model.add_argument(
        "--registry",
        help="with --model registry: the model registry to follow (default: $FLYWHEEL_REGISTRY "
        "or $XDG_DATA_HOME/flywheel/models)",
    )
    model.add_argument(
        "--reload-interval",
        type=float,
        default=2.0,
        help="with --model registry: seconds between checks for a promoted version (default 2)",
    )
    debug = p.add_argument_group("debugging")
    debug.add_argument("--log-file", help="write the server log here (default: stderr)")
    debug.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ERROR")
    debug.add_argument(
        "--manual-clock",
        action="store_true",
        help="tests only: time moves by the flywheel/debug/advanceClock request",
    )
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.setup:
        print(setup_lines())
        return 0
    if not args.tcp and sys.stdin.isatty():  # a person, not an editor, started it
        print(
            "flywheel lsp: waiting for an editor on stdin; editors start this command "
            "themselves. To set one up:\n\n" + setup_lines() + "\n",
            file=sys.stderr,
        )
    level = getattr(logging, str(args.log_level).upper(), None)
    if not isinstance(level, int):
        print(f"flywheel lsp: unknown --log-level {args.log_level!r}", file=sys.stderr)
        return 2
    handler: logging.Handler = (
        logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    # pygls logs every message body at INFO: a 5 MB didOpen must not be copied into the log.
    logging.getLogger("pygls").setLevel(max(level, logging.WARNING))
    logging.getLogger("pygls.server").addFilter(_OnceFilter("Unable to handle message"))
    logging.getLogger("asyncio").addFilter(_CancelledRequestFilter())

    from lsp.server import configure

    follower, model = None, args.model
    if model == "registry":  # serve the registry's promoted version and follow it (lsp/reload.py)
        from agent.registry import RegistryError, path_from_cli
        from lsp.reload import RegistryFollower

        try:
            follower = RegistryFollower(path_from_cli(args.registry), args.reload_interval)
            model = follower.initial_model()
        except (RegistryError, ValueError) as exc:
            print(f"flywheel lsp: {exc}", file=sys.stderr)
            return 2
    from telemetry.folders import db_path

    try:
        server = configure(
            model=model,
            consent=args.consent,
            db_path=str(db_path(args.db)),
            manual_clock=args.manual_clock,
        )
    except ValueError as exc:
        print(f"flywheel lsp: {exc}", file=sys.stderr)
        return 2
    server.registry_follower = follower
    signal.signal(signal.SIGTERM, _terminate)  # an editor stopping us: end like `exit` does
    try:
        if args.tcp:
            server.start_tcp(args.host, args.port)
        else:
            # returns when the client exits or goes away (stdin closed)
            server.start_io(stdout=guard_stdout())
    finally:
        server.close()  # stop running tasks, end the telemetry session, flush it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

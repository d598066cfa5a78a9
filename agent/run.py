"""`flywheel run`: one agent task, headless, in a workspace folder.

    flywheel run "Fix the failing test in test_calc.py" --workspace ./project --model default
    flywheel run "..." --workspace . --model http://127.0.0.1:8000/v1 --approve yes
    flywheel run --resume THREAD --checkpoint-db agent.db --workspace .   # after a restart

Shows each step as it happens (the model's turn, each tool call and its result), then the final
answer and the diff. Model and tool text is printed literally: never read as Rich markup or emoji
codes, so `[/]`, `[bold]` or `:x:` appear as written. Exit status: 0 when the model answered, 1
when the task stopped for any other reason (a limit, an engine error at any point, repeated
failures, a vanished workspace), 2 for bad usage (no such workspace, a model that cannot be
opened), 3 when the task is left waiting for an approval (`--approve no-wait`), resumable with
`--resume`, 130 when interrupted. Ctrl-C (or SIGTERM) cancels the task: it stops before the next
model turn or tool call, as `cancelled`, and is recorded with its changes so far; a second Ctrl-C
quits at once. Every error is one line on stderr, never a traceback.

`--model` is the one model flag: "default" (the built-in starter model), a checkpoint folder,
or an http(s) URL of an OpenAI-compatible server; it becomes `EngineConfig(model=...)`. A server
that does not report its context length gets a stated default length (with a warning) unless
`--context-length` gives it. Commands run in the sandbox (agent/harness/sandbox.py); it
shows them the folders given with `--read-only` besides the system, the interpreters and the
workspace; without bubblewrap they are refused unless `--allow-unconfined`.
Telemetry goes to `--telemetry-db` (default: $FLYWHEEL_DB, else
$XDG_DATA_HOME/flywheel/telemetry.db); `--no-telemetry` records nothing.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.engine import Engine
    from agent.harness import Harness, HarnessConfig, Outcome, Workspace
    from telemetry.recorder import Recorder


def build_parser() -> argparse.ArgumentParser:
    from agent.engine.config import DTYPES, SPEC_METHODS
    from agent.model import add_model_argument

    p = argparse.ArgumentParser(
        prog="flywheel run",
        description="Run an agent task headless in a workspace; print the answer and the diff.",
    )
    p.add_argument("instruction", nargs="?", help="what the agent should do")
    p.add_argument("--workspace", "-w", default=".", help="project folder (default: .)")
    add_model_argument(p)
    p.add_argument("--served-model-name", help="model name to ask an OpenAI-compatible server for")
    p.add_argument(
        "--context-length",
        type=int,
        metavar="TOKENS",
        help="context length of an OpenAI-compatible server (default: what its /v1/models "
        "reports, else an assumed default, with a warning)",
    )
    limits = p.add_argument_group("limits")
    limits.add_argument("--max-steps", type=int, default=30, help="model turns (default 30)")
    limits.add_argument("--max-tokens", type=int, default=500_000, help="prompt+output tokens")
    limits.add_argument("--time-limit", type=float, default=900.0, help="running seconds")
    limits.add_argument("--turn-tokens", type=int, default=2048, help="output tokens per turn")
    limits.add_argument("--command-timeout", type=float, default=60.0, help="seconds per command")
    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=0.0)
    sampling.add_argument("--seed", type=int)
    sampling.add_argument(
        "--dtype",
        choices=DTYPES,
        help="local engine weights (default: int8 for decoding on a CPU, else float32)",
    )
    sampling.add_argument(
        "--speculative",
        choices=[m for m in SPEC_METHODS if m != "draft"],
        help="local engine drafts (the output is distributed as without them); default ngram+mtp "
        "for a model with MTP heads, else ngram; none for a server",
    )
    sandbox = p.add_argument_group("sandbox (what agent commands can see)")
    sandbox.add_argument(
        "--read-only",
        action="append",
        default=[],
        metavar="PATH",
        help="a folder commands may read besides the system, the interpreters and the workspace, "
        "e.g. a toolchain in /opt (repeatable)",
    )
    sandbox.add_argument(
        "--allow-unconfined",
        action="store_true",
        help="without bubblewrap, run commands unconfined (each asks for approval) instead of "
        "refusing them",
    )
    control = p.add_argument_group("approval and checkpoints")
    control.add_argument(
        "--approve",
        choices=["ask", "yes", "no", "no-wait"],
        default="ask",
        help="risky actions: ask on the terminal (no when not interactive), approve all, deny "
        "all, or stop and wait (resume later with --resume)",
    )
    control.add_argument("--checkpoint-db", help="SQLite file for checkpoints (resumable tasks)")
    control.add_argument("--thread", help="thread id for a new task (default: random)")
    control.add_argument("--resume", metavar="THREAD", help="resume a task waiting for approval")
    control.add_argument("--test-command", help="the project's test command (default: detected)")
    tel = p.add_argument_group("telemetry")
    tel.add_argument("--telemetry-db", help="telemetry database file")
    tel.add_argument("--no-telemetry", action="store_true", help="record nothing")
    p.add_argument("--quiet", "-q", action="store_true", help="no live progress")
    return p


def _short(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f" … [{len(text) - limit} more chars]"


def _line(*parts: str | tuple[str, str]) -> Any:
    """A line of literal text: each part is a string, or (string, style); nothing is markup."""
    from rich.text import Text

    return Text.assemble(*parts)


def _progress(console: Any) -> Any:
    def show(event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "assistant":
            console.print(
                _line(
                    (f"step {event['step']}", "bold cyan"),
                    " ",
                    (f"({event['duration_s']:.1f} s)", "dim"),
                )
            )
            if event["content"]:
                console.print(_line("  ", _short(event["content"])))
            for call in event["calls"]:
                args = _short(str(call["arguments"]), 200)
                console.print(_line("  ", (f"→ {call['name']}", "yellow"), " ", args))
            for error in event["errors"]:
                console.print(
                    _line("  ", ("✗ malformed tool call:", "red"), " ", _short(error, 200))
                )
        elif kind == "tool":
            mark = ("✗", "red") if event["is_error"] else ("✓", "green")
            result = _short(event["result"], 200)
            console.print(_line("  ", mark, " ", f"{event['name']}: {result}"))
        elif kind == "compact":
            console.print(
                _line(
                    (
                        f"compacted the history ({event['before']} → {event['after']} messages)",
                        "magenta",
                    )
                )
            )
        elif kind == "rules":
            cut = " (cut to its budget)" if event["truncated"] else ""
            console.print(_line(("project rules:", "dim"), f" {', '.join(event['files'])}{cut}"))
        elif kind == "stop":
            console.print(_line(("stopped:", "bold"), f" {event['reason']} {event['detail']}"))

    return show


def _decide(approval: dict[str, Any], mode: str, console: Any) -> Any:
    calls = approval.get("calls", [])
    if mode == "yes":
        return True
    if mode == "no" or not sys.stdin.isatty():
        return False
    from rich.prompt import Confirm

    decision = {}
    for call in calls:
        console.print(
            _line(
                ("approval needed", "bold yellow"),
                f": {call['name']} {call['arguments']} ({call['reason']})",
            )
        )
        decision[call["id"]] = Confirm.ask("allow?", console=console, default=False)
    return decision


class _Warnings(logging.Handler):
    """Shows the library's warnings (flywheel.* loggers) as one line each on stderr."""

    def __init__(self, err: Any) -> None:
        super().__init__(logging.WARNING)
        self.err = err

    def emit(self, record: logging.LogRecord) -> None:
        self.err.print(_line(("warning:", "yellow"), " ", record.getMessage()))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rich.console import Console

    # markup=False, emoji=False: model and tool text is printed as written; styles come from Text.
    kw = {"highlight": False, "soft_wrap": True, "markup": False, "emoji": False}
    console = Console(stderr=False, **kw)
    err = Console(stderr=True, **kw)
    logger = logging.getLogger("flywheel")
    handler = _Warnings(err)
    logger.addHandler(handler)
    try:
        return _run(args, console, err)
    finally:
        logger.removeHandler(handler)


class _Refused(Exception):
    """`flywheel run` cannot go on: the message is its one line on stderr, `code` its exit status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _run(args: argparse.Namespace, console: Any, err: Any) -> int:
    from agent.engine import EngineError
    from agent.harness import Harness

    try:
        workspace, config, engine = _open(args)
    except _Refused as exc:
        err.print(f"flywheel run: {exc}")
        return exc.code
    recorder = None if args.no_telemetry else _recorder(args.telemetry_db, err)
    harness = None
    cancel = threading.Event()
    try:
        harness = Harness(
            engine,
            workspace,
            config,
            recorder=recorder,
            checkpoint_db=args.checkpoint_db,
            on_event=None if args.quiet else _progress(console),
        )  # the sandbox warns here, once, when bubblewrap is missing
        outcome = _drive(harness, args, console, err, cancel)
    except _Refused as exc:
        err.print(f"flywheel run: {exc}")
        return exc.code
    except EngineError as exc:
        err.print(f"flywheel run: the model failed: {_one_line(exc)}")
        return 1
    except ValueError as exc:
        err.print(f"flywheel run: {_one_line(exc)}")
        return 2
    except Exception as exc:  # a bug must still end in one line, not a traceback
        err.print(f"flywheel run: internal error: {type(exc).__name__}: {_one_line(exc)}")
        return 1
    finally:
        if harness is not None:
            harness.close()
        if recorder is not None:
            recorder.close()
        engine.close()
    if outcome is None:
        return 3
    _show(outcome, console)
    if cancel.is_set():
        return 130
    return 0 if outcome.ok else 1


def _open(args: argparse.Namespace) -> tuple[Workspace, HarnessConfig, Engine]:
    """The workspace, the harness settings and the engine the flags name; _Refused (exit 2)
    when the flags do not make sense or any of them cannot be had."""
    if not args.instruction and not args.resume:
        raise _Refused(2, "give an instruction, or --resume THREAD to continue a task")
    if args.resume and not args.checkpoint_db:
        raise _Refused(2, "--resume needs --checkpoint-db, the file the task was saved in")

    from agent.engine import EngineConfig, EngineError, SpeculativeConfig, open_engine
    from agent.engine.config import default_dtype, default_speculative
    from agent.harness import Workspace, WorkspaceError

    try:
        workspace = Workspace(args.workspace)
    except WorkspaceError as exc:
        raise _Refused(2, str(exc)) from None
    try:
        config = _harness_config(args)
        engine_config = EngineConfig(
            model=args.model,
            served_model_name=args.served_model_name,
            dtype=args.dtype or default_dtype(args.model),
            speculative=SpeculativeConfig(args.speculative or default_speculative(args.model)),
        )
    except ValueError as exc:
        raise _Refused(2, str(exc)) from None
    if args.context_length is not None and engine_config.backend != "openai":
        raise _Refused(
            2,
            "--context-length is for an OpenAI-compatible server (--model "
            "http://...); a checkpoint states its own",
        )
    try:
        if engine_config.backend == "openai":
            from agent.engine.backends.openai import OpenAIEngine

            engine = OpenAIEngine(engine_config, context_length=args.context_length)
        else:
            engine = open_engine(engine_config)
    except (EngineError, OSError, ValueError) as exc:
        raise _Refused(2, f"cannot open model {args.model!r}: {_one_line(exc)}") from None
    return workspace, config, engine


def _harness_config(args: argparse.Namespace) -> HarnessConfig:
    from agent.harness import HarnessConfig, SandboxConfig, ToolsConfig

    return HarnessConfig(
        max_steps=args.max_steps,
        max_tokens=args.max_tokens,
        max_wall_s=args.time_limit,
        turn_max_tokens=args.turn_tokens,
        temperature=args.temperature,
        seed=args.seed,
        tools=ToolsConfig(test_command=args.test_command, command_timeout_s=args.command_timeout),
        sandbox=SandboxConfig(
            timeout_s=max(args.command_timeout, 300.0),
            read_only_paths=tuple(args.read_only),
            allow_unconfined=args.allow_unconfined,
        ),
    )


def _recorder(telemetry_db: str | None, err: Any) -> Recorder:
    """The telemetry recorder (a warning when it cannot record)."""
    from telemetry.folders import db_path
    from telemetry.recorder import Recorder

    path = db_path(telemetry_db)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(path)
    if not recorder.enabled:
        err.print(_line(("warning:", "yellow"), f" {recorder.error}"))
    return recorder


def _drive(
    harness: Harness, args: argparse.Namespace, console: Any, err: Any, cancel: threading.Event
) -> Outcome | None:
    """Start the task (or take up the one `--resume` names) and answer its approval requests;
    returns its outcome, or None when it is left waiting for an approval (`--approve no-wait`)."""

    def say(line: str) -> None:
        err.print(f"flywheel run: {line}")

    if args.resume:
        outcome = harness.status(args.resume)
        if not outcome.messages:
            raise _Refused(2, f"no task {args.resume!r} in {args.checkpoint_db}")
    else:
        with ctrl_c_cancels(cancel, say):
            outcome = harness.start(args.instruction, thread_id=args.thread, cancel=cancel)
    while outcome.approval is not None:
        if args.approve == "no-wait":
            console.print(
                _line(
                    ("waiting for approval", "bold yellow"),
                    f": {outcome.approval.get('calls')}\n"
                    f"resume with: flywheel run --resume {outcome.thread_id} "
                    f"--checkpoint-db {args.checkpoint_db or '(needs --checkpoint-db)'} "
                    f"--workspace {args.workspace} --approve yes",
                )
            )
            return None
        decision = _decide(outcome.approval, args.approve, console)
        with ctrl_c_cancels(cancel, say):
            outcome = harness.resume(outcome.thread_id, decision, cancel=cancel)
    return outcome


def _show(outcome: Outcome, console: Any) -> None:
    """The final answer, the diff and one line of totals."""
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text

    if outcome.final:
        console.print(Panel(Text(outcome.final), title="answer"))
    if outcome.diff:
        console.print(Syntax(outcome.diff, "diff", word_wrap=True))
    else:
        console.print(_line(("(no changes)", "dim")))
    status = "done" if outcome.ok else f"stopped: {outcome.stop_reason}"
    console.print(
        f"{status}{': ' + outcome.detail if outcome.detail else ''} — {outcome.steps} steps, "
        f"{outcome.tokens} tokens, {outcome.tool_errors} tool errors, thread {outcome.thread_id}"
    )


@contextmanager
def ctrl_c_cancels(cancel: threading.Event, say: Callable[[str], None]) -> Iterator[None]:
    """While a harness task runs, the first Ctrl-C or SIGTERM (`timeout`, a CI job's end) sets
    `cancel`: the harness stops at its next check, records the task as cancelled and returns it.
    A second signal interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; a caller's thread keeps its own
        return

    def on_signal(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        say(f"{name}: cancelling the task after the current step (Ctrl-C again to quit now)")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":  # through the CLI, which turns Ctrl-C into one line
    from agent.cli import main as cli

    sys.exit(cli(["run", *sys.argv[1:]]))

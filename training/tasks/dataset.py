"""The task dataset on disk: tasks.jsonl, trajectories.jsonl, recovery.jsonl, apply.jsonl and
manifest.json."""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import asdict
from pathlib import Path

from training.tasks.fast_apply import fast_apply_example
from training.tasks.generation import in_order
from training.tasks.oracle import MISTAKES, oracle_trajectory
from training.tasks.task import Task, TaskRejected


def export(
    tasks: list[Task],
    out: str | Path,
    seed: int = 0,
    samples_per_task: int = 1,
    workers: int = 1,
    test_first: float = 1.0,
    diagnose: bool = False,
) -> dict:
    """Write tasks.jsonl, trajectories.jsonl, apply.jsonl (each row has its split) + manifest.

    `test_first` is the share of bug-fix trajectories that run the tests before their first
    edit and `diagnose` whether they say what is wrong before it (`oracle_trajectory`); the
    manifest records both.

    Each task's trajectories and fast-apply example draw from a generator seeded by `seed` and
    the task's id, so the output does not depend on `workers` (processes running the oracles),
    except for what the test runs print that varies anyway (timings, scratch-folder names).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"tasks": {}, "trajectories": 0, "apply": 0}
    jobs = [(task, seed, samples_per_task, test_first, diagnose) for task in tasks]
    with (
        (out / "tasks.jsonl").open("w") as tf,
        (out / "trajectories.jsonl").open("w") as jf,
        (out / "apply.jsonl").open("w") as af,
    ):
        for task, (rows, failed, apply_row) in zip(
            tasks, in_order(_task_rows, jobs, workers), strict=True
        ):
            tf.write(json.dumps(asdict(task)) + "\n")
            counts["tasks"][task.split] = counts["tasks"].get(task.split, 0) + 1
            for row in rows:
                jf.write(json.dumps(row) + "\n")
            counts["trajectories"] += len(rows)
            if failed:
                counts["oracle_failed"] = counts.get("oracle_failed", 0) + failed
            af.write(json.dumps(apply_row) + "\n")
            counts["apply"] += 1
    families: dict[str, int] = {}
    for task in tasks:
        families[task.family] = families.get(task.family, 0) + 1
    manifest = {
        "format": "flywheel-tasks/1",
        "counts": counts,
        "families": families,
        "test_commands": sorted({task.test_command for task in tasks}),
        "seed": seed,
        "test_first": test_first,
        "diagnose": diagnose,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    write_recovery(tasks, out, seed, workers, test_first)
    return manifest


def write_recovery(
    tasks: list[Task], out: str | Path, seed: int = 0, workers: int = 1, test_first: float = 1.0
) -> int:
    """Write recovery.jsonl: for each task, one trajectory whose first edit is a mistake the
    harness reports, then the fix (`oracle_trajectory(..., mistake=)`); returns the row count.
    Written to a temporary name first, so a killed run never leaves a partial file."""
    out = Path(out)
    part = out / "recovery.jsonl.part"
    count = 0
    with part.open("w") as f:
        jobs = [(task, seed, test_first) for task in tasks]
        for row in in_order(recovery_row, jobs, workers):
            if row is not None:
                f.write(json.dumps(row) + "\n")
                count += 1
    part.replace(out / "recovery.jsonl")
    return count


def recovery_row(job: tuple[Task, int, float]) -> dict | None:
    """One task's recovery trajectory: the mistakes in a random order, the first that the task
    allows (None when it allows none)."""
    task, seed, test_first = job
    rng = random.Random(f"recovery:{seed}:{task.id}")
    for mistake in rng.sample(MISTAKES, len(MISTAKES)):
        try:
            return oracle_trajectory(task, rng, mistake=mistake, test_first=test_first)
        except TaskRejected:
            continue
    return None


def _task_rows(job: tuple[Task, int, int, float, bool]) -> tuple[list[dict], int, dict]:
    """One task's oracle trajectories, how many failed, and its fast-apply example."""
    task, seed, samples, test_first, diagnose = job
    rng = random.Random(f"export:{seed}:{task.id}")
    rows, failed = [], 0
    for _ in range(samples):
        try:
            rows.append(oracle_trajectory(task, rng, test_first=test_first, diagnose=diagnose))
        except TaskRejected:
            failed += 1
    return rows, failed, fast_apply_example(task, rng)


def stable_text(text: str) -> str:
    """`text` with what a test run prints that differs between two runs of the same oracle
    masked: durations ("in 0.03s") and the oracle's scratch-folder names."""
    text = re.sub(r"in \d+\.\d+s", "in Ts", text)
    return re.sub(r"flywheel-oracle-\w+", "flywheel-oracle-X", text)


def stable_sha256(path: str | Path) -> str:
    """The sha256 of a dataset file's `stable_text`: equal for two exports of the same tasks with
    the same settings, so a lineage's hash can be checked by re-running the export."""
    digest = hashlib.sha256()
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            digest.update(stable_text(line).encode())
    return digest.hexdigest()


def load_tasks(path: str | Path, split: str | None = None) -> list[Task]:
    path = Path(path)
    file = path / "tasks.jsonl" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no tasks at {str(file)!r}; make them with `flywheel train tasks`")
    tasks = [Task(**json.loads(line)) for line in file.read_text().splitlines() if line.strip()]
    return [t for t in tasks if split is None or t.split == split]

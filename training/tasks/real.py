"""Training tasks from the real-code set's train split (training/real_tasks.py).

The synthetic projects (projects.py, templates.py) share one style: a model trained only on them
learns that style, and on other code (the demo's project, a user's, HumanEval) it guesses a
synthetic family instead of reading the bug. The real-code set puts the same bug families, and
function bodies to write (`rewrite/body`), into real functions of the standard library and the
installed packages, each with its own unittest file. Its train split (whole packages, never the
held-out ones) becomes `Task`s here, so the oracle (oracle.py) writes trajectories for them and
SFT sees real code beside the synthetic projects (training/recipes/sft_real.toml, an
experiment: not a step of `flywheel train starter`, see that recipe).

    python -m training.tasks.real --real runs/real --out runs/starter/tasks
        -> real_trajectories.jsonl, real_recovery.jsonl (written whole; the counts are printed)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from training.tasks.generation import default_workers, in_order
from training.tasks.task import Task, TaskRejected

FILES = ("real_trajectories.jsonl", "real_recovery.jsonl")


def training_tasks(rows: list[dict]) -> list[Task]:
    """The train split's rows (training/real_tasks.py's tasks.jsonl) as Tasks with the notes the
    oracle's answers use: the function, and for a bug its line before and after."""
    tasks = []
    for row in rows:
        if row["split"] != "train":
            continue
        bench, solution = row["task"], row["solution"]
        notes: dict = {"function": row["function"]}
        if bench["family"].startswith("bugfix/"):
            [(path, fixed)] = solution.items()
            broken_lines, fixed_lines = bench["files"][path].splitlines(), fixed.splitlines()
            changed = [
                i for i, (a, b) in enumerate(zip(broken_lines, fixed_lines, strict=True)) if a != b
            ]
            if len(changed) != 1:  # a mutation changes one line; anything else is not ours
                continue
            at = changed[0]
            notes.update(
                line=at + 1, mutated=broken_lines[at].strip(), original=fixed_lines[at].strip()
            )
        tasks.append(
            Task(
                id=bench["id"],
                family=bench["family"],
                project=f"real:{row['package']}",
                split="train",
                instruction=bench["instruction"],
                files=bench["files"],
                solution=solution,
                test_command=bench["verify"],
                notes=notes,
            )
        )
    return tasks


def write_trajectories(
    tasks: list[Task], out: str | Path, seed: int = 0, workers: int = 1
) -> dict[str, int]:
    """real_trajectories.jsonl (one oracle trajectory per task) and real_recovery.jsonl (one
    recovery trajectory per task that allows a mistake) in `out`, each written to a temporary
    name and renamed, so a killed run leaves no partial file. Returns the row counts."""
    from training.tasks.dataset import recovery_row

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    jobs = [(task, seed, 1.0) for task in tasks]  # (task, seed, test_first): see recovery_row
    for name, make in zip(FILES, (_plain_row, recovery_row), strict=True):
        part = out / f"{name}.part"
        count = 0
        with part.open("w") as f:
            for row in in_order(make, jobs, workers):
                if row is not None:
                    f.write(json.dumps(row) + "\n")
                    count += 1
        part.replace(out / name)
        counts[name] = count
    return counts


def _plain_row(job: tuple[Task, int, float]) -> dict | None:
    from training.tasks.oracle import oracle_trajectory

    task, seed, _ = job
    try:
        return oracle_trajectory(task, random.Random(f"real:{seed}:{task.id}"))
    except TaskRejected:
        return None


def main(argv: list[str] | None = None) -> int:
    from training.real_tasks import read_rows

    p = argparse.ArgumentParser(
        prog="python -m training.tasks.real", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--real", required=True, help="a real-code set (python -m training.real_tasks --out)"
    )
    p.add_argument("--out", required=True, help="the tasks folder to add the trajectories to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=default_workers())
    args = p.parse_args(argv)
    try:
        tasks = training_tasks(read_rows(args.real))
    except FileNotFoundError as e:
        print(f"python -m training.tasks.real: {e}", file=sys.stderr)
        return 2
    counts = write_trajectories(tasks, args.out, args.seed, args.workers)
    print(f"{len(tasks)} train tasks -> " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

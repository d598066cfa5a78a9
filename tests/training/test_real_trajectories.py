"""The real-code set's train split as SFT data (training/tasks/real.py): each train task becomes a
Task with its bug's line, and the oracle solves it through the harness's own tools."""

from __future__ import annotations

import json

import pytest

from training.tasks.real import FILES, build, training_tasks, write_trajectories
from training.tasks.task import run_tests

# One train package (datetime) and one held-out (colorsys), built for real (a few seconds).
FEW = [("datetime", "_ymd2ord"), ("colorsys", "rgb_to_hsv")]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    found, _ = build(seed=0, only=FEW, workers=1)
    assert {r["split"] for r in found} == {"train", "heldout"}
    return found


def test_only_the_train_split_becomes_tasks_with_the_bug_line(rows):
    tasks = training_tasks(rows)
    assert tasks and all(t.split == "train" and t.project == "real:datetime" for t in tasks)
    assert len(tasks) == sum(r["split"] == "train" for r in rows)
    for task in tasks:
        [(path, fixed)] = task.solution.items()
        assert run_tests(task.files, task.test_command)[0] != 0  # broken before
        assert run_tests({**task.files, **task.solution}, task.test_command)[0] == 0
        if task.family.startswith("bugfix/"):
            line = task.files[path].splitlines()[task.notes["line"] - 1]
            assert line.strip() == task.notes["mutated"] != task.notes["original"]
            assert fixed.splitlines()[task.notes["line"] - 1].strip() == task.notes["original"]
    assert {"rewrite/body"} < {t.family for t in tasks}


def test_the_oracle_writes_plain_and_recovery_trajectories_that_end_in_passing_tests(
    rows, tmp_path
):
    tasks = training_tasks(rows)
    counts = write_trajectories(tasks, tmp_path, seed=0, workers=1)
    assert counts[FILES[0]] == len(tasks) and 0 < counts[FILES[1]] <= len(tasks)
    assert not list(tmp_path.glob("*.part"))  # written whole
    for name in FILES:
        for row in map(json.loads, (tmp_path / name).read_text().splitlines()):
            messages = row["messages"]
            assert row["split"] == "train" and messages[-1]["role"] == "assistant"
            assert messages[-2]["role"] == "tool" and messages[-2]["content"].startswith(
                "tests passed"
            )

"""Which task the next RL job samples: rollouts go where the outcome is still uncertain.

A group teaches nothing when every sample passes or every one fails (equal rewards, zero
advantage), so the run keeps success counts from every returned training group:

    per task     passed / total over the run, and its last `curriculum_min_samples` outcomes
    per family   the same over all its tasks; the family is `task.family` (harness tasks), else
                 the task id up to its last "/", else the task id itself (its own family)

A task is *settled* once it has at least `curriculum_min_samples` outcomes and is

    always solved   its last `curriculum_min_samples` samples all passed (recent: a task the
                    policy learned during the run counts once its failures are old enough)
    never solved    none of its samples ever passed (one success shows it can be learned)

and *open* otherwise. A task without samples of its own is judged the same way on its family's
counts, or is open and unknown. Each job picks, with probability `curriculum_explore`, a settled
task uniformly (a policy can forget a task it no longer trains on, or find one it never solved;
one such sample reopens it), otherwise an open task with probability proportional to p(1-p), the
variance of its pass/fail reward, where p is its recent success rate (its family's when it has
none; 0.5 when unknown) smoothed as (passed + 0.5) / (n + 1), so a task seen a few times is
still picked now and then. The draw is seeded by the run's seed and the job number, and
the counts live in the checkpoint's state, so a resumed run goes on with the same counts and the
same draws. When every task is settled there is nothing left to learn and the run stops.

Counts can start from an evaluation (`curriculum_seed`: the JSON `flywheel train eval --json`
writes): each per-task result adds one outcome to its family, and to its task when the task is
one of the run's training tasks. `curriculum_min_samples = 0` turns all of this off: tasks then
come in a shuffled round robin, a new shuffle each pass over them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SOLVED, UNSOLVED, OPEN = "solved", "unsolved", "open"


def task_id(task) -> str:
    return str(getattr(task, "id", task))


def task_family(task) -> str:
    """`task.family` when the task has one, else its id up to the last "/", else its id."""
    family = getattr(task, "family", "")
    if family:
        return str(family)
    tid = task_id(task)
    return tid.rsplit("/", 1)[0] if "/" in tid else tid


class Curriculum:
    """Task choice for the run's jobs (see the module docstring).

    `counts` is the run state's dict, updated in place so a checkpoint always holds the current
    counts: {"tasks": {id: entry}, "families": {name: entry}}, each entry [passed, total,
    recent outcomes as a string of 0s and 1s]."""

    def __init__(self, tasks: list, min_samples: int, explore: float, seed: int, counts: dict):
        self.tasks = tasks
        self.min_samples = min_samples
        self.explore = explore
        self.seed = seed
        self.counts = counts
        counts.setdefault("tasks", {})
        counts.setdefault("families", {})

    @property
    def enabled(self) -> bool:
        return self.min_samples > 0

    # -- counts ----------------------------------------------------------------------------

    def _add(self, table: str, key: str, outcomes: list[bool]) -> None:
        passed, total, recent = self.counts[table].get(key, (0, 0, ""))
        recent += "".join("01"[o] for o in outcomes)
        self.counts[table][key] = [
            passed + sum(outcomes),
            total + len(outcomes),
            recent[-self.min_samples :],
        ]

    def record(self, task, outcomes: list[bool]) -> None:
        """Add one group's pass/fail outcomes for `task` (and its family)."""
        if not self.enabled or not outcomes:
            return
        self._add("tasks", task_id(task), outcomes)
        self._add("families", task_family(task), outcomes)

    def seed_from_eval(self, path: str | Path) -> int:
        """Add the per-task results of an evaluation report; returns how many were used."""
        if not self.enabled:
            return 0
        report = json.loads(Path(path).read_text())
        if not isinstance(report, dict) or not isinstance(report.get("results"), list):
            raise ValueError(
                f"{path} has no per-task `results`: use the JSON of `flywheel train eval --json` "
                "with a single --model (the run's init)"
            )
        by_id = {task_id(t): t for t in self.tasks}
        used = 0
        for row in report["results"]:
            task = by_id.get(str(row.get("task_id", "")))
            if "passed" not in row or (task is None and not row.get("family")):
                continue
            if task is not None:
                self.record(task, [bool(row["passed"])])
            else:
                self._add("families", str(row["family"]), [bool(row["passed"])])
            used += 1
        return used

    def counted(self, task) -> list | None:
        """[passed, total, recent] of the task, else of its family, else None (unknown)."""
        return self.counts["tasks"].get(task_id(task)) or self.counts["families"].get(
            task_family(task)
        )

    def status(self, task) -> str:
        counted = self.counted(task)
        if not self.enabled or counted is None or counted[1] < self.min_samples:
            return OPEN
        passed, _, recent = counted
        if passed == 0:
            return UNSOLVED
        return SOLVED if recent.count("1") >= self.min_samples else OPEN

    def weight(self, task) -> float:
        """p(1-p), p the recent success rate smoothed towards 0.5 (0.25 for an unknown task)."""
        counted = self.counted(task)
        p = 0.5 if counted is None else (counted[2].count("1") + 0.5) / (len(counted[2]) + 1)
        return p * (1 - p)

    # -- choice ----------------------------------------------------------------------------

    def pick(self, job: int):
        """The task of job number `job`: a function of the seed, `job` and the counts."""
        n = len(self.tasks)
        if not self.enabled:
            epoch, index = divmod(job, n)
            order = list(range(n))
            random.Random(self.seed * 7_919 + epoch).shuffle(order)
            return self.tasks[order[index]]
        rng = random.Random(self.seed * 104_729 + job)
        settled, open_ = [], []
        for task in self.tasks:
            (open_ if self.status(task) == OPEN else settled).append(task)
        if settled and (not open_ or rng.random() < self.explore):
            return settled[rng.randrange(len(settled))]
        return rng.choices(open_, weights=[self.weight(t) for t in open_])[0]

    def summary(self) -> dict[str, int]:
        """How many tasks are settled solved, settled unsolved and open (for metrics.jsonl)."""
        if not self.enabled:
            return {}
        found = dict.fromkeys((SOLVED, UNSOLVED, OPEN), 0)
        for task in self.tasks:
            found[self.status(task)] += 1
        return {
            "tasks_settled_solved": found[SOLVED],
            "tasks_settled_unsolved": found[UNSOLVED],
            "tasks_open": found[OPEN],
        }

    def stop_reason(self) -> str:
        """Why the run should stop ("" while some task is open)."""
        counts = self.summary()
        if not counts or counts["tasks_open"]:
            return ""
        return (
            "every task is always solved or never solved: nothing left to learn "
            f"({counts['tasks_settled_solved']} always solved over their last "
            f"{self.min_samples} samples, {counts['tasks_settled_unsolved']} never solved in "
            f"{self.min_samples} or more)"
        )

"""Curriculum task selection for RL and the run's length and diversity metrics:
settled tasks are skipped but for exploration, unknown ones come first, families stand in for
unseen tasks, counts start from an eval report, survive a checkpoint and end a run with nothing
left to learn; a toy run logs turns, tokens, distinct answers and entropy, and draws lengths.png."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.training.rl_toy import toy_recipe
from training.evaluate import EvalReport, TaskResult
from training.rl import train_rl
from training.rl.curriculum import OPEN, SOLVED, UNSOLVED, Curriculum, task_family
from training.rl.environments import final_diff
from training.rl.run import Window
from training.rl.trajectory import Trajectory, Turn


@dataclass(frozen=True)
class T:
    id: str
    family: str = ""


def _curriculum(tasks, counts=None, min_samples=16, explore=0.1, seed=0) -> Curriculum:
    return Curriculum(tasks, min_samples, explore, seed, {} if counts is None else counts)


def _picks(cur: Curriculum, jobs: int = 400) -> Counter:
    return Counter(cur.pick(j).id for j in range(jobs))


def test_settled_tasks_are_skipped_except_to_explore():
    solved, unsolved, mixed = T("solved"), T("unsolved"), T("mixed")
    cur = _curriculum([solved, unsolved, mixed], explore=0.0)
    cur.record(solved, [True] * 16)
    cur.record(unsolved, [False] * 16)
    cur.record(mixed, [True, False] * 8)
    assert [cur.status(t) for t in cur.tasks] == [SOLVED, UNSOLVED, OPEN]
    assert _picks(cur) == {"mixed": 400}
    cur.explore = 0.1
    picks = _picks(cur)
    assert 0 < picks["solved"] + picks["unsolved"] < 0.2 * 400 < picks["mixed"]


def test_settling_looks_at_recent_successes_and_at_any_success_ever():
    task = T("t")
    cur = _curriculum([task], min_samples=4)
    cur.record(task, [False, False, True])  # three samples: too few to judge
    assert cur.status(task) == OPEN
    cur.record(task, [True, True, True])  # learned: its last 4 all passed
    assert cur.status(task) == SOLVED
    cur.record(task, [False, False, False, False])  # forgot it: it passed once, so open
    assert cur.status(task) == OPEN
    assert cur.counts["tasks"]["t"] == [4, 10, "0000"]
    never = T("never")
    cur = _curriculum([never], min_samples=4)
    cur.record(never, [False] * 3)
    assert cur.status(never) == OPEN
    cur.record(never, [False])
    assert cur.status(never) == UNSOLVED


def test_unknown_tasks_come_before_settled_and_nearly_decided_ones():
    unknown, settled, nearly = T("unknown"), T("settled"), T("nearly")
    cur = _curriculum([unknown, settled, nearly], explore=0.0)
    cur.record(settled, [True] * 16)
    cur.record(nearly, [True] * 15 + [False])
    assert cur.weight(unknown) == 0.25 > cur.weight(nearly) > 0
    picks = _picks(cur)
    assert picks["settled"] == 0 and picks["unknown"] > 2 * picks["nearly"] > 0


def test_an_unseen_task_is_judged_by_its_family():
    seen, sibling, stranger = T("a1", "bugfix/x"), T("a2", "bugfix/x"), T("b1", "edit/rename")
    cur = _curriculum([seen, sibling, stranger])
    cur.record(seen, [True] * 16)
    assert cur.status(sibling) == SOLVED and cur.status(stranger) == OPEN
    assert cur.weight(stranger) == 0.25  # unknown
    cur.record(sibling, [False])  # its own counts now, not its family's
    assert cur.status(sibling) == OPEN
    assert task_family(T("proj/a/7")) == "proj/a"  # no family: the id up to its last "/"
    assert task_family(T("magic-3")) == "magic-3"  # else its own family


def _eval_json(path: Path, results: list[tuple[str, str, bool]]) -> Path:
    report = EvalReport(
        "default",
        len(results),
        0.0,
        1.0,
        1.0,
        results=[TaskResult(i, f, p, "answered", 1, 0, 0, 0, 1.0) for i, f, p in results],
    )
    path.write_text(json.dumps(asdict(report)))
    return path


def test_counts_start_from_an_evaluation_report(tmp_path):
    train, unseen = T("t1", "edit/rename"), T("t2", "bugfix/x")
    cur = _curriculum([train, unseen], min_samples=2)
    report = _eval_json(
        tmp_path / "eval.json",
        [("t1", "edit/rename", True), ("h1", "bugfix/x", False), ("h2", "bugfix/x", False)],
    )
    assert cur.seed_from_eval(report) == 3
    assert cur.counts["tasks"] == {"t1": [1, 1, "1"]}  # a held-out id is not a training task
    assert cur.counts["families"]["bugfix/x"] == [0, 2, "00"]
    assert cur.status(unseen) == UNSOLVED  # from its family: two held-out tasks failed
    assert cur.status(train) == OPEN  # one sample of its own is too few
    several = tmp_path / "compare.json"
    several.write_text(json.dumps({"config": {}, "models": [asdict(EvalReport("a", 0, 0, 1, 1))]}))
    with pytest.raises(ValueError, match="per-task `results`"):
        cur.seed_from_eval(several)


def test_the_run_stops_when_every_task_is_settled():
    a, b = T("a"), T("b")
    cur = _curriculum([a, b], min_samples=8)
    cur.record(a, [True] * 8)
    assert cur.stop_reason() == ""
    cur.record(b, [False] * 8)
    reason = cur.stop_reason()
    assert "every task is always solved or never solved: nothing left to learn" in reason
    assert "1 always solved" in reason and "1 never solved" in reason
    assert cur.summary() == {
        "tasks_settled_solved": 1,
        "tasks_settled_unsolved": 1,
        "tasks_open": 0,
    }
    off = _curriculum([a, b], min_samples=0)
    off.record(b, [False] * 8)
    assert off.stop_reason() == "" and off.summary() == {} and off.counts["tasks"] == {}


def test_choices_are_deterministic_and_survive_a_state_round_trip():
    tasks = [T(f"t{i}") for i in range(6)]
    cur = _curriculum(tasks, seed=3)
    for i, task in enumerate(tasks):
        cur.record(task, [j < i for j in range(8)])
    cur.record(tasks[0], [False] * 8)  # settled unsolved
    restored = _curriculum(tasks, counts=json.loads(json.dumps(cur.counts)), seed=3)
    assert [cur.pick(j) for j in range(50)] == [restored.pick(j) for j in range(50)]
    assert restored.summary() == cur.summary()
    other_seed = _curriculum(tasks, counts=cur.counts, seed=4)
    assert [cur.pick(j) for j in range(50)] != [other_seed.pick(j) for j in range(50)]
    off = _curriculum(tasks, min_samples=0)  # off: every task once per pass, shuffled
    for epoch in range(3):
        assert sorted(off.pick(epoch * 6 + j).id for j in range(6)) == sorted(t.id for t in tasks)


def test_final_diff_fingerprints_the_change_to_non_test_files(tmp_path):
    files = {"pkg/mod.py": "x = 1\n", "test_mod.py": "assert True\n"}

    def after(changes: dict[str, str | None]) -> str:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        for path, text in {**files, **changes}.items():
            if text is not None:
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text)
        (root / "pkg" / "__pycache__").mkdir(parents=True, exist_ok=True)
        (root / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"cache")
        return final_diff(root, files)

    untouched = after({})
    assert after({"test_mod.py": "assert False\n"}) == untouched  # tests do not count
    edit = after({"pkg/mod.py": "x = 2\n"})
    assert edit != untouched and after({"pkg/mod.py": "x = 2\n"}) == edit
    assert after({"pkg/mod.py": None}) not in (untouched, edit)  # a deletion is a change
    assert after({"pkg/new.py": "y = 1\n"}) not in (untouched, edit)
    assert len(edit) == 12


def test_window_reports_lengths_and_diversity():
    def traj(diff: str, turns: int, logprob: float) -> Trajectory:
        turn = Turn([1], [2, 3], [logprob, logprob], 0)
        return Trajectory("t", 0, [turn] * turns, {"final_diff": diff}, reward=0.0)

    window = Window()
    window.add([traj("a", 1, -1.0), traj("a", 1, -1.0), traj("b", 3, -2.0), traj("c", 3, -2.0)])
    window.add([traj("a", 2, -0.5)] * 4)
    record = window.metrics(group_size=4)
    assert record["turns_mean"] == pytest.approx((1 + 1 + 3 + 3 + 2 * 4) / 8)
    assert record["output_tokens_mean"] == pytest.approx(2 * record["turns_mean"])
    assert record["distinct_diff_fraction"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    tokens = [(1.0, 2), (1.0, 2), (2.0, 6), (2.0, 6), (0.5, 16)]
    entropy = sum(nll * n for nll, n in tokens) / sum(n for _, n in tokens)
    assert record["rollout_entropy"] == pytest.approx(entropy)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_toy_run_logs_lengths_diversity_and_the_curriculum(tmp_path, tiny_checkpoint):
    out = tmp_path / "run"
    recipe = toy_recipe(out, tiny_checkpoint, mode="sync", steps=2, save_every=1)
    train_rl(recipe, log=print)
    train = [r for r in _records(out) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for record in train:
        assert record["turns_mean"] == 1.0 and record["output_tokens_mean"] == 1.0
        assert 0 < record["distinct_diff_fraction"] <= 1 and record["rollout_entropy"] > 0
        settled = record["tasks_settled_solved"] + record["tasks_settled_unsolved"]
        assert settled + record["tasks_open"] == 4
    assert (out / "lengths.png").stat().st_size > 0 and (out / "rewards.png").stat().st_size > 0
    first = json.loads((out / "checkpoints" / "step_0000002" / "state.json").read_text())
    seen = sum(total for _, total, _ in first["curriculum"]["tasks"].values())
    assert seen == first["counters"]["trajectories"] > 0

    resumed = toy_recipe(out, tiny_checkpoint, mode="sync", steps=3, save_every=1)
    train_rl(resumed, log=print)  # continues from step 2 with the saved counts
    last = json.loads((out / "checkpoints" / "step_0000003" / "state.json").read_text())
    seen = sum(total for _, total, _ in last["curriculum"]["tasks"].values())
    assert seen == last["counters"]["trajectories"] > first["counters"]["trajectories"]


def test_a_run_with_nothing_left_to_learn_stops_at_once(tmp_path, tiny_checkpoint):
    report = _eval_json(
        tmp_path / "eval.json",
        [(f"magic-{i}", f"magic-{i}", False) for i in range(4) for _ in range(2)],
    )
    lines: list[str] = []
    recipe = toy_recipe(
        tmp_path / "run",
        tiny_checkpoint,
        curriculum_min_samples=2,
        curriculum_seed=str(report),
    )
    train_rl(recipe, log=lines.append)
    assert "curriculum counts seeded from 8 results" in "\n".join(lines)
    stop = [line for line in lines if line.startswith("stopping early")]
    assert stop == [
        "stopping early at step 0: every task is always solved or never solved: nothing left "
        "to learn (0 always solved over their last 2 samples, 4 never solved in 2 or more)"
    ]
    assert not [r for r in _records(tmp_path / "run") if r["kind"] == "train"]
    assert (tmp_path / "run" / "model").is_dir()

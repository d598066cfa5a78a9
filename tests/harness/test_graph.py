"""The agent loop, driven by a replay engine (it stands in for the model only; tools, workspace,
sandbox and telemetry are real). A fresh compiled graph per test."""

from __future__ import annotations

import json
import shutil

import pytest

from agent.engine import Cancelled, EngineError
from agent.harness import Harness, HarnessConfig, Workspace
from tests.conftest import rows
from tests.harness.conftest import SAMPLE
from tests.harness.replay import ReplayEngine, call

FIX = call(
    "edit_file", path="calc.py", hunks=[{"search": "return a - b", "replace": "return a + b"}]
)


def harness(ws, turns, recorder=None, **config):
    engine = ReplayEngine(turns, context_length=config.pop("context_length", 32_768))
    config.setdefault("map_tokens", 256)
    return Harness(engine, Workspace(ws), HarnessConfig(**config), recorder=recorder), engine


def test_task_runs_to_an_answer_and_is_recorded(workspace, recorder):
    h, engine = harness(
        workspace, [call("read_file", path="calc.py"), FIX, "Fixed add()."], recorder
    )
    out = h.start("make test_add pass")
    h.close()
    assert out.ok and out.stop_reason == "answered" and out.final == "Fixed add()."
    assert "+    return a + b" in out.diff and out.steps == 3 and out.tool_errors == 0
    assert (workspace / "calc.py").read_text().startswith("def add(a, b):\n    return a + b")
    # the tools were offered as JSON schemas, and the results went back to the model
    assert {t["function"]["name"] for t in engine.requests[0].tools} >= {"edit_file", "run_tests"}
    assert engine.requests[1].messages[-1]["role"] == "tool"
    assert "return a - b" in engine.requests[1].messages[-1]["content"]
    recorder.flush()
    db = recorder.path
    [task] = rows(db, "SELECT * FROM tasks")
    assert task["status"] == "done" and task["final_message"] == "Fixed add()."
    assert task["instruction"] == "make test_add pass"
    # the stop reason and the final diff are columns of the task (telemetry schema v3)
    assert task["stop_reason"] == "answered" and task["stop_detail"] == ""
    assert "+    return a + b" in task["diff"] and task["diff_chars"] == len(out.diff)
    steps = rows(db, "SELECT * FROM steps ORDER BY idx")
    assert [s["role"] for s in steps] == ["system", "user"] + ["assistant", "tool"] * 2 + [
        "assistant"
    ]
    first = steps[2]
    assert json.loads(first["tool_calls"])[0]["name"] == "read_file"
    assert json.loads(first["token_ids"]) and json.loads(first["logprobs"])[0] == -0.5
    assert first["policy_version"] == "replay-1" and first["duration_ms"] is not None
    assert not any((s["content"] or "").startswith("stopped:") for s in steps)  # no workaround
    [edit] = rows(db, "SELECT * FROM edits")
    assert edit["document_uri"] == "calc.py"


def test_runs_without_a_recorder(workspace):
    h, _ = harness(workspace, [call("list_files"), "done"])
    out = h.start("look around")
    assert out.ok and out.final == "done"


def test_every_turn_asks_the_engine_in_the_configured_lane_and_grammar(workspace):
    h, engine = harness(
        workspace,
        [call("list_files"), "done"],
        priority="background",
        constrain_tool_calls=False,
    )
    assert h.start("look around").ok
    assert [r.priority for r in engine.requests] == ["background", "background"]
    assert not any(r.constrain_tool_calls for r in engine.requests)
    h, engine = harness(workspace, ["done"])
    h.start("look around")
    assert engine.requests[0].priority == "normal"  # an agent turn by default
    assert engine.requests[0].constrain_tool_calls  # calls decoded under their grammar


def test_malformed_call_becomes_an_error_for_the_model(workspace, recorder):
    h, engine = harness(
        workspace,
        ["<tool_call>read_file\n<|arg|>path\na\n<|arg|>path\nb\n</tool_call>", "ok"],
        recorder,
    )
    out = h.start("x")
    assert out.ok and out.tool_errors == 1
    shown = engine.requests[1].messages[-1]
    assert (
        shown["role"] == "user"
        and "could not be used" in shown["content"]
        and "given twice" in shown["content"]
    )
    recorder.flush()
    bad = rows(recorder.path, "SELECT * FROM steps WHERE invalid = 1")
    assert len(bad) == 1 and bad[0]["is_error"] == 1 and "given twice" in bad[0]["error"]


def test_unknown_tool_and_bad_arguments_are_tool_errors(workspace, recorder):
    turns = [
        call("teleport", to="mars")
        + call("read_file", path="calc.py", start_line="ten")
        + call("read_file"),
        "giving up",
    ]
    h, engine = harness(workspace, turns, recorder)
    out = h.start("x")
    assert out.ok and out.tool_errors == 3
    results = [m["content"] for m in engine.requests[1].messages if m["role"] == "tool"]
    assert "unknown tool 'teleport'" in results[0]
    assert "'start_line' of read_file must be an integer, got 'ten'" in results[1]
    assert "missing required argument(s) path" in results[2]
    recorder.flush()
    assert len(rows(recorder.path, "SELECT * FROM steps WHERE invalid = 1 AND is_error = 1")) == 3


def test_repeating_a_failing_call_stops_the_task(workspace, recorder):
    same = call("read_file", path="nope.py")
    h, engine = harness(workspace, [same, same, same, "never reached"], recorder)
    out = h.start("x")
    assert out.stop_reason == "repeated_failure" and not out.ok
    assert "has failed before" in engine.requests[2].messages[-1]["content"]
    recorder.flush()
    [task] = rows(recorder.path, "SELECT status FROM tasks")
    assert task["status"] == "failed"


def test_a_failing_call_after_an_edit_is_a_new_try(workspace, recorder):
    """run_tests failing again after each edit is progress, not a loop; without an edit between
    them the third identical failure stops the task."""
    tests = call("run_tests")

    def wrong(k):
        return call(
            "edit_file",
            path="calc.py",
            hunks=[
                {
                    "search": f"return a - b{' + 0' * k}",
                    "replace": f"return a - b{' + 0' * (k + 1)}",
                }
            ],
        )

    turns = [tests, wrong(0), tests, wrong(1), tests, FIX, tests, "Fixed."]
    h, _ = harness(workspace, turns, recorder)
    out = h.start("make the tests pass")
    assert out.ok and out.stop_reason == "answered" and out.tool_errors == 3
    h.close()
    (workspace / "calc.py").write_text(SAMPLE["calc.py"])  # failing again
    h, _ = harness(workspace, [tests, tests, tests, "never reached"], recorder)
    out = h.start("run the tests")
    h.close()
    assert out.stop_reason == "repeated_failure"


def test_step_limit(workspace):
    h, _ = harness(
        workspace,
        [call("list_files", path=".")] * 3 + [call("outline", path="calc.py")] * 3,
        max_steps=4,
    )
    out = h.start("x")
    assert out.stop_reason == "max_steps" and out.steps == 4 and "4 model turns" in out.detail


def test_token_limit(workspace):
    h, _ = harness(workspace, [call("list_files")] * 10, max_tokens=50)
    out = h.start("x")
    assert out.stop_reason == "max_tokens" and out.steps == 1


def test_engine_that_times_out_stops_at_the_wall_time(workspace, recorder):
    def hang(request):  # waits for the harness to cancel the request, as a stuck server would
        assert request.cancel.wait(30)
        raise Cancelled("cancelled")

    h, _ = harness(workspace, [hang], recorder, max_wall_s=0.3)
    out = h.start("x")
    assert out.stop_reason == "wall_time"
    recorder.flush()
    [task] = rows(recorder.path, "SELECT status FROM tasks")
    assert task["status"] == "limit"


def test_engine_error_is_a_clear_stop(workspace, recorder):
    h, _ = harness(
        workspace, [call("list_files"), EngineError("server at http://x unreachable")], recorder
    )
    out = h.start("x")
    assert out.stop_reason == "engine_error" and "unreachable" in out.detail
    recorder.flush()
    [task] = rows(recorder.path, "SELECT status, stop_reason, stop_detail FROM tasks")
    assert task["status"] == "failed" and task["stop_reason"] == "engine_error"
    assert "unreachable" in task["stop_detail"]


def test_unexpected_engine_exception_does_not_crash(workspace):
    h, _ = harness(workspace, [RuntimeError("boom")])
    out = h.start("x")
    assert out.stop_reason == "engine_error" and "RuntimeError: boom" in out.detail


def test_ten_megabyte_arguments_are_refused(workspace, recorder):
    huge = call("write_file", path="big.txt", content="x" * 10_000_000)
    h, engine = harness(workspace, [huge, "ok"], recorder)
    out = h.start("x")
    assert out.ok and out.tool_errors == 1 and not (workspace / "big.txt").exists()
    msgs = engine.requests[1].messages
    assert "the limit is 1 MB" in msgs[-1]["content"]
    assert "_omitted" in msgs[-2]["tool_calls"][0]["function"]["arguments"]  # history stays small
    assert len(json.dumps(msgs)) < 100_000


def test_invalid_utf8_in_model_output(workspace, recorder):
    garbage = "caf\udce9 \ufffd\x00 <tool_call>read_file\n<|arg|>path\ncalc\udcff.py\n</tool_call>"
    h, _ = harness(workspace, [garbage, "fine\udc80"], recorder)
    out = h.start("x")
    assert out.stop_reason == "answered" and out.tool_errors == 1
    recorder.flush()
    assert rows(recorder.path, "SELECT status FROM tasks")[0]["status"] == "done"


def test_workspace_that_disappears_mid_run(workspace, recorder):
    def vanish(request):
        shutil.rmtree(workspace)
        return call("read_file", path="calc.py")

    h, _ = harness(workspace, [call("list_files"), vanish, "never"], recorder)
    out = h.start("x")
    assert out.stop_reason == "workspace_error" and "no longer exists" in out.detail
    recorder.flush()
    assert rows(recorder.path, "SELECT status FROM tasks")[0]["status"] == "failed"


def test_long_history_is_compacted_by_a_summary_turn(workspace, recorder):
    (workspace / "long.txt").write_text("filler words in a long file\n" * 380)
    turns = [call("read_file", path="long.txt"), "SUMMARY: read long.txt, it is filler", "done"]
    h, engine = harness(workspace, turns, recorder, context_length=4000, turn_max_tokens=200)
    out = h.start("x")
    assert out.ok and out.final == "done"
    summary_request = engine.requests[1]
    assert summary_request.tools is None and "Summarise" in summary_request.messages[-1]["content"]
    after = engine.requests[2].messages
    assert len(after) == 3 and "SUMMARY: read long.txt" in after[-1]["content"]
    recorder.flush()
    assert rows(recorder.path, "SELECT 1 FROM steps WHERE content LIKE '[compaction summary]%'")


def test_context_overflow_when_the_task_itself_is_too_long(workspace):
    h, _ = harness(workspace, ["summary"], context_length=400, turn_max_tokens=50, map_tokens=0)
    out = h.start("do this " * 500)
    assert out.stop_reason == "context_overflow"


@pytest.mark.parametrize("decision,deleted", [(True, True), (False, False)])
def test_risky_action_pauses_for_approval(workspace, recorder, decision, deleted):
    h, engine = harness(workspace, [call("delete_file", path="calc.py"), "done"], recorder)
    out = h.start("delete calc.py")
    assert out.stop_reason is None and out.approval["calls"][0]["name"] == "delete_file"
    assert (workspace / "calc.py").exists()
    out = h.resume(out.thread_id, decision)
    assert out.ok and (not (workspace / "calc.py").exists()) == deleted
    if not decision:
        assert "did not approve" in engine.requests[1].messages[-1]["content"]


def test_denial_with_stop_ends_the_task(workspace):
    h, _ = harness(workspace, [call("write_file", path=".env", content="X=1")])
    out = h.start("x")
    assert "protected" in out.approval["calls"][0]["reason"]
    out = h.resume(out.thread_id, {"stop": True})
    assert out.stop_reason == "denied" and not (workspace / ".env").exists()


def test_editor_overlay_returns_proposals(workspace):
    ws = Workspace(workspace, buffers={"calc.py": "def add(a, b):\n    return a - b  # unsaved\n"})
    engine = ReplayEngine(
        [
            call("edit_file", path="calc.py", hunks=[{"search": "a - b", "replace": "a + b"}]),
            call("write_file", path="new.py", content="x = 1\n"),
            "ok",
        ]
    )
    out = Harness(engine, ws, HarnessConfig(map_tokens=0)).start("x")
    assert out.ok
    assert out.proposals == {
        "calc.py": "def add(a, b):\n    return a + b  # unsaved\n",
        "new.py": "x = 1\n",
    }
    assert "a - b" in (workspace / "calc.py").read_text() and not (workspace / "new.py").exists()

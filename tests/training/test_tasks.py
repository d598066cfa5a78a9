"""Synthetic tasks: verified at generation, oracle trajectories in the chat format, fast apply."""

from __future__ import annotations

import difflib
import json
import random
from dataclasses import asdict

import pytest

from agent.chat_format import APPLY_SYSTEM, assistant_spans, parse_assistant, render_chat
from agent.harness import Sandbox, ToolContext, Workspace, run_tool
from agent.harness.prompts import SYSTEM_PROMPT, tool_schemas
from training.tasks import (
    MISTAKES,
    PYTEST_COMMAND,
    TEMPLATES,
    TEST_STYLES,
    Task,
    TaskRejected,
    apply_hunks,
    bugfix_tasks,
    edit_sketch,
    edit_tasks,
    export,
    fast_apply_example,
    generate_tasks,
    hunks_for,
    load_tasks,
    make_project,
    mutations,
    oracle_trajectory,
    project_files,
    run_tests,
    stable_sha256,
    stable_text,
    task_tools_config,
    verify,
    verify_command,
)

EDIT_FAMILIES = {
    "edit/rename",
    "edit/constant",
    "edit/add_parameter",
    "edit/add_import",
    "edit/remove_function",
    "rewrite/body",
}


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    project = make_project("totals", 3)
    rng = random.Random(0)
    edits = [verify(t) for t in edit_tasks(project, rng, heldout_fraction=0.5)]
    return edits + bugfix_tasks(project, rng, heldout_fraction=0.5, limit=4)


@pytest.mark.parametrize("style", TEST_STYLES)
@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_every_template_makes_a_passing_project(template, style):
    project = make_project(template, 7, style)
    code, output = run_tests(project_files(project), verify_command(project))
    assert code == 0, output
    assert ("import pytest" in project_files(project)[f"test_{project.module}.py"]) == (
        style == "pytest"
    )


def test_a_pytest_project_gives_tasks_that_pytest_verifies():
    project = make_project("tally", 2, "pytest")
    rng = random.Random(0)
    bugs = bugfix_tasks(project, rng, heldout_fraction=0.0, limit=2)
    edits = [verify(t) for t in edit_tasks(project, rng, heldout_fraction=0.0)[:2]]
    assert bugs and {t.test_command for t in bugs + edits} == {PYTEST_COMMAND}
    for task in bugs:  # the failing test is read from pytest's summary line
        assert task.notes["failing"] and all(n.startswith("test_") for n in task.notes["failing"])
        assert run_tests(task.files, task.test_command)[0] != 0


@pytest.mark.parametrize("template", ["tally", "totals"])  # with docstrings, without them
def test_a_body_to_write_stands_in_for_a_function_the_tests_call(template):
    project = make_project(template, 3)
    (task,) = [t for t in edit_tasks(project, random.Random(0), 0.0) if t.family == "rewrite/body"]
    mod_file, name = f"{project.module}.py", task.notes["function"]
    assert task.solution == {mod_file: project.source}
    stub = task.files[mod_file]
    assert stub.count("raise NotImplementedError") == 1 and f"def {name}(" in stub
    before, after = project.source.splitlines(keepends=True), stub.splitlines(keepends=True)
    changes = [
        (tag, after[j1:j2])
        for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, before, after).get_opcodes()
        if tag != "equal"
    ]
    assert changes == [("replace", ["    raise NotImplementedError\n"])]  # the body, only
    verify(task)  # its tests fail on the stub and pass on the project
    row = oracle_trajectory(task, random.Random(0))
    reads = [
        json.loads(call["function"]["arguments"]).get("path")
        for m in row["messages"]
        for call in m.get("tool_calls") or []
        if call["function"]["name"] == "read_file"
    ]
    # written from the tests when there is no docstring to write it from: they are read first
    assert (f"test_{mod_file}" in reads) or task.notes["documented"]


def test_generation_takes_a_subset_of_templates():
    with pytest.raises(ValueError, match="unknown templates"):
        generate_tasks(1, templates=["no-such-template"])


def test_tasks_fail_before_and_pass_after(tasks):
    assert {t.family for t in tasks} >= EDIT_FAMILIES
    assert any(t.family.startswith("bugfix/") for t in tasks)
    for task in tasks[:: max(1, len(tasks) // 4)]:  # spot-check: verify() already ran them all
        assert run_tests(task.files, task.test_command)[0] != 0
        assert run_tests({**task.files, **task.solution}, task.test_command)[0] == 0
    assert len({t.split for t in tasks}) == 1  # one project -> one split


def test_a_task_whose_tests_pass_before_the_fix_is_rejected():
    project = make_project("grades", 1)
    files = project_files(project)
    task = Task("x", "bugfix/none", project.key, "train", "fix it", files, {})
    with pytest.raises(TaskRejected, match="already pass"):
        verify(task)


def test_mutations_cover_the_bug_families():
    families = {m.family for m in mutations(make_project("ranges", 0).source)}
    assert families == {
        "bugfix/operator_swap",
        "bugfix/comparison",
        "bugfix/off_by_one",
        "bugfix/swapped_arguments",
    }


def test_hunks_round_trip_and_are_unique():
    old = "a = 1\nb = 2\nc = 1\nd = 2\n" * 3
    new = old.replace("b = 2\nc = 1\nd = 2\na = 1", "b = 2\nc = 10\nd = 2\na = 1", 1)
    hunks = hunks_for(old, new)
    assert all(old.count(h["search"]) == 1 for h in hunks)
    assert apply_hunks(old, hunks) == new
    assert hunks_for("x = 1\ny = 2\n", "x = 1\ny = 3\n") == [
        {"search": "y = 2\n", "replace": "y = 3\n"}
    ]


def test_oracle_trajectories_are_correct_and_varied(tasks, tokenizer):
    shapes = set()
    for i, task in enumerate(tasks):
        row = oracle_trajectory(task, random.Random(i))
        messages = row["messages"]
        # what the harness starts a task with: its system prompt, the task and its repo map
        assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert messages[1]["content"].startswith(task.instruction + "\n\nRepository map")
        assert row["tools"] == tool_schemas()
        assert messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
        assert "tests passed" in messages[-2]["content"]
        calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls", [])]
        assert {"edit_file", "write_file"} & set(calls) and calls[-1] == "run_tests"
        if task.family.startswith("bugfix/"):  # a fix follows the failure, seen first
            first_edit = min(calls.index(n) for n in ("edit_file", "write_file") if n in calls)
            assert "run_tests" in calls[:first_edit]
        shapes.add(tuple(calls))
        for m in messages:  # every call id is answered by one tool message
            for call in m.get("tool_calls", []):
                assert sum(x.get("tool_call_id") == call["id"] for x in messages) == 1
        # the rendered assistant turns parse back to the same tool calls
        text = render_chat(tokenizer, messages, row["tools"])
        turns = [text[start:end] for start, end in assistant_spans(text)]
        parsed = [c.name for t in turns for c in parse_assistant(t, row["tools"])[1]]
        assert parsed == calls and not any(parse_assistant(t)[2] for t in turns)
    assert len(shapes) >= 3


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_recovery_trajectory_shows_the_mistake_then_learns_only_the_fix(tasks, mistake):
    made = 0
    for i, task in enumerate(tasks):
        if made == 4:
            break
        try:
            row = oracle_trajectory(task, random.Random(i), mistake=mistake)
        except TaskRejected:
            continue
        made += 1
        messages = row["messages"]
        wrong = [i for i, m in enumerate(messages) if m.get("weight") == 0]
        assert len(wrong) == 1  # exactly the mistake's turn is not learned
        call = messages[wrong[0]]["tool_calls"][0]["function"]
        assert call["name"] == "edit_file"
        reply = messages[wrong[0] + 1]["content"]
        if mistake == "wrong_site":  # it applies, and the tests that follow still fail
            assert "hunks applied" in reply and "0 of" not in reply
            assert messages[wrong[0] + 3]["content"].startswith("tests FAILED")
        else:  # the harness refuses it and says why
            assert reply.split("\n")[0].endswith("(file unchanged)")
            if mistake == "swapped":
                assert "search and replace are swapped" in reply
        assert "tests passed" in messages[-2]["content"]  # then the fix, and it passes
        assert messages[-1]["role"] == "assistant"
    assert made == 4


def test_oracle_tool_results_are_the_harness_own(tasks, tmp_path):
    """Every tool result in an oracle trajectory is what `run_tool` returns at run time, so the
    model learns from results it will really see."""
    task = next(t for t in tasks if t.family.startswith("bugfix/"))
    row = oracle_trajectory(task, random.Random(1))
    for path, text in task.files.items():
        (tmp_path / path).write_text(text)
    ws = Workspace(tmp_path)
    ctx = ToolContext(ws, Sandbox(tmp_path), task_tools_config(task))
    results = {m["tool_call_id"]: m["content"] for m in row["messages"] if m["role"] == "tool"}
    for message in row["messages"]:
        for call in message.get("tool_calls", []):
            name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
            if name == "run_tests":  # temporary folder names differ; the shape must not
                assert results[call["id"]].startswith(run_tool(ctx, name, args)[0][:12])
                continue
            assert results[call["id"]] == run_tool(ctx, name, args)[0], name


def test_fast_apply_example(tasks):
    task = tasks[0]
    row = fast_apply_example(task, random.Random(0))
    path = next(iter(task.solution))
    assert row["messages"][-1]["content"] == task.solution[path]
    assert row["messages"][0]["content"] == APPLY_SYSTEM  # the engine's apply prompt
    assert task.files[path] in row["messages"][1]["content"]
    sketch = edit_sketch("a\nb\nc\nd\ne\n", "a\nb\nC\nd\ne\n", context=1)
    assert sketch == "# ... existing code ...\nb\nC\nd\n# ... existing code ...\n"


def test_export_and_load(tasks, tmp_path):
    manifest = export(tasks, tmp_path, samples_per_task=2)
    assert manifest["counts"]["trajectories"] == 2 * len(tasks)
    loaded = load_tasks(tmp_path)
    assert [t.id for t in loaded] == [t.id for t in tasks]
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in rows} == {t.id for t in tasks}
    # one recovery trajectory per task that allows a mistake, its mistake weighted 0
    rows = [json.loads(x) for x in (tmp_path / "recovery.jsonl").read_text().splitlines()]
    assert rows and {r["task_id"] for r in rows} <= {t.id for t in tasks}
    assert all(sum(m.get("weight") == 0 for m in r["messages"]) == 1 for r in rows)
    assert not (tmp_path / "recovery.jsonl.part").exists()


def test_test_first_sets_how_often_a_fix_runs_the_tests_first(tasks, tmp_path):
    bugs = [t for t in tasks if t.family.startswith("bugfix/")]

    def tests_first(row: dict) -> bool:
        calls = [c["function"]["name"] for m in row["messages"] for c in m.get("tool_calls", [])]
        first_edit = min(calls.index(n) for n in ("edit_file", "write_file") if n in calls)
        return "run_tests" in calls[:first_edit]

    for share, expected in ((0.0, {False}), (1.0, {True})):
        rows = [
            oracle_trajectory(t, random.Random(i), test_first=share) for i, t in enumerate(bugs)
        ]
        assert {tests_first(r) for r in rows} == expected
    manifest = export(bugs[:1], tmp_path, test_first=0.7)
    assert (
        json.loads((tmp_path / "manifest.json").read_text())["test_first"]
        == 0.7
        == manifest["test_first"]
    )


def test_a_diagnosed_fix_names_the_line_then_copies_it_into_the_edit(tasks):
    for i, task in enumerate(t for t in tasks if t.family.startswith("bugfix/")):
        row = oracle_trajectory(task, random.Random(i), diagnose=True)
        turn = next(
            m
            for m in row["messages"]
            if m["role"] == "assistant"
            and m.get("tool_calls")
            and m["tool_calls"][0]["function"]["name"] == "edit_file"
        )
        notes = task.notes
        said = f"`{notes['mutated']}`", f"`{notes['original']}`", f"ine {notes['line']} "
        assert all(part in turn["content"] for part in said), turn["content"]
        hunks = json.loads(turn["tool_calls"][0]["function"]["arguments"])["hunks"]
        assert notes["mutated"] in hunks[0]["search"] and notes["original"] in hunks[0]["replace"]
        assert any(t in turn["content"] for t in notes["failing"])


@pytest.mark.parametrize("style", TEST_STYLES)
def test_a_requested_change_is_checked_in_the_test_files_style(style):
    project = make_project("totals", 3, style)
    tests = [
        t.files[f"test_{project.module}.py"]
        for t in edit_tasks(project, random.Random(0), heldout_fraction=0.0)
        if t.family in ("edit/add_import", "edit/remove_function")
    ]
    checks = [t.split("def test_requested_change")[1] for t in tests]
    assert len(checks) == 2
    for check in checks:
        assert ("self.assert" in check) == (style == "unittest")


def test_generation_and_export_in_processes_match_one_process(tmp_path):
    serial = generate_tasks(3, seed=5, workers=1)
    parallel = generate_tasks(3, seed=5, workers=3)
    assert [asdict(t) for t in parallel] == [asdict(t) for t in serial]
    for workers in (1, 2):
        export(serial[:6], tmp_path / str(workers), seed=5, samples_per_task=2, workers=workers)
    for name in ("tasks.jsonl", "trajectories.jsonl", "apply.jsonl", "manifest.json"):
        one, two = ((tmp_path / w / name).read_text() for w in ("1", "2"))
        assert stable_text(one) == stable_text(two), name
    for name in ("trajectories.jsonl", "recovery.jsonl"):
        one, two = (stable_sha256(tmp_path / w / name) for w in ("1", "2"))
        assert one == two, name

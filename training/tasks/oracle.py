"""Oracle trajectories: a correct, varied solving conversation for a task, in the harness's format.

Trajectories are what the harness sees at run time: its system prompt, tool schemas and
repository map (agent/harness/prompts.py, context.py), and tool results from its own tools
(`run_tool` on a real `Workspace` over a scratch copy; see `HarnessScratch`). The oracle's
choices (explore first or not, search or read, ranges, one edit or several, phrasing) are drawn
at random so the model does not learn one script.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import shutil
import tempfile
from pathlib import Path

from training.tasks.task import TEST_TIMEOUT_S, Task, TaskRejected


def hunks_for(old: str, new: str) -> list[dict[str, str]]:
    """Search/replace hunks turning `old` into `new`: the fewest lines of context that make each
    search text unique in `old` (a small model copies less, and misquotes less)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    for context in (0, 1, 2, 3, 5, 8, len(a)):
        groups = difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context)
        hunks = []
        for group in groups:
            i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
            if i1 == i2 and i1 > 0:  # pure insertion: anchor on the line before
                i1, j1 = i1 - 1, j1 - 1
            elif i1 == i2:
                i2, j2 = i2 + 1, j2 + 1
            hunks.append({"search": "".join(a[i1:i2]), "replace": "".join(b[j1:j2])})
        if all(h["search"] and old.count(h["search"]) == 1 for h in hunks):
            return hunks
    return [{"search": old, "replace": new}]


def apply_hunks(text: str, hunks: list[dict[str, str]]) -> str:
    for hunk in hunks:
        if text.count(hunk["search"]) != 1:
            raise ValueError(f"hunk search text is not unique: {hunk['search'][:80]!r}")
        text = text.replace(hunk["search"], hunk["replace"], 1)
    return text


class HarnessScratch:
    """A scratch copy of a task's workspace, with the harness's own tools running on it.

    Tool results are exactly what `agent.harness.tools.run_tool` returns at run time (the same
    numbering, edit reports, test summaries, sandbox). The project's tests run with the task's
    own command (`ToolsConfig.test_command`), as the evaluation and RL rollouts configure it.
    """

    def __init__(self, task: Task) -> None:
        from agent.harness import Sandbox, ToolContext, Workspace
        from agent.harness.scratch import write_files

        self.root = Path(tempfile.mkdtemp(prefix="flywheel-oracle-"))
        write_files(self.root, task.files)
        self.workspace = Workspace(self.root)
        self.ctx = ToolContext(self.workspace, Sandbox(self.root), task_tools_config(task))

    def call(self, name: str, args: dict) -> tuple[str, bool]:
        from agent.harness import run_tool

        return run_tool(self.ctx, name, args)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def task_tools_config(task: Task):
    """The harness's tool settings for a task: its own test command (oracle, evaluation, RL)."""
    from agent.harness import ToolsConfig

    return ToolsConfig(test_command=task.test_command, test_timeout_s=TEST_TIMEOUT_S)


_INTROS = [
    "",
    "",
    "Let me look at the project first.",
    "I'll start by looking around.",
    "First, the layout.",
    "Checking the files.",
]
_TEST_INTROS = [
    "",
    "Let me run the tests to see what fails.",
    "Running the tests first.",
    "I'll reproduce the failure.",
]
_READ_INTROS = ["", "", "Reading {f}.", "Let me read {f}.", "Opening {f}."]
_EDIT_INTROS = [
    "",
    "",
    "Now the fix.",
    "Making the change in {f}.",
    "Editing {f}.",
    "Found it: updating {f}.",
]
_VERIFY_INTROS = [
    "",
    "Checking the tests again.",
    "Running the tests to confirm.",
    "Let me verify.",
]
_ANSWERS = {
    "bugfix": [
        "Fixed: in {f}, `{old}` should have been `{new}`. The tests pass now.",
        "The bug was on line {line} of {f} (`{old}` instead of `{new}`). Fixed; all tests pass.",
        "Done. {f} line {line} now reads `{new}`, and the test suite passes.",
    ],
    "edit": [
        "Done: {summary}. Tests pass.",
        "{summary}; the tests pass.",
        "Changed {files}: {summary}. All tests pass.",
    ],
}


# Mistakes a recovery trajectory starts its edit with (see `oracle_trajectory`).
MISTAKES = ("swapped", "misquoted", "wrong_site")
_RECOVERY_INTROS = {
    "swapped": [
        "",
        "Search and replace were the wrong way round.",
        "I swapped them; the search text is what the file has now.",
    ],
    "misquoted": [
        "",
        "The search text must match the file exactly.",
        "Copying the search text exactly from the file.",
    ],
    "wrong_site": [
        "",
        "That was the wrong place. Let me look again.",
        "The tests still fail, so my edit was wrong.",
    ],
}


def oracle_trajectory(
    task: Task,
    rng: random.Random,
    mistake: str | None = None,
    test_first: float = 1.0,
    diagnose: bool = False,
) -> dict:
    """A correct, varied trajectory for `task`: {"messages", "tools", "task_id", "family"}.

    The conversation is what the harness builds at run time: its system prompt, the task with
    its repository map (agent.harness.prompts / context), its tool schemas, and tool results from
    the harness's own tools run on a scratch copy of the workspace. The final `run_tests` result
    shows the tests passing; a trajectory that would not get there raises `TaskRejected`.

    A bug fix runs the tests before its first edit with probability `test_first`. The draw is
    made at every share, as the starter's data was made with it (`TASK_TEST_FIRST` in
    training/starter.py), so that data can be made again. With `diagnose`, a fix that saw the
    failure first says before its edit which test fails and which line is wrong, quoting the line
    as it is and as it should be (`_diagnosis`), then copies those lines into its edit.

    With `mistake` (one of MISTAKES) it is a recovery trajectory: the first edit is wrong, as a
    small model's often is (search and replace swapped; a search text that misquotes the file;
    a plausible edit in the wrong place, which applies and leaves the tests failing), the
    harness's real reply follows, and then the correct edit from the file as it now is. The
    wrong turn carries `"weight": 0` (OpenAI's fine-tuning convention): SFT does not learn to
    make the mistake, only to recover from it.
    """
    from agent.harness import HarnessConfig
    from agent.harness.context import render_context
    from agent.harness.prompts import first_messages, tool_schemas

    scratch = HarnessScratch(task)
    context = render_context(scratch.workspace, task.instruction, None, HarnessConfig().map_tokens)
    talk = _Conversation(scratch, first_messages(task.instruction, context))
    try:
        ran_tests = _explore(talk, task, rng, test_first)
        current = dict(task.files)
        recovery = _mistake(talk, task, rng, mistake, current) if mistake else None
        _edits(talk, task, rng, current, recovery, diagnose and ran_tests)
        talk.step(rng.choice(_VERIFY_INTROS), ("run_tests", {}))
        if not talk.last().startswith("tests passed"):
            raise TaskRejected(f"oracle for task {task.id} did not make the tests pass")
        talk.messages.append({"role": "assistant", "content": _answer(task, rng)})
    finally:
        scratch.close()
    return {
        "task_id": task.id,
        "family": task.family,
        "split": task.split,
        "tools": tool_schemas(),
        "messages": talk.messages,
    }


class _Conversation:
    """A trajectory's messages; each assistant turn's tool calls run on the scratch workspace
    and their results follow as tool messages."""

    def __init__(self, scratch: HarnessScratch, messages: list[dict]) -> None:
        self.scratch, self.messages = scratch, messages
        self._ids = iter(range(1, 1000))

    def step(self, content: str, *calls: tuple[str, dict]) -> list[tuple[str, bool]]:
        """One assistant turn: `content` and `calls`; returns each call's (result, is_error)."""
        tool_calls = [
            {
                "id": f"call_{next(self._ids)}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)},
            }
            for n, a in calls
        ]
        self.messages.append({"role": "assistant", "content": content, "tool_calls": tool_calls})
        results = []
        for call, (name, args) in zip(tool_calls, calls, strict=True):
            result, is_error = self.scratch.call(name, args)
            results.append((result, is_error))
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "name": name, "content": result}
            )
        return results

    def last(self) -> str:
        return self.messages[-1]["content"]


def _explore(talk: _Conversation, task: Task, rng: random.Random, test_first: float) -> bool:
    """The turns before any edit: perhaps the file list, the tests (a bug fix, with probability
    `test_first`), a search for the symbol the task names, then each file to change and perhaps
    the tests' file. Returns whether the tests ran."""
    bug = task.family.startswith("bugfix/")
    if rng.random() < 0.5:
        talk.step(rng.choice(_INTROS), ("list_files", {}))
    ran_tests = bug and rng.random() < test_first  # a fix is read from the failure
    if ran_tests:
        talk.step(rng.choice(_TEST_INTROS), ("run_tests", {}))
    symbol = (
        task.notes.get("old")
        if task.family == "edit/rename"
        else task.notes.get("function") or task.notes.get("constant")
    )
    if symbol and isinstance(symbol, str) and rng.random() < 0.5:
        talk.step(
            rng.choice(["", f"Where is `{symbol}` used?", f"Searching for {symbol}."]),
            ("search", {"pattern": rf"\b{re.escape(symbol)}\b"}),
        )
    for path in sorted(task.solution):
        text = task.files.get(path, "")
        n_lines = len(text.splitlines())
        if bug and "line" in task.notes and rng.random() < 0.3 and n_lines > 20:
            line = task.notes["line"]
            args = {"path": path, "start_line": max(1, line - 8), "end_line": line + 8}
        else:
            args = {"path": path}
        talk.step(rng.choice(_READ_INTROS).format(f=path), ("read_file", args))
    # a body written from the tests, not a docstring, needs them read first
    from_tests = task.family == "rewrite/body" and not task.notes.get("documented", True)
    if rng.random() < 0.25 or from_tests:
        test_file = next(p for p in task.files if p.startswith("test_"))
        talk.step(rng.choice(["", "And the tests."]), ("read_file", {"path": test_file}))
    return ran_tests


def _mistake(
    talk: _Conversation, task: Task, rng: random.Random, mistake: str, current: dict[str, str]
) -> str:
    """The wrong first edit of a recovery trajectory (weight 0) and the harness's real reply;
    after an edit that applied, the failing tests and a fresh read. `current` follows the files.
    Returns what the correct edit's turn says, or "" when a turn here already said it."""
    path = sorted(task.solution)[0]
    wrong = _wrong_edit(mistake, current.get(path, ""), task.solution[path], rng)
    if wrong is None:
        raise TaskRejected(f"no {mistake} mistake for task {task.id}")
    hunks, applies = wrong
    results = talk.step(
        rng.choice(_EDIT_INTROS).format(f=path),
        ("edit_file", {"path": path, "hunks": hunks}),
    )
    talk.messages[-2]["weight"] = 0
    if results[0][1] == applies:
        raise TaskRejected(f"{mistake} mistake for task {task.id}: {results[0][0][:200]}")
    recovery = rng.choice(_RECOVERY_INTROS[mistake])  # said once, on the next turn
    if applies:
        current[path] = apply_hunks(current[path], hunks)
        talk.step(rng.choice(_TEST_INTROS), ("run_tests", {}))
        if talk.last().startswith("tests passed"):
            raise TaskRejected(f"wrong-site edit for task {task.id} passes the tests")
        talk.step(recovery, ("read_file", {"path": path}))
        return ""
    if rng.random() < 0.3:
        talk.step(recovery, ("read_file", {"path": path}))
        return ""
    return recovery


def _edits(
    talk: _Conversation,
    task: Task,
    rng: random.Random,
    current: dict[str, str],
    recovery: str | None,
    diagnose: bool,
) -> None:
    """The correct edit of each file to change, from the file as it now is (`current`): hunks,
    or sometimes the whole file. `recovery` (after a mistake) is what the first edit's turn says;
    with `diagnose`, a fix says which test fails and which line is wrong (`_diagnosis`)."""
    changed = sorted(task.solution)
    for path in changed:
        old, new = current.get(path, ""), task.solution[path]
        intro = rng.choice(_EDIT_INTROS).format(f=path)
        recovering = recovery is not None and path == changed[0]
        diagnosed = diagnose and bool(old) and not recovering
        if recovering:
            intro = recovery
        elif diagnosed:
            intro = _diagnosis(task, path, rng)
        write = not old or (rng.random() < 0.12 and len(new) < 3000)
        if write and not diagnosed:
            results = talk.step(intro, ("write_file", {"path": path, "content": new}))
        else:
            results = talk.step(intro, ("edit_file", {"path": path, "hunks": hunks_for(old, new)}))
        if results[0][1]:
            raise TaskRejected(f"oracle edit failed for task {task.id}: {results[0][0][:300]}")


def _wrong_edit(
    kind: str, old: str, new: str, rng: random.Random
) -> tuple[list[dict[str, str]], bool] | None:
    """A wrong edit_file `hunks` for turning `old` into `new`, and whether the harness applies it
    (None when `kind` has no instance here)."""
    from training.tasks.bugfix import mutations

    if not old:
        return None
    first = hunks_for(old, new)[0]
    if kind == "swapped":
        if first["replace"].strip() and first["replace"] not in old:
            return [{"search": first["replace"], "replace": first["search"]}], False
        return None
    if kind == "misquoted":
        lines = first["search"].splitlines(keepends=True)
        at = rng.randrange(len(lines))
        line = lines[at]
        indent = len(line) - len(line.lstrip(" "))
        if indent >= 4 and rng.random() < 0.5:
            lines[at] = line[4:] if rng.random() < 0.5 else "    " + line
        else:
            words = re.findall(r"[A-Za-z_]\w*", line)
            if not words:
                return None
            word = rng.choice(words)
            lines[at] = line.replace(word, word[:-1] if word.endswith("s") else word + "s", 1)
        search = "".join(lines)
        if search in old:
            return None
        return [{"search": search, "replace": first["replace"]}], False
    if kind == "wrong_site":
        try:
            found = mutations(old)
        except SyntaxError:
            return None
        matcher = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
        changed = {  # 0-based lines the right edit touches, and the line after each change
            i
            for tag, i1, i2, _, _ in matcher.get_opcodes()
            if tag != "equal"
            for i in range(i1, max(i2, i1 + 1) + 1)
        }
        candidates = [m for m in found if not ({m.line - 2, m.line - 1} & changed)]
        if not candidates:
            return None
        m = rng.choice(candidates)
        lines = old.splitlines(keepends=True)
        lines[m.line - 1] = m.after + "\n"
        return hunks_for(old, "".join(lines)), True
    raise ValueError(f"unknown mistake {kind!r}; expected one of {', '.join(MISTAKES)}")


_DIAGNOSES = [
    "`{test}` fails; it checks `{func}`. Line {line} of {f}, `{old}`, should be `{new}`.",
    "The failure is in `{func}` ({test}): line {line} reads `{old}` but should read `{new}`.",
    "{test} fails because of line {line} in {f}: `{old}` should be `{new}`.",
]


def _diagnosis(task: Task, path: str, rng: random.Random) -> str:
    """What a fix says before its edit: the failing test, the function it checks (the one around
    the changed line) and the line as it is and as it should be."""
    from agent.harness.symbols import symbols_of

    notes = task.notes
    around = [
        s
        for s in symbols_of(path, task.files[path])
        if s.kind in ("function", "method") and s.start_line <= notes["line"] <= s.end_line
    ]
    func = max(around, key=lambda s: s.depth).name if around else ""
    failing = notes.get("failing") or ["a test"]
    test = next((t for t in failing if func and func in t), failing[0])
    return rng.choice(_DIAGNOSES if func else _DIAGNOSES[2:]).format(
        test=test,
        func=func,
        line=notes["line"],
        f=path,
        old=notes["mutated"],
        new=notes["original"],
    )


def _answer(task: Task, rng: random.Random) -> str:
    notes = task.notes
    if task.family.startswith("bugfix/"):
        return rng.choice(_ANSWERS["bugfix"]).format(
            f=next(iter(task.solution)),
            old=notes["mutated"],
            new=notes["original"],
            line=notes["line"],
        )
    summary = {
        "edit/rename": f"renamed `{notes.get('old')}` to `{notes.get('new')}` everywhere",
        "edit/constant": f"set {notes.get('constant')} to {notes.get('new')!r}",
        "edit/add_parameter": f"`{notes.get('function')}` takes `{notes.get('parameter')}=1`",
        "edit/add_import": f"added the {notes.get('variant')} import and its constant",
        "edit/remove_function": f"removed `{notes.get('function')}`",
        "rewrite/body": f"wrote the body of `{notes.get('function')}`",
    }[task.family]
    return rng.choice(_ANSWERS["edit"]).format(summary=summary, files=", ".join(task.solution))

"""The whole flywheel, end to end through real processes and a real LSP client:
scripted editor sessions produce telemetry; `flywheel cycle` trains a candidate, benchmarks it and
promotes it; the running language server serves the new version in the next request; a rollback
restores the old one. (tests/cycle/test_cycle.py is its shorter variant, with `flywheel serve` and
sessions recorded directly.)"""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types

from tests.cycle.test_cycle import flywheel, quick_cycle
from tests.harness.replay import call
from tests.lsp.conftest import SAMPLING_OPTIONS, start_editor, stop_editor

# ~35 s, in the default suite: CI runs the acceptance itself
pytestmark = pytest.mark.asyncio(loop_scope="function")

BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = (
    "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)


async def scripted_sessions(tmp_path, count: int) -> None:
    """Editor sessions with the replay model: a bug fixed by the agent, accepted, rated +1."""
    for i in range(count):
        root = tmp_path / f"ws{i}"
        root.mkdir()
        (root / "calc.py").write_text(BUGGY)
        (root / "test_calc.py").write_text(TESTS)
        ed = await start_editor(tmp_path, "replay", {"agent": {"maxSteps": 6}}, root=root)
        try:
            uri = (root / "calc.py").as_uri()
            ed.open(uri, BUGGY)
            fix = {"search": "return a - b", "replace": "return a + b"}
            turns = [
                call("read_file", path="calc.py"),
                call("edit_file", path="calc.py", hunks=[fix]),
                "Fixed: add now returns a + b.",
            ]
            assert (await ed.request("flywheel/test/replay", {"turns": turns}))["loaded"] == 3
            result = await ed.command("flywheel.ask", {"uri": uri, "question": "fix add"})
            assert result["status"] == "done"
            (proposal,) = result["proposals"]
            await ed.command("flywheel.acceptAll", proposal["proposalId"])
            await ed.command("flywheel.rate", {"taskId": result["taskId"], "rating": 1})
            await ed.request("flywheel/debug/flush", {})
        finally:
            await stop_editor(ed)


async def suggestion_version(ed, uri: str) -> str:
    kind = types.InlineCompletionTriggerKind.Invoked
    result = await ed.client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=1, character=4),
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
    )
    sid = result.items[0].command.arguments[0]
    (row,) = await ed.rows("suggestions", id=sid)
    return row["model_version"]


async def wait_for_version(ed, version: str, since: int) -> None:
    """Until a flywheel/status notification (the `since`-th or later) names `version`."""
    notes = ed.notes["flywheel/status"]
    while not any(n["modelVersion"] == version for n in notes[since:]):
        await ed.next("flywheel/status", timeout=120)


async def test_sessions_cycle_promotion_reaches_the_editor_and_rollback(tmp_path, tiny_checkpoint):
    from agent.registry import Registry

    await scripted_sessions(tmp_path, 2)  # they log to tmp_path/telemetry.db
    registry = Registry(tmp_path / "models")
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    served = tmp_path / "served"
    served.mkdir()
    ed = await start_editor(
        served,
        "registry",
        SAMPLING_OPTIONS,
        extra_args=("--registry", str(registry.root), "--reload-interval", "0.2"),
    )
    try:
        uri = (served / "main.py").as_uri()
        ed.open(uri, "import os\nx = ")
        assert await suggestion_version(ed, uri) == v1
        seen = len(ed.notes["flywheel/status"])
        done = await asyncio.to_thread(
            quick_cycle,
            registry.root,
            tmp_path / "telemetry.db",
            tmp_path / "work",
            "--min-reward",
            "0",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        candidate = registry.promoted()
        assert candidate != v1
        await wait_for_version(ed, candidate, seen)  # flywheel/status with the new version
        assert await suggestion_version(ed, uri) == candidate
        seen = len(ed.notes["flywheel/status"])
        assert flywheel("models", "--registry", str(registry.root), "rollback").returncode == 0
        await wait_for_version(ed, v1, seen)
        assert await suggestion_version(ed, uri) == v1
        versions = {r["id"] for r in await ed.rows("model_versions")}
        assert {candidate, v1} <= versions  # each switch recorded in telemetry
    finally:
        await stop_editor(ed)

"""Next edit (`flywheel/nextEdit`): from the user's recent edit to the edit they will make next,
away from the cursor, named by document version. Pure functions first, then end to end against
`flywheel lsp` with the replay engine (tests/lsp/replay_server.py) as the model."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from lsp.next_edit import (
    EditHistory,
    RecentEdit,
    Region,
    build_prompt,
    next_edit,
    parse_rewrite,
    region_around,
)
from tests.lsp.conftest import start_editor, stop_editor

BASE = "# 😀 中文 header\ndef area(w, h):\n    return w * h  # 面积 😀\n\n\nprint(area(2, 3))\n"


def test_history_keeps_what_each_change_removed_and_inserted():
    h = EditHistory(keep=2)
    h.open("u", "abc\ndef\n")
    rng = types.Range(start=types.Position(1, 0), end=types.Position(1, 1))
    h.change("u", 2, [types.TextDocumentContentChangePartial(range=rng, text="DD")])
    assert h.texts["u"] == "abc\nDDef\n"
    assert h.recent("u") == [RecentEdit(start=4, removed="d", inserted="DD", version=2)]
    h.change("u", 3, [types.TextDocumentContentChangeWholeDocument(text="new")])
    assert h.recent("u") == [] and h.texts["u"] == "new"


def test_region_prompt_and_rewrite_give_one_edit_in_document_offsets():
    text = BASE
    at = text.index("area(w")
    region = region_around(text, [at], context_lines=1)
    assert region.text == "# 😀 中文 header\ndef area(w, h):\n    return w * h  # 面积 😀\n"
    assert (region.start, region.first_line) == (0, 0)
    prompt = build_prompt("a.py", text, [RecentEdit(at + 5, "x", "w", 2)], region)
    assert "@@ line 2\n-x\n+w\n" in prompt and prompt.endswith("<region>\n")
    rewrite = region.text.replace("return w * h", "return width * h")
    assert parse_rewrite(rewrite + "</region>\ntrailing", stopped=False) == rewrite
    assert parse_rewrite("unfinished", stopped=False) is None
    assert parse_rewrite("stopped at the marker", stopped=True) == "stopped at the marker"
    start, end, new = next_edit(region, rewrite)
    assert text[start:end] == "    return w * h  # 面积 😀\n"
    assert new == "    return width * h  # 面积 😀\n"
    assert next_edit(region, region.text) is None
    tail = Region(0, 5, 0, "a\nb\nc")  # a region at the end of a file without a final newline
    assert next_edit(tail, "a\nb\nC") == (4, 5, "C")


def test_the_prompt_is_bounded_edits_cut_then_dropped_oldest_first():
    text = BASE
    region = region_around(text, [text.index("area(w")], context_lines=1)
    paste = "".join(f"line {i}\n" for i in range(2000))  # a big paste among the recent edits
    edits = [RecentEdit(0, "", paste, 2), RecentEdit(5, "x", "w", 3)]
    prompt = build_prompt("a.py", text, edits, region, max_chars=4000)
    assert len(prompt) <= 4000 and "+line 0\n" in prompt and "+line 1999" not in prompt
    assert "@@ line 1\n-x\n+w\n" in prompt
    small = build_prompt("a.py", text, edits, region, max_chars=len(prompt) - 10)
    assert "+line 0" not in small and "-x\n+w\n" in small  # the oldest edit went first
    assert build_prompt("a.py", text, edits, region, max_chars=50) is None  # the region is over


def test_a_next_edit_decodes_behind_inline_completions():
    """Within one lane the first request runs to its end (agent/engine/scheduler.py); a next edit has
    its own lane, behind the inline completion of the next keystroke."""
    from agent.engine.request import LANES

    assert LANES.index("interactive") < LANES.index("prefetch") < LANES.index("normal")


pytestmark_e2e = pytest.mark.asyncio(loop_scope="module")


def _ask(ed, uri: str, version: int, position=None):
    params = {"textDocument": {"uri": uri, "version": version}}
    if position is not None:
        params["position"] = position
    return ed.request("flywheel/nextEdit", params)


def _rename_w(ed, uri: str) -> None:
    """The user renames the parameter `w` to `width` on line 1."""
    rng = types.Range(start=types.Position(1, 9), end=types.Position(1, 10))
    ed.change(uri, rng, "width")


@pytestmark_e2e
async def test_next_edit_lands_away_from_the_cursor_and_is_recorded(replay_editor):
    ed = replay_editor
    uri = (ed.root / "area.py").as_uri()
    ed.open(uri, BASE)
    _rename_w(ed, uri)
    text = ed.texts[uri]
    rewrite = text.replace("return w * h", "return width * h")  # the region is the whole file
    assert (await ed.request("flywheel/test/replay", {"turns": [rewrite + "</region>"]}))["loaded"]
    answer = await _ask(ed, uri, ed.versions[uri], {"line": 1, "character": 14})
    assert answer["version"] == ed.versions[uri] == 2
    assert answer["range"] == {
        "start": {"line": 2, "character": 0},
        "end": {"line": 3, "character": 0},
    }
    assert answer["newText"] == "    return width * h  # 面积 😀\n"
    # The editor applies it at that version, then runs the item's command.
    rng = types.Range(
        start=types.Position(**answer["range"]["start"]),
        end=types.Position(**answer["range"]["end"]),
    )
    ed.change(uri, rng, answer["newText"])
    cmd = answer["command"]
    assert cmd["command"] == "flywheel.acceptCompletion"
    assert (await ed.command(cmd["command"], *cmd["arguments"]))["tracked"]
    assert ed.texts[uri] == BASE.replace("(w, h)", "(width, h)").replace("w * h", "width * h")
    (row,) = await ed.rows("suggestions", id=answer["suggestionId"])
    assert row["kind"] == "next_edit" and row["document_version"] == 2
    assert row["output"] == answer["newText"]
    events = await ed.rows("suggestion_events", suggestion_id=answer["suggestionId"])
    assert [e["event"] for e in events] == ["accepted"]


@pytestmark_e2e
async def test_a_stale_version_is_refused_before_and_after_the_model(replay_editor):
    ed = replay_editor
    uri = (ed.root / "stale.py").as_uri()
    ed.open(uri, BASE)
    _rename_w(ed, uri)
    with pytest.raises(JsonRpcException) as before:
        await _ask(ed, uri, 1)
    assert before.value.code == -32801 and "version 2, not 1" in str(before.value)

    turn = {"waitForRelease": True, "text": "def area(width, h):\n</region>"}
    assert (await ed.request("flywheel/test/replay", {"turns": [turn]}))["loaded"]
    asking = asyncio.ensure_future(_ask(ed, uri, 2))
    assert (await ed.request("flywheel/test/held", {}))["held"]  # the model is running
    ed.change(uri, types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), "#")
    await ed.request("flywheel/test/release", {})
    with pytest.raises(JsonRpcException) as after:
        await asking
    assert after.value.code == -32801 and "version 3, not 2" in str(after.value)
    rows = [
        r for r in await ed.rows("suggestions", kind="next_edit") if "stale" in r["document_uri"]
    ]
    assert rows, [r["document_uri"] for r in await ed.rows("suggestions", kind="next_edit")]
    (event,) = await ed.rows("suggestion_events", suggestion_id=rows[0]["id"])
    assert event["event"] == "cancelled"  # the change stopped it


@pytestmark_e2e
async def test_a_document_change_stops_the_running_next_edit(replay_editor):
    """The model blocks until its request is cancelled: only the change can end it."""
    ed = replay_editor
    uri = (ed.root / "typed_on.py").as_uri()
    ed.open(uri, BASE)
    _rename_w(ed, uri)
    assert (await ed.request("flywheel/test/replay", {"turns": [{"waitForCancel": True}]}))[
        "loaded"
    ]
    asking = asyncio.ensure_future(_ask(ed, uri, 2))
    assert (await ed.request("flywheel/test/held", {}))["held"]  # the model is running
    ed.change(uri, types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), "#")
    with pytest.raises(JsonRpcException) as moved:
        await asking
    assert moved.value.code == -32801 and "version 3, not 2" in str(moved.value)
    (row,) = [
        r for r in await ed.rows("suggestions", kind="next_edit") if "typed_on" in r["document_uri"]
    ]
    (event,) = await ed.rows("suggestion_events", suggestion_id=row["id"])
    assert event["event"] == "cancelled"


@pytestmark_e2e
async def test_no_recent_edit_no_next_edit_and_unopened_documents_are_invalid(replay_editor):
    ed = replay_editor
    uri = (ed.root / "fresh.py").as_uri()
    ed.open(uri, BASE)
    assert await _ask(ed, uri, 1) is None
    with pytest.raises(JsonRpcException) as err:
        await _ask(ed, (ed.root / "never.py").as_uri(), 1)
    assert err.value.code == -32602


@pytestmark_e2e
async def test_an_expected_refusal_logs_one_line_without_a_traceback(tmp_path):
    log = tmp_path / "server.log"
    ed = await start_editor(
        tmp_path,
        "replay",
        root=tmp_path,
        extra_args=("--log-file", str(log), "--log-level", "INFO"),
    )
    try:
        uri = (tmp_path / "moved.py").as_uri()
        ed.open(uri, BASE)
        _rename_w(ed, uri)
        with pytest.raises(JsonRpcException) as refused:
            await _ask(ed, uri, 1)
        assert refused.value.code == -32801
    finally:
        await stop_editor(ed)
    text = log.read_text()
    assert "Traceback" not in text
    (line,) = [x for x in text.splitlines() if "refused" in x]
    assert "is at version 2, not 1: the next edit was not made; ask again" in line

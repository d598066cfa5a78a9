"""The edit tool: each documented rule of `edit_text`, one case or more each."""

from __future__ import annotations

import pytest

from agent.harness import Sandbox, ToolContext, Workspace, edit_text, run_tool


def edit(text, *hunks):
    return edit_text(text, [{"search": s, "replace": r} for s, r in hunks])


def test_exact_single_match():
    new, [res] = edit("a = 1\nb = 2\n", ("b = 2", "b = 3"))
    assert new == "a = 1\nb = 3\n" and res.applied and "line 2" in res.message


def test_ambiguous_match_refused_with_lines():
    text = "x = 1\ny = 0\nx = 1\n"
    new, [res] = edit(text, ("x = 1", "x = 2"))
    assert new == text and not res.applied
    assert "ambiguous" in res.message and "lines 1, 3" in res.message


def test_no_match_shows_closest_text():
    text = "def add(a, b):\n    return a - b\n"
    new, [res] = edit(text, ("return a-b", "return a + b"))
    assert new == text and not res.applied
    assert (
        "no match" in res.message and "lines 2-2" in res.message and "return a - b" in res.message
    )


def test_no_match_names_an_edit_already_applied_or_reversed():
    text = "SEP = '~'\nLIMIT = 3\n"
    new, [res] = edit(text, ("SEP = '-'\n", "SEP = '~'\n"))  # swapped, or applied before
    assert new == text and not res.applied
    assert res.message.startswith("no match") and "already in the file at line 1" in res.message


def test_no_match_nothing_similar():
    new, [res] = edit("alpha\n", ("zzzzzzzz qqqq", "x"))
    assert not res.applied and "nothing in the file resembles" in res.message


def test_trailing_whitespace_drift():
    text = "if x:   \n    y()\t\n"
    new, [res] = edit(text, ("if x:\n    y()\n", "if x:\n    z()\n"))
    assert res.applied and "trailing whitespace" in res.message
    assert new == "if x:\n    z()\n"


def test_indentation_drift_reindents_replacement():
    text = "class A:\n    def f(self):\n        return 1\n"
    new, [res] = edit(text, ("def f(self):\n    return 1", "def f(self):\n    return 2"))
    assert res.applied and "indentation" in res.message
    assert new == "class A:\n    def f(self):\n        return 2\n"


def test_crlf_file_keeps_crlf():
    text = "a = 1\r\nb = 2\r\n"
    new, [res] = edit(text, ("a = 1\nb = 2", "a = 1\nb = 3\nc = 4"))
    assert res.applied
    assert new == "a = 1\r\nb = 3\r\nc = 4\r\n"


def test_crlf_search_on_lf_file():
    new, [res] = edit("a = 1\nb = 2\n", ("a = 1\r\nb = 2", "a = 9\r\nb = 2"))
    assert res.applied and new == "a = 9\nb = 2\n"


def test_non_ascii_exact():
    text = 'greeting = "héllo wörld"\nemoji = "🚀"\n'
    new, [res] = edit(text, ('"🚀"', '"✨"'))
    assert res.applied and new == 'greeting = "héllo wörld"\nemoji = "✨"\n'


def test_unicode_normalisation_drift():
    text = "name = 'Jose\u0301'\n"  # decomposed é in the file
    new, [res] = edit(text, ("name = 'Jos\u00e9'\n", "name = 'José María'\n"))
    assert res.applied and new == "name = 'José María'\n"


def test_several_hunks_one_fails_others_apply():
    text = "a = 1\nb = 2\nc = 3\n"
    new, results = edit(text, ("a = 1", "a = 10"), ("nope = 0", "x"), ("c = 3", "c = 30"))
    assert [r.applied for r in results] == [True, False, True]
    assert new == "a = 10\nb = 2\nc = 30\n"


def test_hunks_apply_in_order_to_the_result_of_earlier_ones():
    new, results = edit("v = 1\n", ("v = 1", "v = 2"), ("v = 2", "v = 3"))
    assert all(r.applied for r in results) and new == "v = 3\n"


def test_identical_search_and_replace_refused():
    new, [res] = edit("a\n", ("a", "a"))
    assert not res.applied and "identical" in res.message


def test_empty_search_refused():
    new, [res] = edit("a\n", ("", "b"))
    assert not res.applied and "empty" in res.message


def test_malformed_hunk_refused():
    new, results = edit_text("a\n", [{"search": "a"}, "not a dict"])
    assert [r.applied for r in results] == [False, False]
    assert "search" in results[0].message


def test_ambiguous_after_whitespace_normalisation():
    text = "x = 1  \ny\nx = 1\t\n"
    new, [res] = edit(text, ("x = 1\ny\nx = 1\n", "z"))  # exact fails: trailing spaces
    assert res.applied  # the whole 3-line block is unique
    new, [res] = edit("\tgo() \n  go() \n", ("go()\n", "stop()\n"))
    assert not res.applied and "ambiguous" in res.message


def test_invalid_utf8_bytes_survive_an_edit(tmp_path):
    (tmp_path / "f.txt").write_bytes(b"caf\xe9 = 1\nkeep = 2\n")
    ctx = ToolContext(Workspace(tmp_path), Sandbox(tmp_path))
    out, is_error = run_tool(
        ctx,
        "edit_file",
        {"path": "f.txt", "hunks": [{"search": "keep = 2", "replace": "keep = 3"}]},
    )
    assert not is_error, out
    assert (tmp_path / "f.txt").read_bytes() == b"caf\xe9 = 1\nkeep = 3\n"


def test_edit_tool_reports_each_hunk_and_writes_partial(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\nb = 2\n")
    ctx = ToolContext(Workspace(tmp_path), Sandbox(tmp_path))
    out, is_error = run_tool(
        ctx,
        "edit_file",
        {
            "path": "m.py",
            "hunks": [{"search": "a = 1", "replace": "a = 5"}, {"search": "q", "replace": "r"}],
        },
    )
    assert is_error and "1 of 2 hunks applied" in out and "hunk 2: FAILED" in out
    assert (tmp_path / "m.py").read_text() == "a = 5\nb = 2\n"


def test_edit_tool_all_fail_leaves_file_untouched(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\n")
    before = (tmp_path / "m.py").stat().st_mtime_ns
    ctx = ToolContext(Workspace(tmp_path), Sandbox(tmp_path))
    out, is_error = run_tool(
        ctx, "edit_file", {"path": "m.py", "hunks": [{"search": "zz", "replace": "r"}]}
    )
    assert is_error and "file unchanged" in out
    assert (tmp_path / "m.py").stat().st_mtime_ns == before


@pytest.mark.parametrize("path", ["missing.py", "sub"])
def test_edit_tool_needs_an_existing_file(tmp_path, path):
    (tmp_path / "sub").mkdir()
    ctx = ToolContext(Workspace(tmp_path), Sandbox(tmp_path))
    out, is_error = run_tool(
        ctx, "edit_file", {"path": path, "hunks": [{"search": "a", "replace": "b"}]}
    )
    assert is_error and "write_file" in out


def test_edit_in_overlay_is_a_proposal(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\n")
    ws = Workspace(tmp_path, buffers={"m.py": "a = 1\nunsaved = True\n"})
    ctx = ToolContext(ws, Sandbox(tmp_path))
    out, is_error = run_tool(
        ctx,
        "edit_file",
        {"path": "m.py", "hunks": [{"search": "unsaved = True", "replace": "unsaved = False"}]},
    )
    assert not is_error and "proposed" in out
    assert (tmp_path / "m.py").read_text() == "a = 1\n"  # the disk is untouched
    assert ws.proposals() == {"m.py": "a = 1\nunsaved = False\n"}

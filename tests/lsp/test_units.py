"""Pure parts of the server: UTF-16 positions, settings parsing, survival tracking, hunks."""

from __future__ import annotations

import pytest
from lsprotocol import types

from lsp.documents import offset_at, position_at
from lsp.feedback import SurvivalTracker
from lsp.proposals import Proposal, StaleProposal, hunks_between
from lsp.settings import Settings, parse_settings


def test_utf16_positions_round_trip_through_emoji_and_cjk():
    text = "a😀中b\n😀x"
    assert offset_at(text, types.Position(0, 4)) == 3  # a(1) 😀(2) 中(1)
    assert position_at(text, 3) == types.Position(0, 4)
    assert offset_at(text, types.Position(1, 2)) == 6  # line 1 starts at 5
    assert position_at(text, 7) == types.Position(1, 3)
    assert offset_at(text, types.Position(0, 99)) == 4  # past the line's end: its end
    assert offset_at(text, types.Position(9, 0)) == len(text)


def test_settings_overlay_camel_case_and_reject_bad_values():
    s, warnings = parse_settings(
        {
            "model": {"name": "/ckpt"},
            "completion": {"debounceMs": 5, "maxTokens": "many"},
            "telemetry": {"consent": "everything"},
            "colour": "blue",
        }
    )
    assert s.model.name == "/ckpt" and s.completion.debounce_ms == 5
    assert s.completion.max_tokens == Settings().completion.max_tokens
    assert s.telemetry.consent == "code"
    assert len(warnings) == 3 and any("colour" in w for w in warnings)


def test_a_null_setting_goes_back_to_the_servers_own():
    server, _ = parse_settings({"telemetry": {"consent": "metrics"}, "model": {"name": "/srv"}})
    chosen, _ = parse_settings({"telemetry": {"consent": "off"}}, server)
    assert chosen.telemetry.consent == "off"
    # The client clears the setting: its `null` means the server's value, not the last one sent.
    cleared, warnings = parse_settings({"telemetry": {"consent": None}}, chosen, server)
    assert cleared.telemetry.consent == "metrics" and cleared.model.name == "/srv"
    assert warnings == []
    assert parse_settings({"model": None}, chosen, server)[0].model == server.model


def test_survival_follows_edits_with_an_injected_clock():
    now = [0.0]
    tracker = SurvivalTracker(clock=lambda: now[0])
    doc = "x = 1\nreturn a + b\n"
    assert tracker.track("s1", "u", doc, 6, "return a + b")
    insert = types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="# 😀\n"
    )
    swap = types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(2, 9), end=types.Position(2, 10)), text="-"
    )
    assert tracker.on_change("u", [insert, swap]) == []
    now[0] = 29.0
    assert tracker.due() == []
    now[0] = 130.0
    checks = tracker.due()
    assert [(c.after_s, c.accepted_chars, c.surviving_chars) for c in checks] == [
        (30, 12, 11),
        (120, 12, 11),
    ]


def test_deleting_accepted_text_at_once_is_an_undo():
    now = [0.0]
    tracker = SurvivalTracker(clock=lambda: now[0])
    tracker.track("s1", "u", "abc", 0, "abc")
    delete = types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(0, 0), end=types.Position(0, 3)), text=""
    )
    assert tracker.on_change("u", [delete]) == ["s1"]


def test_stale_proposal_is_refused():
    base = "a\nb\nc\n"
    proposal = Proposal("p", "u", 1, base, hunks_between(base, "a\nB\nc\n"))
    edit, after = proposal.edit_for(0, base, 1)
    assert after == "a\nB\nc\n" and edit.edits[0].new_text == "B\n"
    try:
        proposal.edit_for(0, base + "more", 2)
    except StaleProposal as exc:
        assert "changed since" in str(exc)
    else:
        raise AssertionError("a changed document must be refused")


def _prompt_for_tot(neighbours: list, **where) -> str:
    """The default settings' prompt at the end of `x = tot` (a line of its own), `where` naming
    the document."""
    from lsp.completion import build_prompt
    from lsp.settings import CompletionSettings

    return build_prompt(
        "x = tot", "\n", "python", neighbours, CompletionSettings(), 10_000, **where
    )


def test_other_open_files_are_repository_context_in_qwens_format_within_the_budget():
    from lsp.completion import Neighbour, build_prompt
    from lsp.settings import CompletionSettings

    neighbours = [Neighbour("file:///w/shop/cart.py", "def total(items):\n    return 0\n")]
    prompt = _prompt_for_tot(neighbours, uri="file:///w/shop/app.py")
    assert prompt == (
        "<|repo_name|>shop\n<|file_sep|>cart.py\ndef total(items):\n    return 0\n"
        "<|file_sep|>app.py\n<|fim_prefix|>x = tot<|fim_suffix|>\n<|fim_middle|>"
    )
    short = build_prompt(
        "x = tot", "\n", "python", neighbours, CompletionSettings(), 90, uri="file:///w/shop/app.py"
    )
    assert len(short.encode()) <= 90 and short.endswith("x = tot<|fim_suffix|>\n<|fim_middle|>")


def test_the_prompt_names_files_by_workspace_and_path_as_repository_training_does(tmp_path):
    """A document inside the editor's workspace folder is named in the prompt by that folder and
    its path inside it: the names `flywheel train repo` trains with (training/repo_pretrain.py)."""
    from pygls.workspace import Workspace

    from lsp.agent_tasks import prompt_place
    from lsp.completion import Neighbour

    shop = tmp_path / "shop"
    (shop / "billing").mkdir(parents=True)
    (shop / "billing" / "cart.py").write_text("def total(items):\n    return 0\n")
    (shop / "app.py").write_text("x = 1\n")
    workspace = Workspace(shop.as_uri())
    cart = (shop / "billing" / "cart.py").as_uri()
    assert prompt_place(workspace, cart) == ("shop", "billing/cart.py")
    assert prompt_place(workspace, (shop / "app.py").as_uri()) == ("shop", "app.py")
    assert prompt_place(workspace, "untitled:Untitled-1") == ("", "")
    outside = tmp_path / "notes" / "scratch.py"  # no workspace folder holds it: its own folder
    outside.parent.mkdir()
    outside.write_text("")
    assert prompt_place(workspace, outside.as_uri()) == ("notes", "scratch.py")

    neighbours = [Neighbour(cart, "def total(items):\n    return 0\n", "billing/cart.py")]
    prompt = _prompt_for_tot(neighbours, uri=(shop / "app.py").as_uri(), place=("shop", "app.py"))
    assert prompt.startswith("<|repo_name|>shop\n<|file_sep|>billing/cart.py\ndef total(")


def test_a_cursor_at_a_line_start_is_token_healed():
    from lsp.completion import build_prompt, clean_output, heal
    from lsp.settings import CompletionSettings

    assert heal("def f():\n    ") == ("def f():", "\n    ")
    assert heal("def f():\n") == ("def f():", "\n")
    assert heal("x = f(") == ("x = f(", "")  # mid-line: nothing to heal
    assert "def f():<|fim_suffix|>\n" in build_prompt(
        "def f():\n    ", "\n", "python", [], CompletionSettings(), 10_000
    )
    # The prefix style is the text before the cursor alone.
    prefix = CompletionSettings(prompt_style="prefix")
    assert build_prompt("def f():\n    ", "\n", "python", [], prefix, 10_000) == "def f():"
    # The model writes the healed break and indentation first; the editor gets the rest.
    assert clean_output("\n    return 1", "\n", "def f():\n    ") == "return 1"
    # A suggestion that does not start where the cursor is cannot be shown there.
    assert clean_output("  # more", "\n", "def f():\n    ") == ""
    assert clean_output(" + 1", "", "x = f(") == " + 1"


def test_model_settings_choose_the_engine_and_when_a_swap_is_enough(tmp_path, tiny_checkpoint):
    """speculative "auto" is n-gram drafts plus the MTP heads for a local model that has heads,
    n-gram drafts alone for one without, none for a server; dtype "auto" int8 for the local
    engine on a CPU and float32 elsewhere; a model setting that moves to a URL, or to weights
    the drafts cannot run on, needs a new engine, not a weight swap."""
    import shutil

    from agent.model import STARTER_DIR
    from lsp.model_host import _kind, engine_config
    from lsp.settings import ModelSettings

    local = engine_config(ModelSettings(name=str(tiny_checkpoint)))  # a model with MTP heads
    server = engine_config(ModelSettings(name="http://127.0.0.1:8000/v1"))
    assert (local.backend, local.speculative.method, local.dtype) == ("local", "ngram+mtp", "int8")
    default = engine_config(ModelSettings(name="default"))
    heads = (STARTER_DIR / "mtp").is_dir()
    assert default.speculative.method == ("ngram+mtp" if heads else "ngram")
    assert (server.backend, server.speculative.method, server.dtype) == (
        "openai",
        "none",
        "float32",
    )
    assert engine_config(ModelSettings(name="default", device="cuda")).dtype == "float32"
    assert _kind(local) != _kind(server)
    headless = tmp_path / "headless"
    shutil.copytree(tiny_checkpoint, headless, ignore=shutil.ignore_patterns("mtp"))
    without = engine_config(ModelSettings(name=str(headless)))
    assert without.speculative.method == "ngram" and _kind(without) != _kind(local)
    plain = engine_config(ModelSettings(name="default", speculative="none"))
    assert plain.speculative.method == "none" and _kind(plain) != _kind(local)
    s, warnings = parse_settings({"model": {"speculative": "fastest"}})
    assert s.model.speculative == "auto" and warnings  # not a choice: skipped and named


def test_a_suggestion_spans_lines_only_where_a_block_starts():
    from lsp.completion import STOP, stop_strings
    from lsp.settings import CompletionSettings

    auto = CompletionSettings()
    line = ["\n", *STOP]
    assert stop_strings("x = 1\ntotal = sum(", auto) == line  # mid-line: this line
    assert stop_strings("def handle(request, ", auto) == line
    blocks = ("def f():\n    ", "def f():\n", "def f():", "if (x) {", "for x in y; do", "")
    blocks += ("class A:\n    \n    ", "   \n  ")  # blank lines below the opener; a blank file
    for block in blocks:
        assert stop_strings(block, auto) == STOP, block  # a body to write: many lines
    for statement in ("def f():\n    x = 1\n    ", "x = 1\n", "import os\n\n"):
        assert stop_strings(statement, auto) == line, statement  # the next statement: one line
    assert stop_strings("x = undo", auto) == line  # a word ending in "do" opens nothing
    assert stop_strings("total = sum(", CompletionSettings(multiline="always")) == STOP
    with pytest.raises(ValueError, match="multiline must be 'auto' or 'always'"):
        CompletionSettings(multiline="never")


def test_a_long_prefix_starts_at_the_same_line_while_the_user_types():
    """The prompt's start moves in steps, at a line start, so that consecutive keystrokes share
    the prompt's first tokens (the engine's prefix cache serves them)."""
    from lsp.completion import PREFIX_STEP, prompt_prefix

    text = "".join(f"value_{i} = compute({i}, {i + 1})\n" for i in range(400))
    starts = set()
    for typed in range(0, 300, 7):  # keystrokes at the end of a long file
        prefix = text + "x" * typed
        kept = prompt_prefix(prefix, 4000)
        assert len(kept) <= 4000 and prefix.endswith(kept)
        assert prefix[len(prefix) - len(kept) - 1] == "\n"  # whole lines
        starts.add(len(prefix) - len(kept))
    assert len(starts) <= 300 // PREFIX_STEP + 2  # not one start per keystroke
    assert prompt_prefix("short\n", 4000) == "short\n" and prompt_prefix("abc", 0) == ""

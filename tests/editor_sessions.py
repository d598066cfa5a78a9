"""What the two editor tiers share: the README's set-up lines, and the scripted session both
play (tests/lsp/nvim/next_edit.lua in Neovim,
tests/vscode/drive_next_edit.cjs in VS Code), and what telemetry must show for it in each.

The session, on BASE with the replay model (tests/lsp/replay_server.py `--completion MODEL_TEXT
--next-edit NEXT_EDIT_RULE`):
  1. ghost text at the end of the file, accepted;
  2. the next edit it brings (line 2), jumped to and applied with Tab;
  3. ghost text on a new function body, its first word kept, the rest dismissed;
  4. ghost text on another new function body, dismissed with Esc.

Both tiers check `suggestion_event_sequence(db) == SESSION`: the same kinds and outcomes, in the
same order, from either editor.

`readme_setup(fence)`: the set-up lines of an editor as the README shows them (its "In your
editor" section, the first block of that fence: "lua" for Neovim, "sh" for VS Code), with this
checkout in place of `<checkout>`; they are what `flywheel lsp --setup` prints.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    "
GHOST = "return a * b"
# The prompt is token-healed (lsp/completion.py `heal`): it ends before the cursor's line break,
# so the model's text starts with that line break and the indentation.
MODEL_TEXT = "\n    " + GHOST
NEXT_EDIT_RULE = "a - b=>a + b"  # the edit the replay model predicts next
CLIENT_EVENTS = ("shown", "accepted", "partially_accepted", "rejected")  # what editors report

SESSION = [
    ("inline", ["shown", "accepted"]),
    ("next_edit", ["shown", "accepted"]),
    ("inline", ["shown", "partially_accepted"]),
    ("inline", ["shown", "rejected"]),
]


def suggestion_event_sequence(db: Path | str) -> list[tuple[str, list[str]]]:
    """Per suggestion that was shown, in the order they were first shown: its kind and the
    events the editor reported (not the server's own, such as superseded, which depend on how
    often an editor asks)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT s.id, s.kind, e.event FROM suggestion_events e "
            "JOIN suggestions s ON s.id = e.suggestion_id ORDER BY e.at, e.rowid"
        ).fetchall()
    finally:
        conn.close()
    kinds: dict[str, str] = {}
    events: dict[str, list[str]] = {}
    for sid, kind, event in rows:
        if event not in CLIENT_EVENTS:
            continue
        if event == "shown" and sid not in events:
            kinds[sid], events[sid] = kind, []
        if sid in events:
            events[sid].append(event)
    return [(kinds[sid], evs) for sid, evs in events.items()]


def readme_setup(fence: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## In your editor") :]
    block = section[section.index(f"```{fence}\n") + len(fence) + 4 :]
    block = block[: block.index("```")].replace("<checkout>", str(ROOT))
    return block.strip().splitlines()


# The real-default tests of both editors: a bug for the agent, and a function left at `return `
# for a completion.
REAL_FILE = (
    "def add(a, b):\n"
    '    """The sum of a and b."""\n'
    "    return a - b\n\n\n"
    "def area(width, height):\n"
    '    """The area of a width by height rectangle."""\n'
    "    return "
)
REAL_QUESTION = "add returns a - b; make it return the sum a + b"

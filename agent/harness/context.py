"""What a task is told besides its instruction: the project's rules (project.py), the editor's
state (current file and cursor, diagnostics, recent edits) and the repository map.

The language server fills an `EditorContext` from the client's state and the harness renders it
(with the repository map) below the user's instruction. Headless runs have no editor context and
get only the map.

What it does not do: read anything from the editor itself (lsp/ does), or decide relevance
(repo_map.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.harness.project import Rules
from agent.harness.repo_map import repo_map
from agent.harness.workspace import Workspace, WorkspaceError

CURSOR_WINDOW = 20  # lines shown above and below the cursor


@dataclass
class Diagnostic:
    path: str  # workspace-relative
    line: int  # 1-based
    severity: str  # error | warning | info | hint
    message: str


@dataclass
class EditorContext:
    current_file: str | None = None  # workspace-relative path of the active editor
    cursor_line: int | None = None  # 1-based line of the cursor in it
    selection: str | None = None  # selected text, if any
    diagnostics: list[Diagnostic] = field(default_factory=list)
    recent_edits: list[str] = field(default_factory=list)  # unified diffs, most recent last
    open_files: tuple[str, ...] = ()


def render_context(
    ws: Workspace,
    task: str,
    editor: EditorContext | None = None,
    map_tokens: int = 1024,
    rules: Rules | None = None,
) -> str:
    """The context block appended to the task: the project's rules, the editor state, then the
    repository map."""
    parts: list[str] = [rules.render()] if rules is not None else []
    if editor is not None and editor.current_file:
        head = f"Current file: {editor.current_file}"
        if editor.cursor_line:
            head += f" (cursor at line {editor.cursor_line})"
            try:
                lines = ws.read_text(editor.current_file).splitlines()
                lo = max(editor.cursor_line - CURSOR_WINDOW, 1)
                hi = min(editor.cursor_line + CURSOR_WINDOW, len(lines))
                window = "\n".join(f"{n:>6}  {ws.display(lines[n - 1])}" for n in range(lo, hi + 1))
                head += f"\n{window}"
            except WorkspaceError:
                pass
        parts.append(head)
        if editor.selection:
            parts.append(f"Selected text:\n{ws.display(editor.selection)[:4000]}")
    if editor is not None and editor.diagnostics:
        diags = [f"{d.path}:{d.line}: {d.severity}: {d.message}" for d in editor.diagnostics[:50]]
        parts.append("Diagnostics:\n" + "\n".join(diags))
    if editor is not None and editor.recent_edits:
        parts.append("Recent edits:\n" + "\n".join(e[:2000] for e in editor.recent_edits[-5:]))
    open_files = editor.open_files if editor is not None else ()
    rmap = repo_map(ws, task, map_tokens, open_files)
    if rmap:
        parts.append("Repository map (most relevant first):\n" + rmap)
    return "\n\n".join(parts)

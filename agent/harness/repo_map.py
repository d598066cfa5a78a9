"""A repository map: the files and definitions most relevant to a task, within a token budget.

How files are ranked: the task's words (identifiers of 3+ characters, split on `_` and
camelCase, lower-cased) are matched against each file's path parts and its definitions'
names (symbols.py). Score = 3 per path-part hit + 2 per symbol-name hit + 1 if the file is one
the editor has open; ties go to shorter paths. The map lists the best files first, each with its
outline, then bare paths of the rest, until the budget (estimated at 3 characters per token) is
spent.

    >>> # repo_map(Workspace("."), "fix add() in calc", budget_tokens=512)
    calc.py
      function add  (lines 1-2)
    ...

What it does not do: follow imports or references (a PageRank over a reference graph, as aider
does, is the natural next step once the language server provides references).
"""

from __future__ import annotations

import re

from agent.harness.symbols import language_of, symbols_of
from agent.harness.workspace import Workspace, WorkspaceError

CHARS_PER_TOKEN = 3
MAX_FILES = 3000  # files looked at
MAX_PARSE_BYTES = 300_000  # larger files are listed but not parsed


def words(text: str) -> set[str]:
    """Lower-cased identifier parts of 3+ characters: `parseHTTPRequest_v2` -> parse, http, ..."""
    out: set[str] = set()
    for ident in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text):
        for part in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", ident):
            if len(part) >= 3:
                out.add(part.lower())
        if len(ident) >= 3:
            out.add(ident.lower())
    return out


def repo_map(
    ws: Workspace, task: str, budget_tokens: int = 1024, open_files: tuple[str, ...] = ()
) -> str:
    """The map as text (empty when the budget is 0 or the workspace has no files)."""
    if budget_tokens <= 0:
        return ""
    wanted = words(task)
    scored = []
    for i, rel in enumerate(ws.files()):
        if i >= MAX_FILES:
            break
        syms = []
        if language_of(rel) is not None:
            try:
                full = ws.resolve(rel)
                if not full.exists() or full.stat().st_size <= MAX_PARSE_BYTES:
                    syms = symbols_of(rel, ws.read_text(rel))
            except (WorkspaceError, OSError):
                syms = []
        path_hits = len(words(rel.replace("/", " ").replace(".", " ")) & wanted)
        sym_hits = sum(1 for s in syms if words(s.name) & wanted)
        score = 3 * path_hits + 2 * sym_hits + (1 if rel in open_files else 0)
        scored.append((-score, len(rel), rel, syms))
    scored.sort()
    budget = budget_tokens * CHARS_PER_TOKEN
    lines: list[str] = []
    used = 0
    for neg_score, _, rel, syms in scored:
        block = [rel] + (["  " + s.render() for s in syms[:40]] if neg_score < 0 else [])
        cost = sum(len(x) + 1 for x in block)
        if used + cost > budget:
            if used + len(rel) + 1 > budget:
                break
            block, cost = [rel], len(rel) + 1
        lines += block
        used += cost
    return "\n".join(lines)

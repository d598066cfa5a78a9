"""The agent's tools: what the model can do to the workspace, each with a JSON-schema signature.

| tool          | what it does                                                               |
|---------------|----------------------------------------------------------------------------|
| list_files    | files under a folder (respects .gitignore), at most `MAX_LIST` entries      |
| read_file     | numbered lines of a file, by line range, at most `MAX_READ_LINES`           |
| search        | a regular expression over the workspace's text files (respects .gitignore)  |
| outline       | the definitions (classes, functions, ...) of one file, with line ranges     |
| find_symbol   | where a name is defined, across the workspace                               |
| edit_file     | search/replace hunks, each applied or refused on its own (see `edit_text`)  |
| write_file    | create or overwrite a whole file                                            |
| delete_file   | delete a file                                                               |
| run_command   | a shell command in the sandbox (sandbox.py)                                 |
| run_tests     | the project's test command, with the failures summarised                    |

Every tool returns text bounded by `ToolsConfig.max_result_chars` and reports failures as a
`ToolError` (shown to the model as an error result), never an exception that escapes the loop.
Paths are always workspace-relative and confined by workspace.py.

What it does not do: decide which calls need approval (graph.py) or record anything (the graph
records every call and result).
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.harness.project import detect_test_command, project_rules
from agent.harness.sandbox import Sandbox
from agent.harness.symbols import language_of, symbols_of
from agent.harness.workspace import Workspace, WorkspaceError

MAX_LIST = 500  # entries list_files returns
MAX_READ_LINES = 400  # lines read_file returns per call
MAX_LINE_CHARS = 500  # longer lines are cut when shown
MAX_MATCHES = 100  # search hits returned
MAX_SEARCH_FILES = 5000  # files search looks at
MAX_ARGUMENT_CHARS = 1_000_000  # a call whose arguments serialise longer is refused


class ToolError(Exception):
    """A tool call that failed for a reason the model can act on; the message says which."""


@dataclass
class ToolsConfig:
    max_result_chars: int = 16_000  # every result is capped to this (head and tail kept)
    test_command: str | None = None  # None: detected from the project (pytest, npm, go, cargo)
    test_timeout_s: float = 300.0  # time limit of run_tests
    command_timeout_s: float = 60.0  # default time limit of run_command


@dataclass
class ToolContext:
    workspace: Workspace
    sandbox: Sandbox
    config: ToolsConfig = field(default_factory=ToolsConfig)
    rules_seen: set[str] = field(default_factory=lambda: {"."})  # folders whose rules were shown


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    run: Callable[..., str]  # run(ctx, **arguments) -> result text; raises ToolError


def bound(text: str, limit: int) -> str:
    """`text` capped at `limit` characters, keeping its start and end."""
    if len(text) <= limit:
        return text
    half = max(limit // 2 - 60, 0)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters dropped ...]\n{text[-half:]}"


def _schema(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    props = {**required, **(optional or {})}
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


_PATH = {"type": "string", "description": "path relative to the workspace root"}


# --- reading --------------------------------------------------------------------------------


def list_files(ctx: ToolContext, path: str = ".") -> str:
    ws = ctx.workspace
    if not ws.exists(path):
        raise ToolError(f"{path} does not exist")
    out = []
    for i, rel in enumerate(ws.files(path)):
        if i >= MAX_LIST:
            out.append(f"[... more than {MAX_LIST} files; list a subfolder ...]")
            break
        out.append(rel)
    return "\n".join(out) if out else "(no files)"


def read_file(ctx: ToolContext, path: str, start_line: int = 1, end_line: int | None = None) -> str:
    ws = ctx.workspace
    if start_line < 1:
        raise ToolError("start_line is 1-based and must be >= 1")
    if end_line is not None and end_line < start_line:
        raise ToolError(f"end_line ({end_line}) is before start_line ({start_line})")
    last = (
        start_line + MAX_READ_LINES - 1
        if end_line is None
        else min(end_line, start_line + MAX_READ_LINES - 1)
    )
    shown: list[str] = []
    total = 0
    for number, line in enumerate(ws.iter_lines(path), 1):
        total = number
        if start_line <= number <= last:
            line = ws.display(line.rstrip("\r\n"))
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS] + f" [... {len(line) - MAX_LINE_CHARS} chars cut]"
            shown.append(f"{number:>6}  {line}")
        elif number > last and end_line is not None:
            break
    if total == 0:
        return f"{ws.rel(path)} is empty"
    if start_line > total:
        raise ToolError(
            f"{ws.rel(path)} has only {total} lines; start_line {start_line} is past the end"
        )
    more = ""
    if end_line is None and total > last:
        more = f"\n[lines {last + 1}-{total} not shown; call read_file with start_line={last + 1}]"
    elif end_line is not None and end_line > last:
        more = f"\n[stopped at line {last}: at most {MAX_READ_LINES} lines per call]"
    return "\n".join(shown) + more


def search(ctx: ToolContext, pattern: str, path: str = ".", case_sensitive: bool = True) -> str:
    ws = ctx.workspace
    try:
        rx = re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    hits: list[str] = []
    for i, rel in enumerate(ws.files(path)):
        if i >= MAX_SEARCH_FILES:
            hits.append(f"[stopped after {MAX_SEARCH_FILES} files; search a subfolder]")
            break
        try:
            for number, line in enumerate(ws.iter_lines(rel), 1):
                if rx.search(line):
                    text = ws.display(line.rstrip("\r\n"))[:MAX_LINE_CHARS]
                    hits.append(f"{rel}:{number}: {text}")
                    if len(hits) >= MAX_MATCHES:
                        return (
                            "\n".join(hits)
                            + f"\n[first {MAX_MATCHES} matches shown; narrow the search]"
                        )
        except (WorkspaceError, OSError):
            continue  # binary or unreadable files are skipped
    return "\n".join(hits) if hits else f"no match for {pattern!r}"


def outline(ctx: ToolContext, path: str) -> str:
    ws = ctx.workspace
    rel = ws.rel(path)
    if language_of(rel) is None:
        raise ToolError(
            f"no outline for {rel}: supported are Python, JavaScript, TypeScript, Go, Rust"
        )
    symbols = symbols_of(rel, ws.read_text(rel))
    if not symbols:
        return f"{rel}: no definitions"
    return "\n".join(s.render() for s in symbols)


def find_symbol(ctx: ToolContext, name: str, path: str = ".") -> str:
    ws = ctx.workspace
    hits: list[str] = []
    for rel in ws.files(path):
        if language_of(rel) is None or name not in _safe_text(ws, rel):
            continue
        for s in symbols_of(rel, _safe_text(ws, rel)):
            if s.name == name:
                hits.append(f"{rel}:{s.start_line}-{s.end_line}: {s.kind} {s.name}: {s.signature}")
        if len(hits) >= MAX_MATCHES:
            break
    return "\n".join(hits) if hits else f"no definition named {name!r} found"


def _safe_text(ws: Workspace, rel: str) -> str:
    try:
        return ws.read_text(rel)
    except (WorkspaceError, OSError):
        return ""


# --- editing --------------------------------------------------------------------------------


@dataclass
class HunkResult:
    index: int  # 0-based position in the call
    applied: bool
    message: str  # where it applied, or why it did not (with the closest match)


def edit_text(text: str, hunks: list[dict[str, str]]) -> tuple[str, list[HunkResult]]:
    """Apply search/replace hunks to `text`, each on its own. Returns (new text, one result each).

    Semantics, in order, for every hunk `{"search": S, "replace": R}`:
    1. Hunks apply one after another, each to the text left by the hunks before it; a hunk that
       fails changes nothing and does not stop the others.
    2. Line endings: when the file is mostly CRLF, matching and replacing happen on LF text and
       the result is written back with CRLF; CRLF inside S or R is read as LF. A file's own
       line-ending style is always preserved.
    3. S must be non-empty and differ from R.
    4. Exact match: S occurs exactly once -> replaced by R. S occurs more than once -> refused as
       *ambiguous*, listing the lines where it occurs (add surrounding lines to S).
    5. No exact match -> a line-wise tolerant match over whole lines: lines compare equal after
       Unicode NFC normalisation and ignoring trailing whitespace; failing that, ignoring
       leading whitespace (indentation drift) too. Exactly one match -> the matched lines are
       replaced by R; when indentation differed, R is re-indented by the same difference (the
       indent of S's first non-blank line is swapped for the file's). Several -> ambiguous.
    6. Still nothing -> refused as *no match*, showing the closest window of the file (by
       difflib similarity) with its line numbers, so the next call can copy the real text. When
       R itself occurs once in the file, the refusal says so instead: the edit was already
       applied, or S and R are swapped (a repeated or reversed call).
    Non-ASCII text matches as itself; bytes that are not UTF-8 (surrogate escapes) are kept.
    """
    crlf = text.count("\r\n") > text.count("\n") - text.count("\r\n")
    work = text.replace("\r\n", "\n") if crlf else text
    results: list[HunkResult] = []
    for i, hunk in enumerate(hunks):
        work, applied, message = _apply_hunk(work, hunk)
        results.append(HunkResult(i, applied, message))
    if crlf:
        work = work.replace("\n", "\r\n")
    return work, results


def _apply_hunk(work: str, hunk: Any) -> tuple[str, bool, str]:
    """One hunk on LF text (rules 3 to 6 of `edit_text`): (text after it, applied, message)."""
    s = hunk.get("search") if isinstance(hunk, dict) else None
    r = hunk.get("replace") if isinstance(hunk, dict) else None
    if not isinstance(s, str) or not isinstance(r, str):
        return work, False, 'each hunk needs string fields "search" and "replace"'
    s, r = s.replace("\r\n", "\n"), r.replace("\r\n", "\n")
    if not s:
        return (
            work,
            False,
            "search is empty: include the text to replace (use write_file to create a file)",
        )
    if s == r:
        return work, False, "search and replace are identical: nothing to change"
    count = work.count(s)
    if count == 1:
        at = work.index(s)
        line = work.count("\n", 0, at) + 1
        return work[:at] + r + work[at + len(s) :], True, f"applied at line {line}"
    if count > 1:
        lines = _occurrence_lines(work, s)
        return (
            work,
            False,
            f"ambiguous: the search text occurs {count} times (at lines {', '.join(map(str, lines[:10]))}); add surrounding lines so it matches once",
        )
    new, message = _tolerant_replace(work, s, r)
    if new is not None:
        return new, True, message
    if len(r.strip()) >= 3 and work.count(r) == 1:  # the usual cause, named
        line = work.count("\n", 0, work.index(r)) + 1
        message = (
            f"no match, but the replace text is already in the file at line {line}: the "
            "edit is already applied, or search and replace are swapped"
        )
    return work, False, message


def _occurrence_lines(text: str, s: str) -> list[int]:
    out, at = [], text.find(s)
    while at >= 0:
        out.append(text.count("\n", 0, at) + 1)
        at = text.find(s, at + 1)
    return out


def _norm(line: str, strip_indent: bool) -> str:
    line = unicodedata.normalize("NFC", line).rstrip()
    return line.lstrip() if strip_indent else line


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _tolerant_replace(text: str, s: str, r: str) -> tuple[str | None, str]:
    file_lines = text.split("\n")
    s_lines = s.split("\n")
    if s_lines and s_lines[-1] == "":  # a search ending in a newline covers whole lines
        s_lines = s_lines[:-1]
    r_lines = r.split("\n")
    if r.endswith("\n"):
        r_lines = r_lines[:-1]
    n = len(s_lines)
    for strip_indent in (False, True):
        want = [_norm(x, strip_indent) for x in s_lines]
        starts = [
            k
            for k in range(len(file_lines) - n + 1)
            if [_norm(x, strip_indent) for x in file_lines[k : k + n]] == want
        ]
        if len(starts) > 1:
            how = "ignoring indentation" if strip_indent else "ignoring trailing whitespace"
            return None, (
                f"ambiguous: {how}, the search text matches {len(starts)} places (at lines "
                f"{', '.join(str(k + 1) for k in starts[:10])}); add surrounding lines"
            )
        if len(starts) == 1:
            k = starts[0]
            new_lines = r_lines
            how = "ignoring trailing whitespace"
            if strip_indent:
                how = "ignoring indentation (replacement re-indented)"
                s_first = next((x for x in s_lines if x.strip()), "")
                f_first = next((x for x in file_lines[k : k + n] if x.strip()), "")
                old, new = _indent(s_first), _indent(f_first)
                new_lines = [
                    new + x[len(old) :] if x.startswith(old) and x.strip() else x for x in r_lines
                ]
            file_lines[k : k + n] = new_lines
            return "\n".join(file_lines), f"applied at line {k + 1} ({how})"
    return None, "no match: " + _closest(file_lines, s_lines)


def _closest(file_lines: list[str], s_lines: list[str]) -> str:
    n = max(len(s_lines), 1)
    target = "\n".join(x.strip() for x in s_lines)
    best, best_k = 0.0, -1
    if len(file_lines) > 20_000:
        return "the file is too long to look for a close match; search it for a distinctive line"
    for k in range(max(len(file_lines) - n + 1, 1)):
        window = "\n".join(x.strip() for x in file_lines[k : k + n])
        m = difflib.SequenceMatcher(None, target, window, autojunk=False)
        if m.real_quick_ratio() <= best or m.quick_ratio() <= best:
            continue
        ratio = m.ratio()
        if ratio > best:
            best, best_k = ratio, k
    if best_k < 0 or best < 0.3:
        return "nothing in the file resembles the search text; read the file first"
    shown = "\n".join(
        f"{best_k + 1 + j:>6}  {x}" for j, x in enumerate(file_lines[best_k : best_k + n])
    )
    return (
        f"the closest text ({best:.0%} similar) is at lines {best_k + 1}-{best_k + n}:\n{shown}\n"
        "copy it exactly into search"
    )


def edit_file(ctx: ToolContext, path: str, hunks: list[dict[str, str]]) -> str:
    ws = ctx.workspace
    rel = ws.rel(path)
    if not hunks:
        raise ToolError("hunks is empty: give at least one {search, replace} pair")
    if not ws.is_file(rel):
        raise ToolError(f"{rel} does not exist; use write_file to create it")
    text = ws.read_text(rel)
    new, results = edit_text(text, hunks)
    applied = sum(x.applied for x in results)
    lines = [f"hunk {x.index + 1}: {'ok' if x.applied else 'FAILED'}: {x.message}" for x in results]
    if applied:
        ws.write_text(rel, new)
    report = f"{rel}: {applied} of {len(results)} hunks applied" + (
        "" if applied else " (file unchanged)"
    )
    report += (
        ("" if not ws.overlay or not applied else " (proposed to the editor)")
        + "\n"
        + "\n".join(lines)
    )
    if applied < len(results):
        raise ToolError(report)
    return report


def write_file(ctx: ToolContext, path: str, content: str) -> str:
    ws = ctx.workspace
    rel = ws.rel(path)
    existed = ws.is_file(rel)
    ws.write_text(rel, content)
    verb = "overwrote" if existed else "created"
    return f"{verb} {rel} ({content.count(chr(10)) + (not content.endswith(chr(10)) and bool(content))} lines)"


def delete_file(ctx: ToolContext, path: str) -> str:
    ws = ctx.workspace
    rel = ws.rel(path)
    ws.delete(rel)
    return f"deleted {rel}"


# --- commands -------------------------------------------------------------------------------


def run_command(ctx: ToolContext, command: str, timeout_s: float | None = None) -> str:
    if not command.strip():
        raise ToolError("command is empty")
    result = ctx.sandbox.run(command, timeout_s or ctx.config.command_timeout_s)
    text = result.summary()
    if result.timed_out or result.exit_code != 0:
        raise ToolError(text)
    return text


_PYTEST_SUMMARY = re.compile(
    r"^(?:=+ )?(\d+ (?:passed|failed|errors?)\b.*? in [\d.]+s.*?|no tests ran.*?)(?: =+)?$", re.M
)
_FAILED_LINE = re.compile(r"^(FAILED|ERROR) .*$", re.M)


def summarize_tests(output: str) -> str:
    """The lines that say what failed: pytest's FAILED/ERROR lines and summary, or the tail."""
    failed = _FAILED_LINE.findall(output)
    lines = [m.group(0) for m in _FAILED_LINE.finditer(output)]
    summary = _PYTEST_SUMMARY.findall(output)
    parts = []
    if summary:
        parts.append("summary: " + summary[-1])
    if lines:
        parts.append("failures:\n" + "\n".join(lines[:30]))
        if len(failed) > 30:
            parts.append(f"[... {len(failed) - 30} more]")
    return "\n".join(parts)


# What a test run that needed the network prints; the sandbox has none.
_NO_NETWORK = re.compile(
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|nodename nor servname|getaddrinfo|Could not resolve host|No route to host"
)


def run_tests(ctx: ToolContext, args: str = "") -> str:
    if ctx.config.test_command:
        command, source = ctx.config.test_command, "the test_command setting"
    else:
        found = detect_test_command(ctx.workspace)
        if found is None:
            raise ToolError(
                "no test command found (no test files, package.json test script, go.mod, "
                "Cargo.toml or Makefile test target); run them with run_command"
            )
        command, source = found.command, found.source
    if args:
        command = f"{command} {args}"
    result = ctx.sandbox.run(command, ctx.config.test_timeout_s)
    summary = summarize_tests(result.output)
    status = "passed" if result.exit_code == 0 else ("timed out" if result.timed_out else "FAILED")
    text = f"tests {status} (`{command}`, exit code {result.exit_code})\n"
    if not ctx.config.test_command:
        text += f"test command from {source}\n"
    if summary:
        text += summary + "\n"
    if status != "passed" and _NO_NETWORK.search(result.output):
        text += "note: commands run without network access; tests that need it fail here\n"
    text += "--- output (end) ---\n" + result.output[-6000:]
    if status != "passed":
        raise ToolError(text)
    return text


# --- the registry ---------------------------------------------------------------------------

TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        Tool(
            "list_files",
            "List the files under a folder of the workspace (respects .gitignore).",
            _schema({}, {"path": {**_PATH, "description": "folder (default: the root)"}}),
            list_files,
        ),
        Tool(
            "read_file",
            f"Read a text file with line numbers; at most {MAX_READ_LINES} lines per call.",
            _schema(
                {"path": _PATH},
                {
                    "start_line": {"type": "integer", "description": "first line, 1-based"},
                    "end_line": {"type": "integer", "description": "last line, inclusive"},
                },
            ),
            read_file,
        ),
        Tool(
            "search",
            "Search the workspace's text files with a Python regular expression.",
            _schema(
                {"pattern": {"type": "string"}},
                {
                    "path": {**_PATH, "description": "folder or file to search (default: all)"},
                    "case_sensitive": {"type": "boolean"},
                },
            ),
            search,
        ),
        Tool(
            "outline",
            "List the classes, functions and other definitions of a source file.",
            _schema({"path": _PATH}),
            outline,
        ),
        Tool(
            "find_symbol",
            "Find where a class, function or type is defined.",
            _schema({"name": {"type": "string"}}, {"path": _PATH}),
            find_symbol,
        ),
        Tool(
            "edit_file",
            "Edit a file by search/replace hunks. Each search text must match the file exactly "
            "once (copy it from read_file without line numbers); each hunk applies or fails on its own.",
            _schema(
                {
                    "path": _PATH,
                    "hunks": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "search": {"type": "string"},
                                "replace": {"type": "string"},
                            },
                            "required": ["search", "replace"],
                        },
                    },
                }
            ),
            edit_file,
        ),
        Tool(
            "write_file",
            "Create a file, or replace a whole file's content.",
            _schema({"path": _PATH, "content": {"type": "string"}}),
            write_file,
        ),
        Tool("delete_file", "Delete a file.", _schema({"path": _PATH}), delete_file),
        Tool(
            "run_command",
            "Run a shell command in the workspace (sandboxed, time-limited).",
            _schema({"command": {"type": "string"}}, {"timeout_s": {"type": "number"}}),
            run_command,
        ),
        Tool(
            "run_tests",
            "Run the project's tests and summarise the failures.",
            _schema(
                {}, {"args": {"type": "string", "description": "extra arguments, e.g. a test file"}}
            ),
            run_tests,
        ),
    ]
}

_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """Why `arguments` do not fit the tool's schema, or None when they do."""
    if not isinstance(arguments, dict):
        return f"arguments of {tool.name} must be a JSON object"
    size = len(json.dumps(arguments, ensure_ascii=False, default=str))
    if size > MAX_ARGUMENT_CHARS:
        return (
            f"arguments of {tool.name} are {size / 1e6:.1f} MB; the limit is "
            f"{MAX_ARGUMENT_CHARS / 1e6:.0f} MB (write large files in parts or with edits)"
        )
    schema = tool.parameters
    props = schema["properties"]
    missing = [k for k in schema["required"] if k not in arguments]
    if missing:
        return f"{tool.name} is missing required argument(s) {', '.join(missing)}; it takes {sorted(props)}"
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"{tool.name} has no argument(s) {', '.join(unknown)}; it takes {sorted(props)}"
    for key, value in arguments.items():
        want = props[key].get("type")
        ok = isinstance(value, _TYPES[want]) if want else True
        if want in ("integer", "number") and isinstance(value, bool):
            ok = False
        if not ok and not (value is None and key not in schema["required"]):
            article = "an" if want[0] in "aeiou" else "a"
            return f"argument {key!r} of {tool.name} must be {article} {want}, got {value!r:.60}"
    return None


def run_tool(ctx: ToolContext, name: str, arguments: Any) -> tuple[str, bool]:
    """Run one call; returns (bounded result text, is_error). Never raises for bad calls."""
    tool = TOOLS.get(name)
    if tool is None:
        return f"unknown tool {name!r}; the tools are: {', '.join(TOOLS)}", True
    problem = check_arguments(tool, arguments)
    if problem:
        return problem, True
    limit = ctx.config.max_result_chars
    try:
        args = {k: v for k, v in arguments.items() if v is not None}
        text, is_error = bound(tool.run(ctx, **args), limit), False
    except (ToolError, WorkspaceError) as exc:
        text, is_error = bound(str(exc), limit), True
    except (OSError, UnicodeError) as exc:
        text, is_error = bound(f"{name} failed: {exc}", limit), True
    rules = folder_rules(ctx, arguments.get("path")) if name in FILE_TOOLS else ""
    return (f"{text}\n\n{rules}" if rules else text), is_error


FILE_TOOLS = ("read_file", "outline", "edit_file", "write_file", "delete_file")


def folder_rules(ctx: ToolContext, path: Any) -> str:
    """The rules of the folders above `path` that the model has not been shown yet (the root's
    are in the task's context), each folder once per task."""
    if not isinstance(path, str):
        return ""
    try:
        rel = ctx.workspace.rel(path)
    except WorkspaceError:
        return ""
    parts = rel.split("/")[:-1]
    shown = []
    for depth in range(1, len(parts) + 1):
        folder = "/".join(parts[:depth])
        if folder in ctx.rules_seen:
            continue
        ctx.rules_seen.add(folder)
        rules = project_rules(ctx.workspace, folder)
        if rules is not None:
            shown.append(rules.render())
    return "\n\n".join(shown)

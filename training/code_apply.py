"""Fast-apply examples made from real source files: an original file, an edit sketch, the result.

The synthetic projects of `training/tasks/` come from a few templates, so a small model learns
their text by heart and rewrites a file from memory instead of copying it (the starter did:
about 0.68 similarity to the expected file, never exact). Files it has never seen force it to
copy from its prompt, which is what fast apply is. Each example takes one `.py` file and makes
one edit with `ast`:

    rename_function   a function or method and every use of its name in the file
    change_constant   the value of an integer constant at module level
    add_import        a new top-level import after the last one
    remove_function   a top-level function (and its decorators)
    add_guard         a check of the first argument at the top of a function

The sketch is `edit_sketch` (the changed lines with `... existing code ...` markers) and the
conversation is the engine's own (agent/chat_format.py `apply_messages`). Files the engine
benchmark uses (agent/bench_prompts.py) are never used, so its *apply* workload stays unseen.

    flywheel train apply --source /usr/lib/python3.12 --out runs/x/tasks/apply_code.jsonl

What it does not do: edits that span files, or files over `max_chars` (the SFT context must
hold the file twice).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.bench_prompts import benched_files
from agent.chat_format import apply_messages
from training.tasks.fast_apply import edit_sketch

EXCLUDED = benched_files()
_IMPORTS = ["os", "sys", "re", "json", "math", "logging", "functools", "itertools", "typing"]
_SUFFIXES = ["_checked", "_safe", "_impl", "_v2", "_new", "_inner"]


@dataclass
class CodeApplyConfig:
    sources: list[str]  # folders of .py files
    count: int = 1200  # examples to write
    min_chars: int = 400  # smaller files teach little copying
    max_chars: int = 4000  # the file appears twice in the conversation
    heldout_fraction: float = 0.05  # by file, so no held-out file is trained on
    seed: int = 0


def source_files(config: CodeApplyConfig) -> Iterator[tuple[str, str]]:
    """(path relative to its source folder, text) of every usable file, in a stable order."""
    for source in config.sources:
        root = Path(source)
        if not root.is_dir():
            raise ValueError(f"apply source {source!r} is not a folder")
        for path in sorted(root.rglob("*.py")):
            parts = set(path.relative_to(root).parts)
            if path.name in EXCLUDED or parts & {"site-packages", "test", "tests"}:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if config.min_chars <= len(text) <= config.max_chars and "\t" not in text:
                yield str(path.relative_to(root)), text


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__")
    ]


def rename_function(text: str, tree: ast.Module, rng: random.Random) -> tuple[str, str] | None:
    funcs = _functions(tree)
    if not funcs:
        return None
    name = rng.choice(funcs).name
    new = name + rng.choice(_SUFFIXES)
    if re.search(rf"\b{new}\b", text):
        return None
    return re.sub(rf"\b{name}\b", new, text), f"rename `{name}` to `{new}`"


def change_constant(text: str, tree: ast.Module, rng: random.Random) -> tuple[str, str] | None:
    found = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and type(node.value.value) is int
        and node.lineno == node.end_lineno
    ]
    if not found:
        return None
    node = rng.choice(found)
    value = node.value.value
    new = value + rng.choice([1, 2, 10, -1]) if value else rng.choice([1, 8, 64])
    lines = text.splitlines(keepends=True)
    line = lines[node.lineno - 1]
    old = line[node.value.col_offset : node.value.end_col_offset]
    lines[node.lineno - 1] = (
        line[: node.value.col_offset] + str(new) + line[node.value.end_col_offset :]
    )
    return "".join(lines), f"set {node.targets[0].id} from {old} to {new}"


def add_import(text: str, tree: ast.Module, rng: random.Random) -> tuple[str, str] | None:
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    present = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names}
    choices = [m for m in _IMPORTS if m not in present]
    if not imports or not choices:
        return None
    module = rng.choice(choices)
    lines = text.splitlines(keepends=True)
    at = imports[-1].end_lineno
    lines.insert(at, f"import {module}\n")
    return "".join(lines), f"import {module}"


def remove_function(text: str, tree: ast.Module, rng: random.Random) -> tuple[str, str] | None:
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if len(funcs) < 2:
        return None
    node = rng.choice(funcs)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    lines = text.splitlines(keepends=True)
    last = node.end_lineno
    while last < len(lines) and not lines[last].strip():  # the blank lines after it
        last += 1
    if last == len(lines):  # at the end of the file: drop the blank lines before it instead
        while first > 0 and not lines[first - 1].strip():
            first -= 1
    return "".join(lines[:first] + lines[last:]), f"remove `{node.name}`"


def add_guard(text: str, tree: ast.Module, rng: random.Random) -> tuple[str, str] | None:
    funcs = [
        f
        for f in _functions(tree)
        if f.args.args
        and f.args.args[0].arg not in ("self", "cls")
        and f.body
        and f.body[0].lineno > f.lineno
    ]
    if not funcs:
        return None
    func = rng.choice(funcs)
    arg = func.args.args[0].arg
    first = func.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):  # the docstring
        if len(func.body) < 2:
            return None
        first = func.body[1]
    indent = " " * first.col_offset
    lines = text.splitlines(keepends=True)
    guard = [
        f"{indent}if {arg} is None:\n",
        f'{indent}    raise ValueError("{func.name}: {arg} is required")\n',
    ]
    at = first.lineno - 1
    return "".join(lines[:at] + guard + lines[at:]), f"check `{arg}` in `{func.name}`"


# edit -> weight: the edits that copy most of the file around a small change come first
EDITS = {rename_function: 3, change_constant: 2, add_import: 1, remove_function: 2, add_guard: 2}


def example(path: str, text: str, rng: random.Random, split: str) -> dict | None:
    """One fast-apply conversation for `text`, or None when no edit applies to it."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    # a weighted order without replacement (Efraimidis-Spirakis): the first edit that applies
    order = sorted(EDITS, key=lambda edit: -(rng.random() ** (1 / EDITS[edit])))
    for edit in order:
        made = edit(text, tree, rng)
        if made is None or made[0] == text:
            continue
        updated, summary = made
        # a removal shows the lines around the gap, or the sketch would not say what went
        context = rng.choice([1, 2] if edit is remove_function else [0, 1, 2])
        sketch = edit_sketch(text, updated, context)
        return {
            "task_id": hashlib.sha256(f"{path}:{summary}".encode()).hexdigest()[:16],
            "family": f"apply/{edit.__name__}",
            "split": split,
            "summary": summary,
            "messages": apply_messages(path, text, sketch, updated),
        }
    return None


def build(config: CodeApplyConfig, out: str | Path) -> dict:
    """Write `count` examples (JSONL, each row with its split); returns counts per family."""
    files = list(source_files(config))
    if not files:
        raise ValueError(
            f"no usable .py files ({config.min_chars}-{config.max_chars} characters) "
            f"in {', '.join(config.sources)}"
        )
    rng = random.Random(config.seed)
    rng.shuffle(files)  # every file once before any twice
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    tmp = out.with_suffix(".partial")
    with tmp.open("w") as handle:
        written = attempts = 0
        while written < config.count and attempts < 20 * config.count:
            attempts += 1
            path, text = files[(attempts - 1) % len(files)]
            bucket = int(hashlib.sha256(path.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
            split = "heldout" if bucket < config.heldout_fraction else "train"
            row = example(path, text, rng, split)
            if row is None:
                continue
            handle.write(json.dumps(row) + "\n")
            written += 1
            counts[row["family"]] = counts.get(row["family"], 0) + 1
            counts[split] = counts.get(split, 0) + 1
    tmp.replace(out)  # never a half-written file under the real name
    return {"files": len(files), "examples": written, **counts}

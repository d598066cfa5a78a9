"""Fast-apply examples from real files: each edit is valid Python and its sketch shows the change."""

import ast
import json
import random
import sysconfig
from pathlib import Path

import pytest

from agent.bench_prompts import APPLY_FILE
from training import code_apply
from training.code_apply import EDITS, CodeApplyConfig, build, example

SOURCE = '''"""A tiny module."""

import os

LIMIT = 10


def area(width, height):
    """Width times height."""
    return width * height


def double_area(width, height):
    return 2 * area(width, height)


class Box:
    def volume(self, depth):
        return area(1, 2) * depth
'''


@pytest.mark.parametrize("edit", list(EDITS), ids=lambda e: e.__name__)
def test_each_edit_changes_the_file_and_keeps_it_python(edit):
    made = None
    for seed in range(20):  # some edits pick among several places
        made = edit(SOURCE, ast.parse(SOURCE), random.Random(seed))
        if made:
            break
    assert made is not None, f"{edit.__name__} found nothing to edit"
    updated, summary = made
    assert updated != SOURCE and summary
    ast.parse(updated)


def test_rename_changes_every_use():
    updated, summary = code_apply.rename_function(
        "def f(x):\n    return x\n\n\ndef g():\n    return f(1) + f(2)\n",
        ast.parse("def f(x):\n    return x\n\n\ndef g():\n    return f(1) + f(2)\n"),
        random.Random(0),
    )
    old, new = summary.split("`")[1], summary.split("`")[3]
    assert f"{old}(" not in updated.replace(f"{new}(", "")
    assert updated.count(f"{new}(") == (3 if old == "f" else 1)


def test_example_is_an_apply_conversation_whose_sketch_holds_every_new_line():
    for seed in range(10):
        row = example("pkg/mod.py", SOURCE, random.Random(seed), "train")
        system, user, assistant = row["messages"]
        assert user["content"].startswith('<file path="pkg/mod.py">\n' + SOURCE)
        sketch = user["content"].split("<edit>\n")[1]
        old_lines = set(SOURCE.splitlines())
        for line in assistant["content"].splitlines():
            if line not in old_lines:
                assert line in sketch
        ast.parse(assistant["content"])


def test_build_splits_by_file_and_never_uses_the_benchmarks_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"m{i}.py").write_text(SOURCE.replace("LIMIT", f"LIMIT_{i}"))
    (src / APPLY_FILE).write_text(SOURCE)  # the engine benchmark's file
    (src / "tiny.py").write_text("x = 1\n")  # too small to teach copying
    out = tmp_path / "apply.jsonl"
    config = CodeApplyConfig([str(src)], count=30, min_chars=100, heldout_fraction=0.3)
    counts = build(config, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert counts["examples"] == len(rows) == 30 and counts["files"] == 6
    paths = {r["messages"][1]["content"].split('"')[1] for r in rows}
    assert APPLY_FILE not in paths and "tiny.py" not in paths
    split_of = {}
    for r in rows:
        path = r["messages"][1]["content"].split('"')[1]
        assert split_of.setdefault(path, r["split"]) == r["split"]
    assert not out.with_suffix(".partial").exists()


def test_a_folder_without_usable_files_is_a_clear_error(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no usable .py files"):
        build(CodeApplyConfig([str(tmp_path)], count=3), tmp_path / "out.jsonl")
    with pytest.raises(ValueError, match="not a folder"):
        build(CodeApplyConfig([str(tmp_path / "missing")], count=3), tmp_path / "out.jsonl")


def test_stdlib_yields_examples_of_every_family(tmp_path):
    out = tmp_path / "apply.jsonl"
    counts = build(CodeApplyConfig([sysconfig.get_paths()["stdlib"]], count=200), out)
    assert counts["examples"] == 200
    assert {f"apply/{e.__name__}" for e in EDITS} <= set(counts)
    assert Path(out).stat().st_size > 0

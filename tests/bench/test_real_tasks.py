"""Real-code tasks for `flywheel bench agent --real`: extraction of a
real function with what it needs, tasks verified to fail before and pass after, determinism by
seed, the held-out split by package, and the benchmark source through the real harness.

No model: a few functions are built for real (subprocesses, a few seconds), and a scripted replay
engine writes the reference fix. The whole set is built only under `-m slow`.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness.replay import ReplayEngine, call
from training.benchmark import BenchConfig, BenchmarkError, load_tasks, run_benchmark, run_verifier
from training.tasks.extract import ExtractError, extract
from training.tasks.oracle import hunks_for
from training.tasks.real import build, is_heldout, probe_table, read_rows, real_tasks, write_set

# A held-out package and a train one, a bug-rich function and a short one with a docstring.
FEW = [("colorsys", "rgb_to_hsv"), ("encodings.punycode", "adapt"), ("datetime", "_ymd2ord")]


@pytest.fixture(scope="module")
def built() -> tuple[list[dict], dict]:
    return build(seed=0, only=FEW, workers=1)


def _write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_extract_takes_what_the_function_needs_and_nothing_else(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("VALUE = 1\n")
    (pkg / "mod.py").write_text(
        textwrap.dedent(
            '''\
            import re
            from os.path import *
            from .helpers import VALUE

            LIMIT = 3
            TABLE = [0]
            for i in range(LIMIT):
                TABLE.append(i)
            UNUSED = 5


            def helper(x):
                return x * 2


            def target(s):
                """Double the digits, then split."""
                n = helper(len(re.findall(r"\\d", s)))
                return split(s)[1], n + TABLE[-1]


            def relative():
                return VALUE
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ex = extract("fakepkg.mod", "target", "# header")
    assert ex.source.startswith("# header\n")
    assert "from os.path import split\n" in ex.source  # a star import narrowed to its name
    assert "TABLE.append(i)" in ex.source and "LIMIT = 3" in ex.source  # the loop that fills it
    assert "UNUSED" not in ex.source and "relative" not in ex.source and "VALUE" not in ex.source
    lines = ex.source.splitlines()
    assert lines[ex.start - 1].startswith("def target(") and lines[ex.end - 1].startswith(
        "    return"
    )
    namespace: dict = {}
    exec(compile(ex.source, "extract", "exec"), namespace)
    assert namespace["target"]("a1/b22") == ("b22", 8)
    with pytest.raises(ExtractError) as relative:
        extract("fakepkg.mod", "relative")
    assert relative.value.reason == "non_stdlib_import"
    with pytest.raises(ExtractError) as missing:
        extract("fakepkg.mod", "nope")
    assert missing.value.reason == "not_found"


def test_each_task_fails_before_and_passes_after(built, tmp_path):
    """The verifier (sandboxed, as the benchmark runs it) fails on the broken workspace and
    passes with the reference solution; the tests travel as verify files, so editing them
    does not pass."""
    rows, manifest = built
    assert {(r["module"], r["function"]) for r in rows} == set(FEW)
    families = {r["task"]["family"] for r in rows}
    assert "rewrite/body" in families and any(f.startswith("bugfix/") for f in families)
    for i, row in enumerate(rows):
        task = load_tasks(real=write_set(tmp_path / "set", [row], manifest), split="all")[0]
        assert task.source == "real" and task.test_command is None  # detected, as for a user
        [module_file] = row["solution"]
        assert module_file in task.instruction or task.instruction == "fix the failing tests"
        assert set(task.verify_files) == {f"test_{module_file}"}
        broken = _write(tmp_path / f"broken{i}", task.files)
        assert run_verifier(broken, task, 30)[0] is False, task.id
        fixed = _write(tmp_path / f"fixed{i}", {**task.files, **row["solution"]})
        assert run_verifier(fixed, task, 30) == (True, "passed"), task.id
        gamed = _write(
            tmp_path / f"gamed{i}", {**task.files, **dict.fromkeys(task.verify_files, "")}
        )
        assert run_verifier(gamed, task, 30)[0] is False, task.id  # emptied tests are restored
        assert task.reference_changed_lines > 0 and len(task.files[module_file].splitlines()) <= 150
    rewrite = next(
        r["task"]
        for r in rows
        if r["task"]["family"] == "rewrite/body" and r["function"] == "_ymd2ord"
    )
    assert "    raise NotImplementedError\n" in rewrite["files"]["datetime_mod.py"]
    assert "considering 01-Jan-0001 as day 1" in rewrite["instruction"]  # its docstring


def test_the_build_is_deterministic_from_the_seed(built):
    """Each function draws from its own seeded generator: a subset build gives the same rows."""
    rows, _ = built
    again, _ = build(seed=0, only=[FEW[0]], workers=1)
    assert again == [r for r in rows if (r["module"], r["function"]) == FEW[0]]
    other, _ = build(seed=1, only=[FEW[0]], workers=1)
    assert [r["task"]["id"] for r in other] != [r["task"]["id"] for r in again]
    assert {r["split"] for r in other} == {r["split"] for r in again}  # the split ignores the seed


def test_the_split_is_by_package_and_holds_out_enough_packages(built):
    rows, manifest = built
    packages = {m.split(".")[0] for m, _ in probe_table()}
    heldout = {p for p in packages if is_heldout(p)}
    assert len(heldout) >= 5 and len(packages - heldout) >= 5
    for row in rows:
        assert row["split"] == ("heldout" if is_heldout(row["package"]) else "train")
        assert row["package"] == row["module"].split(".")[0]
    assert {r["split"] for r in rows} == {"heldout", "train"}  # colorsys, and the other two
    assert manifest["packages"]["colorsys"]["split"] == "heldout"
    assert sum(manifest["tasks"].values()) == len(rows)
    stdlib = {p for p in packages if p in sys.stdlib_module_names}
    assert stdlib and packages - stdlib  # the standard library and site-packages both


def test_the_bench_source_runs_a_real_task_through_the_harness(built, tmp_path):
    """`load_tasks(real=FOLDER)` gives the tasks; a scripted model that writes the reference fix
    passes, one that does nothing fails."""
    rows, manifest = built
    folder = write_set(tmp_path / "real", rows, manifest)
    assert read_rows(folder) == rows
    assert len(real_tasks(folder, "all")) == len(rows)
    heldout = load_tasks(real=folder)
    assert heldout and all(t.id.startswith("real/colorsys.") for t in heldout)
    row = next(r for r in rows if r["task"]["family"].startswith("bugfix/"))
    task = next(t for t in load_tasks(real=folder, split="all") if t.id == row["task"]["id"])
    [(path, solution)] = row["solution"].items()
    hunks = [  # as a model writes them: without the final newline
        {k: v.rstrip("\n") for k, v in h.items()} for h in hunks_for(task.files[path], solution)
    ]
    engine = ReplayEngine(
        [
            call("read_file", path=path),
            call("edit_file", path=path, hunks=hunks),
            call("run_tests"),
            "Fixed.",
        ]
    )
    result = run_benchmark(engine, [task], BenchConfig(max_steps=6, lint=False))
    [sample] = result.samples
    assert sample.passed and sample.verdict == "passed" and sample.stop_reason == "answered"
    tool_results = [
        m["content"] for r in engine.requests for m in r.messages if m["role"] == "tool"
    ]
    assert not any("no test command" in str(text) for text in tool_results)
    idle = run_benchmark(ReplayEngine(["Nothing to change."]), [task], BenchConfig(lint=False))
    assert not idle.samples[0].passed
    with pytest.raises(BenchmarkError, match="python -m training.tasks.real build --out"):
        load_tasks(real=tmp_path / "missing")


@pytest.mark.slow
def test_the_whole_set_holds_out_fifty_tasks_from_five_packages():
    """The set is big and varied enough to score on: >= 50 held-out tasks from >= 5 packages."""
    rows, manifest = build(seed=0, workers=2)
    heldout = [r for r in rows if r["split"] == "heldout"]
    assert len(heldout) >= 50 and len({r["package"] for r in heldout}) >= 5
    assert len({r["task"]["id"] for r in rows}) == len(rows)
    assert sum(manifest["dropped"].values()) > 0  # the verification does drop some

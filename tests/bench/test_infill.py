"""`flywheel bench infill`: the masked lines, both prompt styles, the check, and a run end to end
on the tiny test model (random weights: it measures nothing, but every step runs)."""

from __future__ import annotations

import json

from agent.chat_format import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX
from benchmarks import infill


def test_the_canonical_line_passes_and_a_wrong_one_fails():
    tasks = infill.infill_tasks(limit=12)
    assert len(tasks) == 12 and len({t.id for t in tasks}) == 12
    for task in tasks:
        assert task.line.strip() and task.line not in ("", "\n")
        assert infill.passes(task, task.line), task.id
        assert not infill.passes(task, task.line.rstrip() + " +"), task.id  # a syntax error


def test_the_masked_line_depends_on_the_seed_only():
    a, b = infill.infill_tasks(limit=30, seed=0), infill.infill_tasks(limit=30, seed=0)
    assert a == b
    assert [t.line for t in infill.infill_tasks(limit=30, seed=1)] != [t.line for t in a]


def test_prompt_styles():
    task = infill.infill_tasks(limit=1)[0]
    assert task.prefix.endswith("\n")  # the masked line starts a line: its break is healed
    assert infill.prompt_for(task, "prefix", 10_000) == task.prefix[:-1]
    fim = infill.prompt_for(task, "fim", 10_000)
    # Qwen's repository-level prompt: the file's own section holds the fill-in-the-middle
    assert fim.startswith("<|repo_name|>") and fim.endswith(FIM_MIDDLE)
    assert f"{FIM_PREFIX}{task.prefix[:-1]}{FIM_SUFFIX}" in fim
    assert infill.first_line("\n  return x<|endoftext|>junk\nmore", task.prefix) == "  return x"
    assert infill.first_line("  return x", task.prefix) == ""  # did not open a new line


def test_a_run_writes_its_table_and_json(bench_checkpoint, tmp_path, capsys):
    out = tmp_path / "infill.json"
    code = infill.main(["--model", str(bench_checkpoint), "--limit", "3", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["tasks"] == 3 and [s["style"] for s in report["scores"]] == ["fim", "prefix"]
    assert len(report["samples"]) == 6 and "pass@1" in capsys.readouterr().out


def test_a_missing_model_is_one_line(tmp_path, capsys):
    code = infill.main(["--model", str(tmp_path / "nope"), "--limit", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot open model" in err

"""The MTP heads' self-distillation text (training/self_text.py)."""

from __future__ import annotations

import json

from agent.bench_prompts import STDLIB, benched_files
from training import self_text


def test_windows_are_reproducible_and_never_from_the_benchmarked_files():
    files = {p.relative_to(STDLIB).as_posix() for p in self_text.stdlib_files()}
    assert files and not files & benched_files()
    assert not any(f.startswith(("test/", "idlelib/")) for f in files)
    first = self_text.windows(5, seed=0)
    assert first == self_text.windows(5, seed=0) != self_text.windows(5, seed=1)
    assert all(30 <= len(w.splitlines()) <= 60 for w in first)


def test_continuations_extend_each_window_with_the_models_greedy_text(tmp_path, tiny_checkpoint):
    out = self_text.continuations(
        str(tiny_checkpoint), tmp_path / "c.jsonl", count=3, max_tokens=4, log=lambda s: None
    )
    rows = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    windows = self_text.windows(3)
    assert len(rows) == 3 and all(
        r.startswith(w) and len(r) > len(w) for r, w in zip(rows, windows, strict=True)
    )
    again = self_text.continuations(
        str(tiny_checkpoint), tmp_path / "d.jsonl", count=3, max_tokens=4, log=lambda s: None
    )
    assert again.read_text() == out.read_text()  # greedy, whatever shared the engine's steps
    assert not list(tmp_path.glob("*.tmp"))


def test_a_killed_run_keeps_its_whole_rows_and_continues_after_them(tmp_path, tiny_checkpoint):
    from agent.model import checkpoint_version

    out = tmp_path / "c.jsonl"
    first = self_text.windows(3)[0]
    tmp = tmp_path / f"c.jsonl.{checkpoint_version(tiny_checkpoint)}-4.tmp"
    # What a kill leaves: one whole row (marked, to see that it is kept) and one cut short.
    tmp.write_text(json.dumps({"text": first + " KEPT"}) + "\n" + '{"text": "cut sh')
    self_text.continuations(str(tiny_checkpoint), out, count=3, max_tokens=4, log=lambda s: None)
    rows = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    fresh = self_text.continuations(
        str(tiny_checkpoint), tmp_path / "d.jsonl", count=3, max_tokens=4, log=lambda s: None
    )
    assert rows[0] == first + " KEPT" and len(rows) == 3
    assert rows[1:] == [json.loads(line)["text"] for line in fresh.read_text().splitlines()][1:]
    assert not tmp.exists()

"""benchmarks/mtp_agreement.py on a tiny checkpoint with heads: every head scored, both parts."""

from __future__ import annotations

import importlib
import json


def test_each_head_is_scored_on_the_prompt_and_the_continuation(tiny_checkpoint, tmp_path):
    bench = importlib.import_module("benchmarks.mtp_agreement")
    out = tmp_path / "agreement.json"
    assert (
        bench.main(["--model", str(tiny_checkpoint), "--max-tokens", "6", "--json", str(out)]) == 0
    )
    report = json.loads(out.read_text())
    assert report["benchmark"] == "mtp_agreement" and report["prompts"]
    for row in report["prompts"].values():
        assert row["continuation_tokens"] <= 6 and row["prompt_tokens"] > 0
        for k in ("head0", "head1"):
            assert 0.0 <= row[k]["prompt"] <= 1.0 and 0.0 <= row[k]["continuation"] <= 1.0


def test_a_checkpoint_without_heads_is_one_line(tmp_path, tokenizer, capsys):
    from tests.conftest import make_checkpoint

    bench = importlib.import_module("benchmarks.mtp_agreement")
    folder = tmp_path / "plain"
    make_checkpoint(folder, tokenizer, seed=0, mtp_depth=0)
    assert bench.main(["--model", str(folder)]) == 2
    assert capsys.readouterr().err.count("\n") == 1

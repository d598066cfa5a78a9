"""`flywheel bench passkey`: the prompt hides the key where asked; the report counts retrievals."""

from __future__ import annotations

import json

from benchmarks.passkey import FILLER, QUESTION, main, passkey_prompt


def test_the_prompt_has_the_key_once_at_its_depth_and_about_its_length(tokenizer):
    for depth in (0.05, 0.5, 0.95):
        ids = passkey_prompt(tokenizer, 600, depth, 43210)
        text = tokenizer.decode(ids)
        assert abs(len(ids) - 600) <= 2 * len(tokenizer.encode(FILLER))
        assert text.endswith(QUESTION)
        assert text.count("The pass key is 43210.") == 1
        at = text.index("43210") / len(text)
        assert abs(at - depth) < 0.1


def test_the_report_counts_each_length_and_names_the_failed_depths(
    tiny_checkpoint, corpus, tmp_path
):
    out = tmp_path / "pk.json"
    argv = ["--model", str(tiny_checkpoint), "--length", "96", "--length", "160"]
    argv += ["--loss-data", str(corpus), "--loss-windows", "1"]
    assert main([*argv, "--samples", "2", "--rope", "yarn", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert all(row["heldout_loss"] > 0 for row in report["lengths"].values())
    assert set(report["lengths"]) == {"96", "160"} and len(report["samples"]) == 4
    for row in report["lengths"].values():  # a random tiny model retrieves nothing
        assert row["samples"] == 2 and len(row["failed_depths"]) == 2 - row["passed"]
    assert report["rope"] == {"type": "yarn", "factor": 2.0}
    assert report["command"].startswith("flywheel bench passkey --model")


def test_bad_arguments_are_one_line(capsys, tiny_checkpoint):
    assert main(["--samples", "0"]) == 2
    assert "need --samples >= 1" in capsys.readouterr().err
    argv = ["--model", str(tiny_checkpoint), "--loss-data", "/nonexistent", "--length", "96"]
    assert main([*argv, "--samples", "1"]) == 1
    assert "not a built corpus" in capsys.readouterr().err

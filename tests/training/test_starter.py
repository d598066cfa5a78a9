"""`flywheel train starter --quick`: the whole chain runs end to end and writes its lineage."""

from __future__ import annotations

import json

import pytest

from agent.model import load_checkpoint
from training.cli import main
from training.starter import StarterConfig, model_card, stage_overrides


def test_stage_paths_point_into_the_run_folder(tmp_path):
    config = StarterConfig(out=str(tmp_path))
    sft = stage_overrides(config, "sft")
    assert sft["init"] == str(tmp_path / "long_context" / "model")
    assert sft["sft_data"][0] == str(tmp_path / "tasks" / "trajectories.jsonl")
    assert stage_overrides(config, "pretrain")["out"] == str(tmp_path / "pretrain")


@pytest.mark.slow
def test_quick_chain_writes_a_loadable_model_with_lineage(tmp_path):
    assert main(["starter", "--out", str(tmp_path), "--quick"]) == 0
    meta = json.loads((tmp_path / "model" / "flywheel.json").read_text())
    assert meta["version"].startswith("starter-") and meta["version"].endswith("-quick")
    assert set(meta["recipes"]) == {"pretrain", "long_context", "sft", "mtp"}
    assert meta["data"]["corpus_manifest_sha256"] and meta["evaluation"]["tasks"] >= 1
    assert meta["data"]["apply_code_sha256"]  # fast apply from the corpus's own files
    assert load_checkpoint(tmp_path / "model").heads is not None
    assert "## Reproduce" in model_card(tmp_path / "model")
    assert main(["starter", "--out", str(tmp_path), "--quick"]) == 0  # a rerun resumes: no-op

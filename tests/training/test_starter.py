"""`flywheel train starter --quick`: the whole chain runs end to end and writes its lineage."""

from __future__ import annotations

import json

import pytest

from agent.model import is_adapter, load_checkpoint
from training.cli import main
from training.starter import STAGE_ORDER, StarterConfig, model_card, stage_overrides


def test_stage_paths_point_into_the_run_folder(tmp_path):
    config = StarterConfig(out=str(tmp_path))
    sft = stage_overrides(config, "sft")
    assert sft["init"] == "base" and sft["out"] == str(tmp_path / "sft")
    assert sft["sft_data"] == [str(tmp_path / "tasks" / "trajectories.jsonl")]
    for before, stage in zip(STAGE_ORDER, STAGE_ORDER[1:], strict=False):  # each continues the last
        assert stage_overrides(config, stage)["init"] == str(tmp_path / before / "model")


@pytest.mark.slow
def test_quick_chain_writes_a_loadable_adapter_with_lineage(tmp_path):
    assert main(["starter", "--out", str(tmp_path), "--quick"]) == 0
    meta = json.loads((tmp_path / "model" / "flywheel.json").read_text())
    assert meta["version"].startswith("starter-") and meta["version"].endswith("-quick")
    assert set(meta["recipes"]) == set(STAGE_ORDER) and meta["base"].startswith("smollm2")
    assert list((tmp_path / "eval-transcripts").glob("*.jsonl"))  # why each eval task went so
    assert meta["data"]["tasks_manifest_sha256"] and meta["evaluation"]["tasks"] >= 1
    assert is_adapter(tmp_path / "model")
    assert load_checkpoint(tmp_path / "model").trunk.config.hidden_size == 576
    assert "## Reproduce" in model_card(tmp_path / "model")
    assert main(["starter", "--out", str(tmp_path), "--quick"]) == 0  # a rerun resumes: no-op

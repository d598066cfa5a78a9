"""DeepSpeed ZeRO-2 with two processes (gloo, CPU) ends near the plain-torch loss. Slow tier."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_two_processes_matches_plain_torch(tmp_path, corpus, zero):
    pytest.importorskip("deepspeed")
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed")
    common = [
        "--recipe",
        str(ROOT / "training/recipes/pretrain.toml"),
        "--no-progress",
        "--set",
        f"data={corpus}",
        "--set",
        "model_size=test",
        "--set",
        "seq_len=32",
        "--set",
        "batch_size=2",
        "--set",
        "steps=8",
        "--set",
        "warmup_steps=1",
        "--set",
        "log_every=1",
        "--set",
        "eval_every=8",
        "--set",
        "save_every=8",
        "--set",
        "eval_batches=1",
    ]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    plain = tmp_path / "plain"
    # plain torch with the global batch of the two processes (2 x 2)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "training.cli",
            "pretrain",
            *common,
            "--set",
            f"out={plain}",
            "--set",
            "batch_size=4",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
    )
    ds = tmp_path / "ds"
    subprocess.run(
        [
            launcher,
            "--num_accelerators",
            "2",
            "--module",
            "training.cli",
            "pretrain",
            *common,
            "--set",
            f"out={ds}",
            "--set",
            f"deepspeed={ROOT / f'training/recipes/ds_zero{zero}.json'}",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=900,
    )

    def final_loss(out: Path) -> float:
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if r["kind"] == "eval"][-1]["eval_loss"]

    assert abs(final_loss(ds) - final_loss(plain)) / final_loss(plain) < 0.02
    assert (ds / "model" / "model.safetensors").exists()

"""DeepSpeed ZeRO with two processes (gloo, CPU) ends within 2% of the plain-torch loss.

The same pretrain recipe, corpus and seed run twice: plain torch in one process with the global
batch (4), and under the `deepspeed` launcher with two processes of batch 2 each. Both runs are
fp32 (the recipe's bf16 autocast applies to plain torch only; DeepSpeed's JSON holds no bf16) and
both evaluate the same held-out windows (plain: 1 batch of 4; DeepSpeed: 2 batches of 2). The
training windows are not identical (a batch is a function of seed, rank and index: rank 0 sees
the first half of the plain run's windows, rank 1 others), which is why the check is a tolerance.

    slow       ZeRO-2 and ZeRO-3, 8 steps        pytest -m slow tests/training/test_deepspeed.py
    deepspeed  ZeRO-2 only, 4 steps (CI)         pytest -m deepspeed   (make test-deepspeed)

The launched processes build the ops DeepSpeed compiles (on a CPU: its shared-memory
communication op, with the system C++ compiler, about a minute) under
~/.cache/flywheel/torch_extensions (TORCH_EXTENSIONS_DIR), so later runs and CI reuse them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SEQ_LEN = 32  # short windows: the comparison is about the runtime, not the model
EXTENSIONS = Path.home() / ".cache" / "flywheel" / "torch_extensions"


def _launcher() -> str:
    pytest.importorskip("deepspeed")
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed")
    return launcher


def _final_eval_loss(out: Path) -> float:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "eval"][-1]["eval_loss"]


def _exported_eval_loss(model: Path, corpus: Path) -> float:
    """The held-out loss of the written model on the windows both runs evaluate (4 x SEQ_LEN)."""
    import torch

    from agent.model import load_checkpoint
    from training.data import PackedTokens
    from training.stages import heldout_loss

    trunk = load_checkpoint(model).trunk
    heldout = PackedTokens(corpus, "heldout")
    return heldout_loss(
        trunk, heldout, SEQ_LEN, batches=1, batch_size=4, device=torch.device("cpu")
    )


def _compare(tmp_path: Path, corpus: Path, zero: int, steps: int) -> None:
    """Run plain torch and DeepSpeed ZeRO-`zero` for `steps` steps; assert losses and model."""
    launcher = _launcher()
    EXTENSIONS.mkdir(parents=True, exist_ok=True)
    common = [
        "--recipe",
        str(ROOT / "training/recipes/pretrain.toml"),
        "--no-progress",
        "--set",
        f"data={corpus}",
        "--set",
        "model_size=test",
        "--set",
        f"seq_len={SEQ_LEN}",
        "--set",
        'precision="fp32"',
        "--set",
        f"steps={steps}",
        "--set",
        "warmup_steps=1",
        "--set",
        "log_every=1",
        "--set",
        f"eval_every={steps}",
        "--set",
        f"save_every={steps}",
    ]
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "PYTHONPATH": str(ROOT),
        "TORCH_EXTENSIONS_DIR": str(EXTENSIONS),
    }
    plain = tmp_path / "plain"
    # one process with the global batch of the two DeepSpeed processes (2 x 2)
    subprocess.run(
        [sys.executable, "-m", "training.cli", "pretrain", *common]
        + ["--set", f"out={plain}", "--set", "batch_size=4", "--set", "eval_batches=1"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
    )
    ds = tmp_path / "ds"
    config = ROOT / f"training/recipes/ds_zero{zero}.json"
    subprocess.run(
        [launcher, "--num_accelerators", "2", "--module", "training.cli", "pretrain", *common]
        + ["--set", f"out={ds}", "--set", "batch_size=2", "--set", "eval_batches=2"]
        + ["--set", f"deepspeed={config}"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=900,
    )

    plain_loss, ds_loss = _final_eval_loss(plain), _final_eval_loss(ds)
    difference = abs(ds_loss - plain_loss) / plain_loss
    print(
        f"ZeRO-{zero}, {steps} steps: plain {plain_loss:.5f}, DeepSpeed {ds_loss:.5f}, {difference:.2%}"
    )
    assert difference < 0.02
    # the written model is the trained one (under ZeRO-3 an ungathered export would hold empty
    # tensors and not load)
    assert _exported_eval_loss(ds / "model", corpus) == pytest.approx(ds_loss, rel=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the two subprocess timeouts, not the suite's 300 s
@pytest.mark.parametrize("zero", [2, 3])
def test_zero_two_processes_matches_plain_torch(tmp_path, corpus, zero):
    _compare(tmp_path, corpus, zero, steps=8)


@pytest.mark.deepspeed
@pytest.mark.timeout(1500)
def test_zero2_short_run_matches_plain_torch(tmp_path, corpus):
    """The CI variant: ZeRO-2 only, 4 steps."""
    _compare(tmp_path, corpus, zero=2, steps=4)

"""`flywheel train starter --quick`: the whole chain runs end to end and writes its lineage."""

from __future__ import annotations

import json

import pytest

from agent.model import is_adapter, load_apply_checkpoint, load_checkpoint
from training.cli import main
from training.starter import (
    STAGE_ORDER,
    Ledger,
    StarterConfig,
    apply_overrides,
    mtp_overrides,
    stage_overrides,
    status,
)
from training.starter_ship import compress_apply, compress_heads, model_card
from training.tasks import stable_sha256


def test_stage_paths_point_into_the_run_folder(tmp_path):
    config = StarterConfig(out=str(tmp_path))
    sft = stage_overrides(config, "sft")
    assert sft["init"] == "base" and sft["out"] == str(tmp_path / "sft")
    tasks = tmp_path / "tasks"
    assert sft["sft_data"] == [str(tasks / "trajectories.jsonl"), str(tasks / "recovery.jsonl")]
    assert sft["code_data"] == str(tmp_path / "code")  # the code rows mixed into SFT
    for before, stage in zip(STAGE_ORDER, STAGE_ORDER[1:], strict=False):  # each continues the last
        assert stage_overrides(config, stage)["init"] == str(tmp_path / before / "model")
    mtp = mtp_overrides(config)  # the heads are distilled from the last stage's model
    assert mtp["init"] == str(tmp_path / STAGE_ORDER[-1] / "model")
    assert mtp["data"] == str(tmp_path / "mtp_text" / "corpus") and mtp["out"] == str(
        tmp_path / "mtp"
    )
    apply = apply_overrides(config)  # the fast-apply adapter is its own, on the base
    assert apply["init"] == "base" and apply["out"] == str(tmp_path / "apply")
    assert apply["sft_data"] == [str(tmp_path / "tasks" / "apply_code.jsonl")]


def test_compress_heads_stores_them_in_int4_and_leaves_the_trunk(tmp_path, tiny_checkpoint):
    import shutil

    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, folder)
    before = load_checkpoint(folder)
    trunk_bytes = (folder / "model.safetensors").read_bytes()
    heads_size = (folder / "mtp" / "model.safetensors").stat().st_size
    compress_heads(folder)
    assert (folder / "model.safetensors").read_bytes() == trunk_bytes
    assert (folder / "mtp" / "model.safetensors").stat().st_size < heads_size / 4
    assert any(
        v.dtype == torch.uint8
        for v in load_file(str(folder / "mtp" / "model.safetensors")).values()
    )
    after = load_checkpoint(folder)  # loads back in float32, heads expanded
    for name, weight in before.heads.state_dict().items():
        step = float(weight.abs().max()) / 7  # the largest group's int4 step
        error = (after.heads.state_dict()[name] - weight).abs().max()
        assert error <= step * 0.51  # half a step, plus the float16 rounding of the scale


def test_ledger_counts_a_killed_step_and_not_a_finished_one(tmp_path):
    import threading

    path = tmp_path / "timings.json"
    ledger = Ledger(path, log=lambda _: None, every=0.01)
    beat = threading.Event()
    written = ledger._write

    def write(step, seconds):
        written(step, seconds)
        beat.set()

    ledger._write = write
    with pytest.raises(KeyboardInterrupt), ledger.step("sft"):  # a kill mid-step
        assert beat.wait(10)
        raise KeyboardInterrupt
    first = json.loads(path.read_text())["sft"]  # its time so far, from the heartbeat
    resumed = Ledger(path, log=lambda _: None, every=60)
    with resumed.step("sft"):  # the resumed invocation finds the step done: nothing added
        pass
    with resumed.step("tasks"):
        pass
    assert json.loads(path.read_text()) == {"sft": first}
    path.write_text("{not json")  # a ledger cut short starts again rather than failing the run
    assert Ledger(path, log=lambda _: None).timings == {}


def test_status_says_where_a_killed_run_stands(tmp_path, capsys):
    """A run killed in its first SFT stage: tasks written, 16 of 64 steps logged (the last
    line cut short by the kill), 2 evaluation tasks kept from an earlier evaluation."""
    (tmp_path / "timings.json").write_text(json.dumps({"tasks": 250.0, "sft": 800.0}))
    (tmp_path / "tasks").mkdir()
    for name in ("manifest.json", "recovery.jsonl"):
        (tmp_path / "tasks" / name).write_text("{}")
    (tmp_path / "sft").mkdir()
    rows = [{"step": s, "kind": "train", "loss": 1.0} for s in (8, 16)]
    (tmp_path / "sft" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 24, "ki'
    )
    (tmp_path / "eval-progress.jsonl").write_text("{}\n{}\n")
    states = {step: (state, spent) for step, state, spent in status(StarterConfig(str(tmp_path)))}
    assert states["tasks"] == ("done", "4m10s")
    from training.recipe import load_recipe
    from training.starter import RECIPES
    from training.trainer import clock

    sft_steps = load_recipe(RECIPES / "sft.toml").steps
    left = clock(800 / 16 * (sft_steps - 16))  # the pace so far times the steps left
    assert states["sft"] == (f"step 16/{sft_steps}, about {left} left", "13m20s")
    assert states["mtp"] == ("not started", "-") and states["mtp_self"][0] == "not started"
    assert states["eval"][0] == "2 of 27 tasks done" and states["model"] == (
        "not written yet",
        "17m30s",
    )
    steps = ["base", "tasks", *STAGE_ORDER, "mtp", "mtp_self", "apply", "eval", "eval_apply"]
    assert list(states) == [*steps, "model"]
    assert main(["starter", "--out", str(tmp_path), "--status"]) == 0  # reads, does not run
    assert f"step 16/{sft_steps}" in capsys.readouterr().out and not (tmp_path / "model").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)  # every step of the chain, each shrunk: minutes, not the suite's 300 s
def test_quick_chain_writes_a_loadable_adapter_with_lineage(tmp_path):
    assert main(["starter", "--out", str(tmp_path), "--quick"]) == 0
    meta = json.loads((tmp_path / "model" / "flywheel.json").read_text())
    assert meta["version"].startswith("starter-") and meta["version"].endswith("-quick")
    assert set(meta["recipes"]) == {*STAGE_ORDER, "mtp", "mtp_self", "apply"}
    assert meta["base"].startswith("qwen2.5-coder-0.5b") and meta["data"]["apply_examples_sha256"]
    assert meta["data"]["code"]["fingerprint"]  # the split of the code rows
    assert list((tmp_path / "eval-transcripts").glob("*.jsonl"))  # why each eval task went so
    assert meta["data"]["tasks_manifest_sha256"] and meta["evaluation"]["tasks"] >= 1
    trajectories = tmp_path / "tasks" / "trajectories.jsonl"
    assert meta["data"]["trajectories_stable_sha256"] == stable_sha256(trajectories)
    assert is_adapter(tmp_path / "model")
    model = load_checkpoint(tmp_path / "model")
    assert model.trunk.config.hidden_size == 896 and len(model.heads.heads) == 2
    assert is_adapter(tmp_path / "model" / "apply")  # the fast-apply adapter rides along
    apply = load_apply_checkpoint(model)
    assert apply.version != model.version and apply.heads is not None
    assert "## Reproduce" in model_card(tmp_path / "model")
    assert main(["starter", "--out", str(tmp_path), "--quick"]) == 0  # a rerun resumes: no-op
    states = {step: state for step, state, _ in status(StarterConfig(str(tmp_path), quick=True))}
    assert states.pop("model").startswith("written: starter-") and states.pop("base") == "converted"
    assert set(states.values()) == {"done"}


def test_compress_apply_stores_the_apply_adapter_in_float16(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "apply" / "adapter_model.safetensors"
    weights.parent.mkdir()
    state = {"a.lora_A.weight": torch.randn(4, 8), "a.lora_B.weight": torch.randn(8, 4)}
    save_file(state, str(weights))
    compress_apply(tmp_path)
    after = load_file(str(weights))
    for name, weight in state.items():
        assert after[name].dtype == torch.float16
        assert torch.allclose(after[name].float(), weight, rtol=1e-3, atol=1e-4)

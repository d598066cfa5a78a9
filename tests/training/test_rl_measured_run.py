"""The measured RL run (training/rl/measured_run.py, recipes/rl_gpu.toml) rehearsed on the CPU with
a tiny model, so that the GPU machine's run is not its first: tasks built, the recipe's bfloat16
LoRA updates, before/after evaluation, paired intervals, result.json and the curves. Also the
pieces it relies on: the wall-clock budget, the paired bootstrap, the LoRA policy's export, and
the sandbox check that refuses to start rollouts whose commands could not run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.training.rl_toy import toy_recipe
from training.rl import train_rl
from training.rl.environments import HarnessEnv
from training.rl.measured_run import main, paired

ROOT = Path(__file__).parents[2]
RECIPE = ROOT / "training" / "recipes" / "rl_gpu.toml"
TINY = [  # the recipe shrunk to seconds; everything else (bfloat16, LoRA, budget) as on the GPU
    "eval_tasks=2",
    "eval_samples=2",
    "group_size=2",
    "tasks_per_step=2",
    "steps=2",
    "max_turns=1",
    "max_tokens=12",
    "workers=2",
    "micro_batch_rows=4",
    "curriculum_min_samples=0",
    "max_idle_groups=8",
]


@pytest.fixture(scope="module")
def real_code_set(tmp_path_factory) -> Path:
    """The real-code tasks of two standard-library functions, one per split."""
    from training.tasks.real import build, write_set

    rows, manifest = build(only=[("colorsys", "hls_to_rgb"), ("calendar", "leapdays")])
    assert {r["split"] for r in rows} == {"heldout", "train"}, manifest
    return write_set(tmp_path_factory.mktemp("real") / "set", rows, manifest)


def _rehearse(tmp_path: Path, model: Path, real: Path, device: str) -> dict:
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["--model", str(model), "--out", str(out), "--work", str(work), "--device", device]
    argv += ["--recipe", str(RECIPE), "--projects", "3", "--real", str(real)]
    for pair in TINY:
        argv += ["--set", pair]
    assert main(argv) == 0, (out / "log.txt").read_text()
    return json.loads((out / "result.json").read_text())


def test_the_gpu_recipe_runs_end_to_end_on_a_cpu(tmp_path, stopping_checkpoint, real_code_set):
    result = _rehearse(tmp_path, stopping_checkpoint, real_code_set, "cpu")
    out = tmp_path / "out"
    assert "CPU" in result["device"] and result["software"]["torch"] == torch.__version__
    assert result["recipe"]["dtype"] == "bfloat16" and result["recipe"]["lora_rank"] > 0
    assert result["updates"] >= 1  # the LoRA adapter trained, and its merged weights were pushed
    assert set(result["seconds"]) == {"tasks", "rl", "total"}
    held_out = result["held_out"]
    # the held-out tasks alternate between the sources: two tasks, one of each
    assert held_out["synthetic"]["pass@1"]["tasks"] == held_out["real-code"]["pass@1"]["tasks"] == 1
    for metric in ("pass@1", "pass@2"):
        scores = held_out["all"][metric]
        assert scores["tasks"] == 2 and scores["delta_lo"] <= scores["delta"] <= scores["delta_hi"]
        assert scores["delta"] == pytest.approx(scores["after"] - scores["before"], abs=1e-3)
    evals = result["eval"]
    assert evals["before_step"] == 0 and evals["after_step"] == result["updates"]
    assert sum(evals["outcomes_before"].values()) == 2 * 2  # every held-out sample's end
    # a handful of files come back; checkpoints and weights stay in the work folder
    assert {p.name for p in out.iterdir()} == {
        "result.json",
        "log.txt",
        "metrics.jsonl",
        "rewards.png",
        "lengths.png",
        "outcomes.png",
    }
    assert (tmp_path / "work" / "run" / "model" / "config.json").exists()
    meta = json.loads((tmp_path / "work" / "run" / "model" / "flywheel.json").read_text())
    assert meta["version"] == f"rl-gpu@rl{result['updates']}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gpu_recipe_runs_end_to_end_on_cuda(tmp_path, stopping_checkpoint, real_code_set):
    result = _rehearse(tmp_path, stopping_checkpoint, real_code_set, "cuda")
    assert result["device"] == torch.cuda.get_device_name() and result["updates"] >= 1


def test_a_missing_model_folder_is_one_clear_line(tmp_path, capsys):
    code = main(["--model", str(tmp_path / "nope"), "--out", str(tmp_path), "--device", "cpu"])
    assert code == 1
    assert capsys.readouterr().out.strip().splitlines() == [
        f"error: --model {tmp_path / 'nope'}: model folder {str(tmp_path / 'nope')!r} does not exist"
    ]


def test_a_missing_task_set_is_one_clear_line(tmp_path, tiny_checkpoint, capsys):
    argv = ["--model", str(tiny_checkpoint), "--out", str(tmp_path), "--device", "cpu"]
    assert main([*argv, "--tasks", str(tmp_path / "none")]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"error: no tasks at {str(tmp_path / 'none')!r}: make them with")
    assert main([*argv, "--projects", "0", "--real", str(tmp_path / "none")]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"error: no real tasks at {str(tmp_path / 'none')!r}")


def test_the_wall_clock_budget_stops_updates_and_the_final_evaluation_still_runs(
    tmp_path, tiny_checkpoint
):
    lines: list[str] = []
    recipe = toy_recipe(tmp_path / "run", tiny_checkpoint, mode="sync", budget_s=1e-9)
    train_rl(recipe, log=lines.append)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["eval"]  # the start's evaluation, then no update
    assert any("the wall-clock budget is spent: 0 of budget_s=0 s left" in x for x in lines), lines
    meta = json.loads((tmp_path / "run" / "model" / "flywheel.json").read_text())
    assert meta["step"] == 0 and meta["eval_after"]["step"] == 0


def test_paired_interval_cancels_what_tasks_share():
    """Tasks of very different difficulty, each 0.1 better after: the paired difference is
    exactly 0.1, while the two ends' own intervals are wide and overlap."""
    before = {f"t{i}": i / 10 for i in range(9)}
    after = {k: v + 0.1 for k, v in before.items()}
    s = paired(before, after)
    assert s["tasks"] == 9 and s["tasks_better"] == 9 and s["tasks_worse"] == 0
    assert s["delta"] == s["delta_lo"] == s["delta_hi"] == pytest.approx(0.1)
    assert s["before_hi"] > s["after_lo"]  # unpaired, the two ends' intervals overlap
    assert paired({"a": 1.0}, {"b": 1.0}) == {"tasks": 0}  # no task scored both times


def test_a_lora_policy_exports_the_weights_it_trains(tmp_path, tiny_checkpoint):
    from agent.model import load_checkpoint
    from training.rl.grpo import Row
    from training.rl.policy import Policy

    recipe = toy_recipe(tmp_path / "run", tiny_checkpoint, lora_rank=4, dtype="bfloat16", lr=0.05)
    policy = Policy.load(str(tiny_checkpoint), recipe)
    assert all(p.dtype == torch.float32 for p in policy.params)  # the adapter; its base is bf16
    row = Row([40, 41, 42], [41, 42, 7], [0.0, 1.0, 1.0], [0.0, -7.0, -7.0], 1.0, 0)
    ids = torch.tensor([[40, 41, 42]])
    with torch.no_grad():
        before = policy.trunk(ids).logits
    assert policy.update([row], 1)["skipped"] == 0.0
    with torch.no_grad():
        trained = policy.trunk(ids).logits.float()
    assert not torch.allclose(trained, before.float())
    exported = load_checkpoint(policy.export(tmp_path / "v1", {"version": "toy@rl1"}), "cpu")
    with torch.no_grad():
        merged = exported.trunk(ids).logits.float()
    assert torch.allclose(merged, trained, atol=0.05)  # merging rounds once, in bfloat16
    assert not any(n for n, _ in exported.trunk.named_parameters() if "lora" in n)
    # a resumable checkpoint keeps the adapter and its optimizer, not the frozen base
    state = policy.state_dict()
    assert state["model"] and all("lora" in n or "token" in n for n in state["model"])
    resumed = Policy.load(str(tiny_checkpoint), recipe)
    resumed.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(resumed.trunk(ids).logits.float(), trained)


def test_rollouts_refuse_to_start_when_commands_cannot_run_in_the_sandbox(monkeypatch):
    import agent.harness.sandbox as sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)  # no bubblewrap
    reason = HarnessEnv("unused").ready()
    assert reason.startswith("the agent's commands cannot run in the sandbox here")
    assert "apt-get install bubblewrap" in reason and "unconfined_commands = true" in reason
    assert "\n" not in reason
    assert HarnessEnv("unused", unconfined=True).ready() == ""  # the throwaway-machine fallback


def test_the_budget_keeps_what_the_first_evaluation_took_for_the_last():
    """budget_s covers the whole run: updates stop while the time left still holds a final
    evaluation as long as the first one."""
    import time
    from types import SimpleNamespace

    from training.rl.run import RLRun

    def stop(budget: float, spent: float, first_eval: float) -> str:
        run = SimpleNamespace(
            recipe=SimpleNamespace(budget_s=budget, max_idle_groups=8),
            started=time.monotonic() - spent,
            eval_s=first_eval,
            idle_groups=0,
            curriculum=SimpleNamespace(stop_reason=lambda: ""),
        )
        return RLRun._stop_reason(run)

    assert stop(budget=600, spent=300, first_eval=100) == ""  # 300 s left: room for updates
    assert stop(budget=600, spent=300, first_eval=400).startswith("the wall-clock budget is spent")
    assert stop(budget=0, spent=10**6, first_eval=100) == ""  # no budget

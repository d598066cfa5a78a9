"""Dr. GRPO on hand-computed cases: advantages, masks, truncated importance weights, the loss;
the reward spec and the RL recipe."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from training.rl.grpo import (
    collate,
    effective_sample_size,
    group_advantages,
    group_rows,
    pass_at_k,
    policy_loss,
    trajectory_rows,
    turn_row,
    zero_variance,
)
from training.rl.recipe import RecipeError, load_rl_recipe, rl_recipe_from_dict
from training.rl.reward import RewardSpec
from training.rl.trajectory import Trajectory, Turn

RL_TOML = Path(__file__).parents[2] / "training" / "recipes" / "rl.toml"


def test_advantage_is_reward_minus_group_mean_without_std():
    assert group_advantages([1, 0, 0, 1]) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([3.0, 1.0]) == [1.0, -1.0]  # not divided by the std (1.0 here too)
    assert group_advantages([0.9, 0.1, 0.2]) == pytest.approx([0.5, -0.3, -0.2])
    assert zero_variance([1, 1, 1]) and zero_variance([]) and not zero_variance([1, 0])


def test_turn_row_masks_the_prompt_and_keeps_the_sampled_ids():
    row = turn_row([5, 6, 7], [8, 9], [-0.1, -0.2], advantage=0.5, staleness=1)
    assert row.input_ids == [5, 6, 7, 8]
    assert row.targets == [6, 7, 8, 9]  # position j predicts token j + 1
    assert row.mask == [0.0, 0.0, 1.0, 1.0]  # loss on the output tokens only
    assert row.old_logprobs == [0.0, 0.0, -0.1, -0.2]
    batch = collate([row, turn_row([1, 2], [3], [-1.0], -0.5, 0)], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [1, 2, 0, 0]]
    assert batch.mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def _traj(reward: float, version: int, truncated: bool = False, turns: int = 1) -> Trajectory:
    turn = Turn([1, 2], [3, 4], [-0.5, -0.5], version)
    return Trajectory("t", 0, [turn] * turns, reward=reward, truncated=truncated)


def test_truncated_trajectories_stay_in_the_baseline_but_carry_no_loss():
    rows, counts = group_rows([_traj(1.0, 3), _traj(0.0, 3, truncated=True), _traj(0.0, 2)], 3)
    assert counts == {"trained": 2, "truncated": 1}
    assert [r.advantage for r in rows] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert [sum(r.mask) for r in rows] == [2, 0, 2]
    assert [r.staleness for r in rows] == [0, 0, 1]
    rows, _ = group_rows([_traj(1.0, 0, turns=2), _traj(0.0, 0)], 0)  # a row per model turn
    assert len(rows) == 3


def test_worked_example_from_the_docstring():
    """grpo.py's docstring: A = [+0.5, -0.5], mu = [0.1, 0.5], pi = [0.5, 0.25], is_cap 2."""
    logprobs = torch.tensor([math.log(0.5), math.log(0.25)], requires_grad=True)
    old = torch.tensor([math.log(0.1), math.log(0.5)])
    adv = torch.tensor([0.5, -0.5])
    mask = torch.ones(2)
    loss, stats = policy_loss(logprobs, old, adv, mask, norm=2.0, is_cap=2.0)
    assert loss.item() == pytest.approx(-0.375)
    loss.backward()
    assert logprobs.grad.tolist() == pytest.approx([-0.5, 0.125])
    assert stats["truncated"].item() == 1  # 5 was cut to 2
    assert stats["is_weight"].item() == pytest.approx(5.5)
    ess = effective_sample_size(stats["is_weight"].item(), stats["is_weight_sq"].item(), 2)
    assert ess == pytest.approx(0.599, abs=1e-3)
    # k3 estimate of KL(mu || pi): sum over tokens of (pi/mu - 1 - log(pi/mu))
    expected_kl = (5 - 1 - math.log(5)) + (0.5 - 1 - math.log(0.5))
    assert stats["kl"].item() == pytest.approx(expected_kl, rel=1e-5)


def test_masked_tokens_contribute_nothing():
    logprobs = torch.tensor([math.log(0.5), math.log(0.9)], requires_grad=True)
    old = torch.tensor([math.log(0.5), -50.0])  # a wild weight on a masked position
    loss, stats = policy_loss(
        logprobs, old, torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]), 1.0
    )
    assert loss.item() == pytest.approx(-1.0)
    assert stats["tokens"].item() == 1 and stats["truncated"].item() == 0


def test_clip_higher_is_asymmetric():
    prox = torch.log(torch.tensor([0.2, 0.2, 0.2]))
    # ratios pi/pi_prox: 1.5 (A > 0: clipped at 1 + 0.28), 1.1 (inside), 0.5 (A < 0: clipped at 0.8)
    logprobs = (prox + torch.log(torch.tensor([1.5, 1.1, 0.5]))).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, stats = policy_loss(
        logprobs,
        prox,
        adv,
        torch.ones(3),
        1.0,
        prox_logprobs=prox,
        clip_low=0.2,
        clip_high=0.28,
    )
    assert loss.item() == pytest.approx(-(1.28 + 1.1 - 0.8))
    assert stats["clipped"].item() == 2
    loss.backward()
    assert logprobs.grad.tolist() == pytest.approx([0.0, -1.1, 0.0])  # clipped tokens: no push


def test_pass_at_k():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2)


def test_reward_spec_worked_example_and_a_raising_component():
    spec = RewardSpec({"task_success@2": 1.0, "tool_errors@1": 0.2}, effort_penalty=0.1)
    traj = Trajectory("t", 0, [Turn([1], [2] * 1500, [-0.1] * 1500, 0)])
    traj.signals = {
        "tests_after_passed": 4,
        "tests_after_failed": 1,
        "tool_calls": 4,
        "tool_errors": 1,
    }
    spec.score(traj)
    assert traj.reward == pytest.approx(0.625)
    assert traj.components == pytest.approx(
        {"task_success@2": 0.8, "tool_errors@1": -0.125, "effort": -0.15}
    )
    bad = Trajectory(
        "t",
        1,
        [Turn([1], [2], [-0.1], 0)],
        signals={"tests_after_passed": "x", "tests_after_failed": 0},
    )
    spec.score(bad)
    assert bad.reward is None and "reward task_success@2 raised TypeError" in bad.error
    assert bad.check() == bad.error


def test_trajectory_check_catches_bad_logprobs():
    traj = Trajectory("t", 0, [Turn([1], [2, 3], [-0.1, float("nan")], 0)], reward=1.0)
    assert "not a finite log-probability" in traj.check()
    traj = Trajectory("t", 0, [Turn([1], [2, 3], [-0.1], 0)], reward=1.0)
    assert "1 logprobs for 2 tokens" in traj.check()


def test_rl_recipe_loads_and_says_how_to_launch():
    recipe = load_rl_recipe(RL_TOML)
    assert recipe.stage == "rl" and recipe.env == "harness" and recipe.runtime == "processes"
    assert "flywheel train rl --recipe training/recipes/rl.toml" in RL_TOML.read_text()
    assert recipe.rewards["task_success@3"] == 1.0
    assert recipe.reward_version.startswith("rv-")


def test_the_gpu_recipe_trains_a_bfloat16_adapter_within_a_budget_and_says_how_to_launch():
    path = RL_TOML.with_name("rl_gpu.toml")
    recipe = load_rl_recipe(path)
    assert (recipe.device, recipe.dtype, recipe.runtime) == ("cuda", "bfloat16", "inline")
    assert recipe.lora_rank > 0 and recipe.budget_s > 0 and recipe.eval_samples == 8
    header = path.read_text().split("\nname")[0]
    assert "make rl-gpu MODEL=" in header and "python -m training.rl.measured_run" in header


def test_recipe_errors_and_reward_versions():
    base = dict(name="x", out="o", init="i", env="magic")
    with pytest.raises(RecipeError, match="unknown key"):
        rl_recipe_from_dict({**base, "stpes": 3})
    with pytest.raises(RecipeError, match="no reward function"):
        rl_recipe_from_dict({**base, "rewards": {"nope@1": 1.0}})
    with pytest.raises(RecipeError, match="pin a version"):
        rl_recipe_from_dict({**base, "rewards": {"task_success": 1.0}})
    with pytest.raises(RecipeError, match="needs `tasks`"):
        rl_recipe_from_dict({**base, "env": "harness"})
    with pytest.raises(RecipeError, match="temperature must be > 0"):
        rl_recipe_from_dict({**base, "temperature": 0})
    with pytest.raises(RecipeError, match="must be int"):
        rl_recipe_from_dict({**base, "steps": "many"})
    with pytest.raises(RecipeError, match="dtype bfloat16 trains a LoRA adapter only"):
        rl_recipe_from_dict({**base, "dtype": "bfloat16"})
    with pytest.raises(RecipeError, match="dtype 'float16' is unknown"):
        rl_recipe_from_dict({**base, "dtype": "float16"})
    with pytest.raises(RecipeError, match="must be bool"):
        rl_recipe_from_dict({**base, "unconfined_commands": 1})
    with pytest.raises(RecipeError, match="must be int"):
        rl_recipe_from_dict({**base, "steps": True})
    assert rl_recipe_from_dict({**base, "unconfined_commands": True}).unconfined_commands
    sync = rl_recipe_from_dict({**base, "mode": "sync", "max_staleness": 5, "push_every": 1})
    assert sync.max_staleness == 0 and sync.push_every == 1
    a = rl_recipe_from_dict(base)
    b = rl_recipe_from_dict({**base, "rewards": {"task_success@2": 1.0, "style@1": 0.1}})
    c = rl_recipe_from_dict({**base, "lr": 1e-3})
    assert a.reward_version != b.reward_version  # a new component is a new reward version
    assert a.reward_version == c.reward_version  # optimiser settings are not


def test_turns_that_continue_the_conversation_share_one_row():
    first = Turn([1, 2], [3, 4], [-0.1, -0.2], version=2)
    second = Turn([1, 2, 3, 4, 9, 9], [5], [-0.3], version=3)  # + a tool result, then the answer
    other = Turn([1, 2, 7], [8], [-0.4], version=3)  # re-rendered differently: a row of its own
    traj = Trajectory("t", 0, [first, second, other], reward=1.0)
    rows = trajectory_rows(traj, advantage=0.5, version=3, trainable=True)
    assert len(rows) == 2
    row = rows[0]
    assert row.input_ids == [1, 2, 3, 4, 9, 9] and row.targets == [2, 3, 4, 9, 9, 5]
    assert row.mask == [0, 1, 1, 0, 0, 1]  # both turns' outputs, not the tool result
    assert row.old_logprobs == [0, -0.1, -0.2, 0, 0, -0.3]
    assert row.staleness == 1  # its oldest turn's
    assert rows[1] == turn_row([1, 2, 7], [8], [-0.4], 0.5, 0)

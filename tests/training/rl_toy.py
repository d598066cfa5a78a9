"""The toy RL recipe and fault-injecting environments for tests/training/test_rl_*.py.

Module-level classes, so spawned rollout processes can unpickle them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from training.rl.environments import MagicTokenEnv
from training.rl.recipe import RLRecipe, rl_recipe_from_dict


def toy_values(out: Path, init: Path, **overrides) -> dict:
    """Say the magic token: 4 prompts, 1 token in 8 pays (chance 12.5%)."""
    values = dict(
        name="toy",
        out=str(out),
        init=str(init),
        env="magic",
        max_tokens=1,
        magic_tasks=4,
        magic_every=8,
        group_size=8,
        tasks_per_step=4,
        lr=1e-2,
        loss_tokens=1,
        steps=60,
        rewards={"task_success@1": 1.0},
        eval_samples=16,
        save_every=100,
        # a task the others starve (their magic tokens crowd it out) needs groups to find a
        # success again: at 32 an async run stopped once at 0.75 with one task unsolved
        max_idle_groups=96,
    )
    values.update(overrides)
    return values


def toy_recipe(out: Path, init: Path, **overrides) -> RLRecipe:
    return rl_recipe_from_dict(toy_values(out, init, **overrides))


@dataclass
class FaultyEnv(MagicTokenEnv):
    """The toy, with faults on chosen rollout calls (counted per worker)."""

    crash_on: tuple[int, ...] = ()  # these calls raise (a crashed rollout)
    bad_reward_on: tuple[int, ...] = ()  # these calls return signals a reward function chokes on
    die_marker: str = ""  # the first call in any worker exits the process, once (marker file)
    calls: int = 0

    def rollout(self, engine, tokenizer, task, group_size, seed):
        self.calls += 1
        if self.die_marker and not Path(self.die_marker).exists():
            Path(self.die_marker).write_text("died")
            os._exit(3)
        if self.calls in self.crash_on:
            raise RuntimeError("the sandbox fell over")
        out = super().rollout(engine, tokenizer, task, group_size, seed)
        if self.calls in self.bad_reward_on:
            out[0].signals = {"tests_after_passed": "many", "tests_after_failed": 0}
        return out

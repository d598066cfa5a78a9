"""A trajectory's reward: a weighted sum of telemetry's versioned reward functions.

The functions are telemetry/rewards.py's own (`compute_reward("task_success@2", signals)`): the
rollout environment collects the same signals the harness records for real sessions, so a
rollout and a logged session are judged by the same rules. The recipe's `[rewards]` table names
the components and weights; a component that has no signal to judge by (returns None) adds 0.
`effort_penalty` (per 1,000 output tokens) is the one term that is not a telemetry function: it
needs the token count, which only a rollout knows.

A component that raises (malformed signals, a bug) does not stop the run: the trajectory gets
`error = "reward task_success@2 raised ..."` and is left out of training (it still counts in the
run's error tally and log).

Worked example: rewards {"task_success@2": 1.0, "tool_errors@1": 0.2}, effort_penalty 0.1;
signals: tests 4 passed / 1 failed, 1 tool error in 4 calls, 1,500 output tokens:
0.8 * 1.0 + (-0.125) * 0.2 - 0.1 * 1.5 = 0.625.
"""

from __future__ import annotations

from dataclasses import dataclass

from telemetry.rewards import compute_reward
from training.rl.trajectory import Trajectory


@dataclass
class RewardSpec:
    weights: dict[str, float]  # "name@version" -> weight
    effort_penalty: float = 0.0  # per 1,000 output tokens
    version: str = ""  # the recipe's reward version

    def score(self, trajectory: Trajectory) -> Trajectory:
        """Fill `reward` and `components` in place (or `error`); returns the trajectory."""
        total = 0.0
        components: dict[str, float | None] = {}
        for key, weight in self.weights.items():
            try:
                value = compute_reward(key, trajectory.signals)
                if value is not None:
                    value = float(value)
            except Exception as exc:  # a raising reward function must not stop the run
                trajectory.error = trajectory.error or (
                    f"reward {key} raised {type(exc).__name__}: {exc}"
                )
                trajectory.reward = None
                return trajectory
            components[key] = value
            if value is not None:
                total += weight * value
        effort = self.effort_penalty * trajectory.output_tokens / 1000.0
        if self.effort_penalty:
            components["effort"] = -effort
        trajectory.components = components
        trajectory.reward = total - effort
        return trajectory

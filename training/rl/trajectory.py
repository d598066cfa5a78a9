"""What a rollout produces and what travels between rollout workers and the trainer.

Vocabulary (used throughout training/rl):
- *turn*: one model call: the prompt token ids the engine saw, the output token ids it sampled
  (`Completion.token_ids`, never re-tokenized), the sampling log-probability of each output
  token, and the *policy version* of the weights that sampled it.
- *trajectory*: one attempt at a task: its turns, the signals the environment collected (tests,
  tool calls, answer), the reward and its components, the stop reason, and two flags: `passed`
  (the verifier accepted it) and `truncated` (a limit cut it off, so its outcome says little:
  it is masked out of the loss but counts in pass rates).
- *group*: the G trajectories of one task sampled by one job; the group mean is the baseline.
- *job*: a request to a rollout worker: sample a group for a task with a seed.
- *staleness* of a trajectory: trainer version minus the oldest version among its turns.

Everything here is plain data (picklable), so the same objects cross threads, processes and Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    prompt_ids: list[int]  # [prompt] what the engine conditioned on
    output_ids: list[int]  # [output] what it sampled (Completion.token_ids)
    logprobs: list[float]  # [output] log p_sampling(token)
    version: int  # policy version of the weights that sampled it
    finish_reason: str = "stop"


@dataclass
class Trajectory:
    task_id: str
    sample: int  # index within its group
    turns: list[Turn]
    signals: dict[str, Any] = field(default_factory=dict)  # telemetry/rewards.py vocabulary
    stop_reason: str = ""
    passed: bool = False
    truncated: bool = False
    reward: float | None = None  # set by RewardSpec.score
    components: dict[str, float | None] = field(default_factory=dict)
    error: str = ""  # why it cannot be trained on ("" when it can)
    seconds: float = 0.0

    @property
    def version(self) -> int:
        """The oldest policy version that produced any of its tokens."""
        return min((t.version for t in self.turns), default=0)

    @property
    def output_tokens(self) -> int:
        return sum(len(t.output_ids) for t in self.turns)

    def check(self) -> str:
        """Why this trajectory is unusable for training, or ""."""
        if self.error:
            return self.error
        if not self.turns:
            return "no model turns were recorded"
        for i, turn in enumerate(self.turns):
            if len(turn.logprobs) != len(turn.output_ids):
                return f"turn {i}: {len(turn.logprobs)} logprobs for {len(turn.output_ids)} tokens"
            if not all(math.isfinite(x) and x <= 1e-6 for x in turn.logprobs):
                return f"turn {i}: a sampling logprob is not a finite log-probability"
            if not turn.prompt_ids:
                return f"turn {i}: empty prompt"
        if self.reward is None or not math.isfinite(self.reward):
            return f"reward is {self.reward!r}"
        return ""


@dataclass
class Job:
    id: int
    task: Any  # the environment's task object (picklable)
    group_size: int
    seed: int
    purpose: str = "train"  # train | eval


@dataclass
class GroupResult:
    job: Job
    trajectories: list[Trajectory]
    error: str = ""  # the rollout itself failed (the worker caught it)
    worker: int = 0

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories if t.reward is not None]

"""An RL run's settings: one dataclass, loaded from a recipe file (TOML) plus `--set` overrides.

The file is flat TOML whose keys are `RLRecipe`'s fields, plus one table, `[rewards]`, mapping
telemetry reward functions (`name@version`, telemetry/rewards.py) to weights. Unknown keys are an
error. The reward components, their weights, `effort_penalty` and the environment together make
the *reward version* (`RLRecipe.reward_version`, a short hash): changing any of them is a new
reward version, and a run refuses to resume a checkpoint trained under another one.

    flywheel train rl --recipe training/recipes/rl.toml --set steps=5
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from training.recipe import RecipeError, at_least_one, parse_overrides, read_toml

ENVS = ("harness", "magic", "tab")  # tab: inline completions (training/tab_rl.py)
RUNTIMES = ("inline", "processes", "ray")
MODES = ("sync", "async")
DTYPES = ("float32", "bfloat16")
_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}

__all__ = ["RLRecipe", "RecipeError", "load_rl_recipe", "parse_overrides"]


@dataclass
class RLRecipe:
    name: str  # identifies the run; a checkpoint resumes only under the same name
    out: str  # run folder: checkpoints/, weights/, metrics.jsonl, rewards.png, model/
    init: str  # checkpoint folder to start from ("default": the built-in starter model)
    stage: str = "rl"  # fixed; names the stage in telemetry and in the model's flywheel.json
    # --- the environment ---
    env: str = "harness"  # harness: tasks through the agent harness | magic: the toy bandit
    tasks: str = (
        ""  # harness: `flywheel train tasks` folder/tasks.jsonl, or telemetry rl_tasks.jsonl
    )
    task_limit: int = 0  # harness: at most this many training tasks; 0 = all
    max_turns: int = 8  # harness: model turns per rollout
    rollout_wall_s: float = 120.0  # harness: running time per rollout (the harness's own limit)
    test_workers: int = 0  # harness: verifier runs at once across all rollouts; 0 = CPU cores
    unconfined_commands: bool = False  # harness, without a working bubblewrap: run the agent's
    # commands unconfined instead of refusing to start (a throwaway machine only)
    magic_tasks: int = 4  # magic: number of prompts (tasks)
    magic_every: int = 8  # magic: token t pays on task i when t % magic_every == i % magic_every
    # --- sampling ---
    group_size: int = 8  # G: samples per task; the group's mean reward is the baseline
    tasks_per_step: int = 4  # groups per update
    show_fit: int = 0  # tab: train-file requests the trained model answers greedily to fit the
    # confidence below which its suggestions are not shown (agent/confidence.py); 0 = none
    max_tokens: int = 512  # output tokens per model turn
    temperature: float = 1.0  # sampling temperature (> 0); the trainer scores with the same one
    # --- which tasks (curriculum.py) ---
    curriculum_min_samples: int = 16  # a task whose last N samples all passed, or that failed
    # N or more samples and never passed, is settled: only retried to explore; 0 = off (every
    # task in turn, shuffled); the run stops when every task is settled
    curriculum_explore: float = 0.1  # share of jobs that retry a settled task
    curriculum_seed: str = ""  # eval JSON (`flywheel train eval --json`) to start the counts from
    # --- rewards ---
    rewards: dict[str, float] = field(default_factory=lambda: {"task_success@2": 1.0})
    effort_penalty: float = 0.0  # subtracted per 1,000 output tokens of a trajectory
    # --- the update ---
    steps: int = 50  # updates in all (a resumed run continues up to this)
    lr: float = 1e-5  # AdamW, constant
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    micro_batch_rows: int = 8  # sequences per forward pass (gradients accumulate)
    updates_per_batch: int = 1  # optimizer steps per batch (mini-batches); >1 makes clipping bite
    clip_low: float = 0.0  # PPO ratio clip below 1 - clip_low; 0 = no clipping
    clip_high: float = 0.0  # clip-higher: ratio clipped above 1 + clip_high (DAPO uses 0.28)
    is_cap: float = 2.0  # truncated importance weight: min(pi_trained / pi_sampling, is_cap)
    loss_tokens: int = 0  # Dr. GRPO's constant normaliser per trajectory; 0 = max_tokens
    lora_rank: int = 0  # 0: every weight trains; N: a LoRA adapter of rank N (training/adapters.py)
    lora_alpha: float = 0.0  # LoRA scale numerator; 0 = 2 * lora_rank
    dtype: str = "float32"  # weights of the trainer and the rollout engines: float32 | bfloat16
    # (bfloat16 needs lora_rank: AdamW steps on bfloat16 weights round small updates away)
    budget_s: float = 0.0  # wall-clock seconds for the whole run, evaluations included: no
    # update begins once what is left is no more than the first evaluation took, and the final
    # evaluation still runs (0 = no budget: `steps` alone ends the run)
    max_bad_steps: int = 3  # consecutive non-finite losses before the run stops
    max_idle_groups: int = 64  # consecutive groups without signal (equal rewards) before the
    # run ends early: every task is always solved (or never): nothing left to learn from
    # --- asynchrony ---
    mode: str = "async"  # async: rollouts run while the trainer trains | sync: staleness 0
    max_staleness: int = 2  # samples more than this many policy versions old are refused
    push_every: int = 1  # new weights go to the rollout engines every N updates (sync: 1)
    runtime: str = "inline"  # inline: threads, one engine in this process | processes | ray
    workers: int = 1  # rollout workers (threads, processes or Ray actors)
    worker_threads: int = 1  # torch threads per rollout process / actor
    in_flight: int = 0  # async: groups being generated at once; 0 = 2 * tasks_per_step
    rollout_timeout_s: float = 600.0  # processes/ray: a group running longer restarts its worker
    max_worker_restarts: int = 3  # restarts of dead or stuck workers before the run stops
    # --- bookkeeping ---
    eval_every: int = 0  # pass@1 / pass@k on held-out tasks every N updates; 0 = start and end
    eval_tasks: int = 8  # held-out tasks per evaluation (magic: its prompts)
    eval_samples: int = 8  # k for pass@k (samples per held-out task)
    log_every: int = 1  # progress line every N updates
    save_every: int = 10  # resumable checkpoint every N updates (and at the end)
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "cpu"  # trainer and rollout engines
    telemetry_db: str = ""  # record the run and its metrics in this telemetry database

    def __post_init__(self) -> None:
        if not self.name or not self.out:
            raise RecipeError("an RL recipe needs `name` and `out`")
        if not self.init:
            raise RecipeError("an RL recipe starts from a checkpoint: set `init` (or 'default')")
        if self.stage != "rl":
            raise RecipeError(f"an RL recipe's stage is 'rl', not {self.stage!r}")
        for key, allowed in (("env", ENVS), ("runtime", RUNTIMES), ("mode", MODES)):
            if getattr(self, key) not in allowed:
                raise RecipeError(
                    f"{key} {getattr(self, key)!r} is unknown; use one of {', '.join(allowed)}"
                )
        if self.env == "harness" and not self.tasks:
            raise RecipeError("env 'harness' needs `tasks` (flywheel train tasks --out DIR)")
        at_least_one(
            self,
            "group_size tasks_per_step max_tokens steps micro_batch_rows updates_per_batch "
            "push_every workers worker_threads max_turns magic_tasks magic_every eval_tasks "
            "eval_samples log_every save_every keep_checkpoints max_bad_steps max_idle_groups",
        )
        if self.group_size < 2:
            raise RecipeError("group_size must be >= 2: the baseline is the group's mean")
        if not self.temperature > 0:
            raise RecipeError("temperature must be > 0: RL needs sampled outputs")
        if self.lr <= 0 or self.is_cap <= 0:
            raise RecipeError("lr and is_cap must be > 0")
        if self.clip_low < 0 or self.clip_high < 0 or self.clip_low >= 1:
            raise RecipeError("clip_low must be in [0, 1) and clip_high >= 0")
        if min(self.max_staleness, self.in_flight, self.task_limit, self.show_fit) < 0:
            raise RecipeError("max_staleness, in_flight, task_limit and show_fit must be >= 0")
        if self.test_workers < 0 or self.lora_rank < 0 or self.lora_alpha < 0:
            raise RecipeError("test_workers, lora_rank and lora_alpha must be >= 0")
        if self.budget_s < 0:
            raise RecipeError("budget_s must be >= 0 (0 = no wall-clock budget)")
        if self.dtype not in DTYPES:
            raise RecipeError(f"dtype {self.dtype!r} is unknown; use one of {', '.join(DTYPES)}")
        if self.dtype == "bfloat16" and not self.lora_rank:
            raise RecipeError(
                "dtype bfloat16 trains a LoRA adapter only (AdamW steps on bfloat16 weights round "
                "small updates away): set lora_rank, or use dtype float32"
            )
        if self.curriculum_min_samples < 0 or not 0 <= self.curriculum_explore <= 1:
            raise RecipeError(
                "curriculum_min_samples must be >= 0 and curriculum_explore in [0, 1]"
            )
        if self.mode == "sync":
            self.max_staleness, self.push_every = 0, 1  # the definition of synchronous
        if self.push_every > self.max_staleness + 1:
            raise RecipeError(
                f"push_every={self.push_every} with max_staleness={self.max_staleness} would "
                "refuse most samples: use push_every <= max_staleness + 1"
            )
        if not self.rewards:
            raise RecipeError("[rewards] is empty: name at least one reward function")
        from telemetry.rewards import get

        for key, weight in self.rewards.items():
            try:
                get(key)
            except (KeyError, ValueError) as exc:
                raise RecipeError(f"[rewards] {key!r}: {exc}") from None
            if "@" not in key:
                raise RecipeError(f"[rewards] {key!r}: pin a version, e.g. {key}@1")
            if not isinstance(weight, int | float):
                raise RecipeError(f"[rewards] {key} weight must be a number, not {weight!r}")

    @property
    def in_flight_groups(self) -> int:
        if self.mode == "sync":
            return self.tasks_per_step
        return self.in_flight or 2 * self.tasks_per_step

    @property
    def reward_version(self) -> str:
        """A short hash of everything that defines the reward."""
        spec = {"env": self.env, "rewards": self.rewards, "effort_penalty": self.effort_penalty}
        blob = json.dumps(spec, sort_keys=True).encode()
        return "rv-" + hashlib.sha256(blob).hexdigest()[:8]

    def to_dict(self) -> dict:
        return {**asdict(self), "reward_version": self.reward_version}


def load_rl_recipe(path: str | Path, overrides: dict | None = None) -> RLRecipe:
    path = Path(path)
    return rl_recipe_from_dict(read_toml(path), overrides, where=str(path))


def rl_recipe_from_dict(values: dict, overrides: dict | None = None, where: str = "") -> RLRecipe:
    values = {**values, **(overrides or {})}
    known = {f.name: f for f in fields(RLRecipe)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise RecipeError(
            f"recipe {where!r}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    for key, value in values.items():
        kind = known[key].type
        if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            values[key] = float(value)
        elif kind in _SCALARS and (
            not isinstance(value, _SCALARS[kind]) or (isinstance(value, bool) != (kind == "bool"))
        ):
            raise RecipeError(f"recipe key {key} must be {kind}, not {value!r}")
        elif key == "rewards" and not isinstance(value, dict):
            raise RecipeError("`rewards` must be a table: [rewards] name@version = weight")
    try:
        return RLRecipe(**values)
    except TypeError as exc:
        raise RecipeError(f"recipe {where!r}: {exc}") from exc

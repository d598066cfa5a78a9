"""Asynchronous RL in the agent's own harness: Dr. GRPO, staleness-bounded, on one machine or Ray.

Files, one role each (read them in this order):

- `recipe.py`        RLRecipe: every setting, loaded from training/recipes/rl.toml; reward version
- `trajectory.py`    the vocabulary: turn, trajectory, group, job, staleness
- `environments.py`  where rollouts happen: HarnessEnv (the real harness on task workspaces,
                     RecordingEngine keeps the exact sampled token ids) and MagicTokenEnv (the toy)
- `reward.py`        RewardSpec: weighted telemetry reward functions (+ effort penalty)
- `curriculum.py`    which task each job samples: tasks always or never solved are skipped
- `grpo.py`          advantages, token masks, truncated importance weights, the loss (pure)
- `policy.py`        Policy: forward over prompt + output, the update step, weight export
- `runtimes.py`      rollout workers as threads (one in-process engine), processes, or Ray actors
- `run.py`           the run: admission with the staleness bound, updates, weight pushes,
                     evaluation, checkpoints, metrics, the wall-clock budget
- `curves.py`        the run's PNGs: rewards, lengths and diversity, held-out failure modes
- `measured_run.py`  one measured run (recipes/rl_gpu.toml): held-out tasks, before/after
                     pass@1 and pass@k with paired intervals, result.json; `gpu_run.sh` runs it
                     on a lent GPU machine

    flywheel train rl --recipe training/recipes/rl.toml [--set steps=10] [--no-resume]

What it does not do: multi-node weight broadcast other than through a shared filesystem (the
weights travel as checkpoint folders), vLLM rollout engines (their reload path is the engine's
`swap`, not wired here), or a KL penalty towards a reference model (Dr. GRPO drops it).
"""

from training.rl.recipe import RLRecipe, load_rl_recipe
from training.rl.run import train_rl

__all__ = ["RLRecipe", "load_rl_recipe", "train_rl"]

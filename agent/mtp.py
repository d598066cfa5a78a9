"""Multi-token-prediction (MTP) heads: the drafter the engine runs beside the trunk.

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
They are saved in a checkpoint's mtp/ folder (config.json, model.safetensors, optionally
draft_vocab.json); `pack_int4` stores their matrices in 4 bits where a package's size budget
needs it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from agent.engine.request import EngineError


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

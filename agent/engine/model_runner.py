"""A loaded checkpoint and its forward pass with a KV cache: what the local engine calls the model.

`LoadedModel.forward` runs the trunk over new tokens with a `transformers` `DynamicCache` and
returns logits and the trunk's final normed hidden states (h_0, what the MTP heads read). The
cache is rolled back with `DynamicCache.crop(-n)` after rejected draft tokens.

On the CPU, every `nn.Linear` of the trunk and heads becomes a `FewRowsLinear`: the same
weights, with a product for 2..16 rows (a verify step, an MTP head over a few new positions)
that runs faster on torch's CPU BLAS (see its docstring). One row (plain decoding) and long
inputs (prefill) run exactly as before.

Not thread-safe by itself: the engine holds its lock around every call.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from agent.engine.prefix_cache import PrefixCache
from agent.model import Checkpoint, load_checkpoint
from agent.tokenizer import CHAR_TO_BYTE


@dataclass
class LoadedModel:
    checkpoint: Checkpoint
    token_bytes: list[bytes]  # [vocab] the exact bytes each token id stands for
    cache_kw: str  # the trunk's name for the cache argument ("cache" or "past_key_values")
    prefix_cache: PrefixCache | None = None  # prompt prefixes computed on these weights
    grammars: dict[str, Any] = field(default_factory=dict)  # tool set -> ToolGrammar (or None)

    @property
    def trunk(self):
        return self.checkpoint.trunk

    @property
    def tokenizer(self):
        return self.checkpoint.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.trunk.config.vocab_size

    @property
    def context_length(self) -> int:
        return int(self.trunk.config.max_position_embeddings)

    @property
    def device(self) -> torch.device:
        return self.trunk.device

    @classmethod
    def load(cls, model: str, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
        """Load a checkpoint folder ("default" is the built-in starter model)."""
        return cls.wrap(load_checkpoint(model, device=device, dtype=dtype))

    @classmethod
    def wrap(cls, checkpoint: Checkpoint) -> LoadedModel:
        """Wrap models already in memory; on the CPU their `nn.Linear`s become `FewRowsLinear`
        in place (same weights and numerics for one row)."""
        tokenizer = checkpoint.tokenizer
        vocab = checkpoint.trunk.config.vocab_size
        known = decode_table(tokenizer)
        token_bytes = known[:vocab] + [b""] * max(0, vocab - len(known))
        if checkpoint.trunk.device.type == "cpu":
            use_few_rows_linear(checkpoint.trunk)
            if checkpoint.heads is not None:
                use_few_rows_linear(checkpoint.heads)
        params = inspect.signature(type(checkpoint.trunk.model).forward).parameters
        cache_kw = "cache" if "cache" in params else "past_key_values"
        return cls(checkpoint, token_bytes, cache_kw)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.trunk.config)

    def forward(
        self, input_ids: torch.Tensor, cache, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the trunk over new tokens, appending them to `cache`.

        input_ids: [rows, m] tokens after those already in `cache`
        returns (logits [rows, m or 1, vocab], hidden [rows, m, hidden]); with last_only the
        logits are computed for the last position only (prefill).
        """
        out = self.trunk.model(input_ids=input_ids, use_cache=True, **{self.cache_kw: cache})
        hidden = out.last_hidden_state  # [rows, m, hidden] h_0, normed
        logits = self.trunk.lm_head(hidden[:, -1:] if last_only else hidden)
        return logits, hidden


class FewRowsLinear(nn.Linear):
    """`nn.Linear` computing y = (W · xᵀ)ᵀ when x has 2..MAX_ROWS rows (CPU inference).

    Why: torch's CPU BLAS (MKL) runs x · Wᵀ for a handful of rows far below its one-row speed;
    the same product with W as the left operand does not, which keeps a verify step over a few
    drafts close to the cost of one decode step (`flywheel bench engine` measures it). Same
    weights and state dict, and still differentiable; one row and long inputs go through
    `nn.functional.linear` unchanged.
    """

    MAX_ROWS = 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not 1 < rows <= self.MAX_ROWS:
            return nn.functional.linear(x, self.weight, self.bias)
        y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).T).T.contiguous()  # [rows, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def use_few_rows_linear(module: nn.Module) -> None:
    """Turn every plain `nn.Linear` inside `module` into a `FewRowsLinear`, in place."""
    for child in module.modules():
        if type(child) is nn.Linear:
            child.__class__ = FewRowsLinear


def decode_table(tokenizer) -> list[bytes]:
    """The bytes of every token id the tokenizer knows (special tokens as their text)."""
    special = set(tokenizer.all_special_tokens)
    table = []
    for token in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))):
        if token is None:
            table.append(b"")
        elif token in special:
            table.append(token.encode())
        else:
            table.append(bytes(CHAR_TO_BYTE.get(c, 0x3F) for c in token))
    return table

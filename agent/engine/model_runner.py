"""A loaded checkpoint and its forward pass with a KV cache: what the local engine calls the model.

`LoadedModel.forward` runs the trunk over new tokens with a `transformers` `DynamicCache` and
returns logits and the trunk's final normed hidden states (h_0, what the MTP heads read). The
cache is rolled back with `DynamicCache.crop(-n)` after rejected draft tokens.

Not thread-safe by itself: the engine holds its lock around every call.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from agent.model import Checkpoint, load_checkpoint
from agent.tokenizer import CHAR_TO_BYTE


@dataclass
class LoadedModel:
    checkpoint: Checkpoint
    token_bytes: list[bytes]  # [vocab] the exact bytes each token id stands for
    cache_kw: str  # the trunk's name for the cache argument ("cache" or "past_key_values")

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
        tokenizer = checkpoint.tokenizer
        vocab = checkpoint.trunk.config.vocab_size
        known = decode_table(tokenizer)
        token_bytes = known[:vocab] + [b""] * max(0, vocab - len(known))
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

"""A loaded checkpoint and its forward pass with a KV cache: what the local engine calls the model.

`LoadedModel.forward` runs the trunk over new tokens with a `transformers` `DynamicCache` and
returns logits and the trunk's final normed hidden states (h_0, what the MTP heads read);
`forward_parts` does it for several requests, each on its own cache, in one pass (batched.py).
The cache (kv_cache.py, or `DynamicCache` for trunks batched.py does not run) is rolled back
with `crop(-n)` after rejected draft tokens.

On the CPU, every `nn.Linear` of the trunk and heads becomes a `FewRowsLinear` (few_rows.py):
the same weights, with a product for a few rows (a decode or verify step, an MTP head over a
few new positions) that runs faster on torch's CPU BLAS. Long inputs (prefill) run exactly as
before. With dtype "int8" or "int4" they become lowbit.py's `Int8Linear` or `Int4Linear`
instead (its docstring has a table of the precisions): decode-sized inputs use a low-bit copy of
the weights (lossy); prefill keeps float32, or runs on a bfloat16 copy where the CPU multiplies
bfloat16 fast. Loaded `exact` (`EngineConfig.exact`), every row takes the low-bit product,
prefill too, so a position's keys and values are the same bits however a prefill chunk, a decode
or a verify step computed them: a prefix-cache hit then decodes what a cold prefill would.

Not thread-safe by itself: the engine holds its lock around every call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from agent.confidence import threshold
from agent.engine.config import LOWBIT_DTYPES
from agent.engine.local.batched import Part, forward_parts, rows_alone, supports_ragged
from agent.engine.local.few_rows import use_few_rows_linear
from agent.engine.local.kv_cache import KVCache
from agent.engine.local.lowbit import unavailable as lowbit_unavailable
from agent.engine.local.lowbit import use_lowbit_linear
from agent.engine.local.prefix_cache import PrefixCache
from agent.model import Checkpoint, load_apply_checkpoint, load_checkpoint
from agent.tokenizer import CHAR_TO_BYTE

log = logging.getLogger("flywheel.engine")


@dataclass
class LoadedModel:
    checkpoint: Checkpoint
    token_bytes: list[bytes]  # [vocab] the exact bytes each token id stands for
    cache_kw: str  # the trunk's name for the cache argument ("cache" or "past_key_values")
    ragged: bool = False  # batched.py runs its forward passes (one or several requests)
    prefix_cache: PrefixCache | None = None  # prompt prefixes computed on these weights
    grammars: dict[str, Any] = field(default_factory=dict)  # tool set -> ToolGrammar (or None)
    lowbit: str | None = None  # "int8"/"int4": decode-sized products in low bits (lowbit.py)
    exact: bool = False  # low-bit products for every row, prefill too
    _apply: list = field(default_factory=list, repr=False)  # [fast-apply model] once loaded
    _apply_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

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

    @functools.cached_property
    def show_min_confidence(self) -> float | None:
        """The threshold in the checkpoint folder's flywheel.json (agent/confidence.py)."""
        return threshold(self.checkpoint.path)

    @property
    def device(self) -> torch.device:
        return self.trunk.device

    @classmethod
    def load(
        cls, model: str, device: str = "cpu", dtype: str = "float32", exact: bool = False
    ) -> LoadedModel:
        """Load a checkpoint folder ("default" is the built-in starter model); dtype "int8" or
        "int4" loads float32 and adds low-bit weights for decoding (lowbit.py), for every row
        with `exact`."""
        bits = dtype if dtype in LOWBIT_DTYPES else None
        checkpoint = load_checkpoint(model, device=device, dtype="float32" if bits else dtype)
        return cls.wrap(checkpoint, lowbit=bits, exact=exact)

    @classmethod
    def wrap(
        cls, checkpoint: Checkpoint, lowbit: str | None = None, exact: bool = False
    ) -> LoadedModel:
        """Wrap models already in memory; on the CPU their `nn.Linear`s become `FewRowsLinear`
        in place (same weights and numerics for one row), or with `lowbit` ("int8", "int4")
        lowbit.py's layers (taking every row with `exact`)."""
        tokenizer = checkpoint.tokenizer
        vocab = checkpoint.trunk.config.vocab_size
        known = decode_table(tokenizer)
        token_bytes = known[:vocab] + [b""] * max(0, vocab - len(known))
        why_not = f"{lowbit} weights are for the CPU" if lowbit else None
        if checkpoint.trunk.device.type == "cpu":
            heads = [checkpoint.heads] if checkpoint.heads is not None else []
            modules = [checkpoint.trunk, *heads]
            for module in modules:
                use_few_rows_linear(module)
            why_not = lowbit_unavailable(lowbit) if lowbit else None
            if why_not:
                log.error("dtype %s: %s; running float32 instead", lowbit, why_not)
            elif lowbit:
                for module in modules:
                    use_lowbit_linear(module, lowbit, vocab_size=vocab, every_row=exact)
        params = inspect.signature(type(checkpoint.trunk.model).forward).parameters
        cache_kw = "cache" if "cache" in params else "past_key_values"
        ragged = supports_ragged(checkpoint.trunk)
        lowbit = None if why_not else lowbit
        return cls(checkpoint, token_bytes, cache_kw, ragged=ragged, lowbit=lowbit, exact=exact)

    def for_apply(self) -> LoadedModel:
        """The model that decodes fast-apply requests (agent.model.load_apply_checkpoint): the
        checkpoint's apply/ adapter, else an adapter's base, loaded on first use with the same
        precision; this model itself when it is a full checkpoint without apply/."""
        with self._apply_lock:
            if not self._apply:
                device, dtype = str(self.device), "float32" if self.lowbit else self.dtype
                apply = load_apply_checkpoint(self.checkpoint, device, dtype)
                wrapped = None if apply is None else self.wrap(apply, self.lowbit, self.exact)
                self._apply.append(wrapped or self)
            return self._apply[0]

    @property
    def rows_alone(self) -> bool:
        """Whether every position's numbers are the same bits however the positions around it
        were grouped (prefill chunks, cache hits, batches, verify steps): `exact` low-bit
        weights where Flywheel's kernels run (batched.rows_alone)."""
        return self.ragged and rows_alone(self.trunk.model)

    @property
    def dtype(self) -> str:
        return str(self.trunk.dtype).removeprefix("torch.")

    def new_cache(self, capacity: int = 0):
        """An empty KV cache for `forward`, with room for `capacity` positions where it can
        reserve them (kv_cache.py)."""
        if self.ragged:
            return KVCache(self.trunk.config.num_hidden_layers, capacity)
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
        return self.forward_parts([Part(input_ids, cache, last_only)])[0]

    def forward_parts(self, parts: list[Part]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`forward` of several requests, each on its own cache: one pass where the trunk
        allows (batched.py), else one after another."""
        if self.ragged:
            return forward_parts(self.trunk, parts)
        results = []
        for part in parts:
            kw = {self.cache_kw: part.cache}
            out = self.trunk.model(input_ids=part.ids, use_cache=True, **kw)
            hidden = out.last_hidden_state  # [rows, m, hidden] h_0, normed
            results.append(
                (self.trunk.lm_head(hidden[:, -1:] if part.last_only else hidden), hidden)
            )
        return results


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

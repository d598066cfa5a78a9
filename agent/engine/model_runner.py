"""A loaded checkpoint and its forward pass with a KV cache: what the local engine calls the model.

`LoadedModel.forward` runs the trunk over new tokens with a `transformers` `DynamicCache` and
returns logits and the trunk's final normed hidden states (h_0, what the MTP heads read);
`forward_parts` does it for several requests, each on its own cache, in one pass (batched.py).
The cache (kv_cache.py, or `DynamicCache` for trunks batched.py does not run) is rolled back
with `crop(-n)` after rejected draft tokens.

On the CPU, every `nn.Linear` of the trunk and heads becomes a `FewRowsLinear`: the same
weights, with a product for 1..16 rows (a decode or verify step, an MTP head over a few new
positions) that runs faster on torch's CPU BLAS (see its docstring). Long inputs (prefill) run
exactly as before. With dtype "int8" they become `Int8Linear` instead:
decode-sized inputs use an int8 copy of the weights (lossy); prefill keeps float32, or runs on a
bfloat16 copy where the CPU multiplies bfloat16 fast (`bf16_matmul_is_fast`). Loaded `exact`
(`EngineConfig.exact`), every row takes Flywheel's int8 kernel, prefill too, so a position's
keys and values are the same bits however a prefill chunk, a decode or a verify step computed
them: a prefix-cache hit then decodes what a cold prefill would.

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
from torch import nn

from agent.engine.batched import Part, forward_parts, rows_alone, supports_ragged
from agent.engine.cpu_kernels import K_MULTIPLE as INT8_KERNEL_K_MULTIPLE
from agent.engine.cpu_kernels import int8_mm, pack_int8
from agent.engine.cpu_kernels import quantize_int8 as kernel_quantize_int8
from agent.engine.cpu_kernels import unavailable as int8_kernel_unavailable
from agent.engine.kv_cache import KVCache
from agent.engine.loop import BATCH_ROWS
from agent.engine.prefix_cache import PrefixCache
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
    int8: bool = False  # decode-sized products in int8 (`Int8Linear`)
    exact: bool = False  # int8 products for every row, prefill too (`use_int8_linear`)
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

    @property
    def device(self) -> torch.device:
        return self.trunk.device

    @classmethod
    def load(
        cls, model: str, device: str = "cpu", dtype: str = "float32", exact: bool = False
    ) -> LoadedModel:
        """Load a checkpoint folder ("default" is the built-in starter model); dtype "int8"
        loads float32 and adds int8 weights for decoding (`Int8Linear`), for every row with
        `exact`."""
        int8 = dtype == "int8"
        checkpoint = load_checkpoint(model, device=device, dtype="float32" if int8 else dtype)
        return cls.wrap(checkpoint, int8=int8, exact=exact)

    @classmethod
    def wrap(cls, checkpoint: Checkpoint, int8: bool = False, exact: bool = False) -> LoadedModel:
        """Wrap models already in memory; on the CPU their `nn.Linear`s become `FewRowsLinear`
        in place (same weights and numerics for one row), or `Int8Linear` with `int8` (taking
        every row with `exact`)."""
        tokenizer = checkpoint.tokenizer
        vocab = checkpoint.trunk.config.vocab_size
        known = decode_table(tokenizer)
        token_bytes = known[:vocab] + [b""] * max(0, vocab - len(known))
        why_not = "int8 weights are for the CPU" if int8 else None
        if checkpoint.trunk.device.type == "cpu":
            heads = [checkpoint.heads] if checkpoint.heads is not None else []
            modules = [checkpoint.trunk, *heads]
            for module in modules:
                use_few_rows_linear(module)
            why_not = int8_unavailable() if int8 else None
            if why_not:
                log.error("dtype int8: %s; running float32 instead", why_not)
            elif int8:
                for module in modules:
                    use_int8_linear(module, every_row=exact)
        params = inspect.signature(type(checkpoint.trunk.model).forward).parameters
        cache_kw = "cache" if "cache" in params else "past_key_values"
        ragged = supports_ragged(checkpoint.trunk)
        int8 = int8 and not why_not
        return cls(checkpoint, token_bytes, cache_kw, ragged=ragged, int8=int8, exact=exact)

    def for_apply(self) -> LoadedModel:
        """The model that decodes fast-apply requests: the checkpoint's apply/ adapter
        (agent.model.load_apply_checkpoint), loaded on first use with the same precision, or
        this model itself when it has none."""
        with self._apply_lock:
            if not self._apply:
                device, dtype = str(self.device), "float32" if self.int8 else self.dtype
                apply = load_apply_checkpoint(self.checkpoint, device, dtype)
                wrapped = None if apply is None else self.wrap(apply, self.int8, self.exact)
                self._apply.append(wrapped or self)
            return self._apply[0]

    @property
    def rows_alone(self) -> bool:
        """Whether every position's numbers are the same bits however the positions around it
        were grouped (prefill chunks, cache hits, batches, verify steps): `exact` int8 where
        Flywheel's kernels run (batched.rows_alone)."""
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


class FewRowsLinear(nn.Linear):
    """`nn.Linear` computing y = (W · xᵀ)ᵀ when x has 1..MAX_ROWS rows (CPU inference).

    Why: torch's CPU BLAS (MKL) runs x · Wᵀ for a handful of rows far below its one-row speed;
    the same product with W as the left operand does not, which keeps a verify step over a few
    drafts close to the cost of one decode step. One row (plain decoding) is padded with a zero
    row: BLAS's two-column product streams the weights faster than its one-row product (gemv)
    does, and decoding is bound by reading them (`flywheel bench engine` times the steps).
    Same weights and state dict, and still differentiable; long inputs (prefill, training) go
    through `nn.functional.linear` unchanged.
    """

    # A batched step (loop.BATCH_ROWS rows at most) takes the path its steps take alone.
    MAX_ROWS = BATCH_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not 0 < rows <= self.MAX_ROWS:
            return nn.functional.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])
        if rows == 1:
            flat = torch.cat([flat, torch.zeros_like(flat)])
        y = torch.mm(self.weight, flat.T)[:, :rows].T.contiguous()  # [rows, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def use_few_rows_linear(module: nn.Module) -> None:
    """Turn every plain `nn.Linear` inside `module` into a `FewRowsLinear`, in place."""
    for child in module.modules():
        if type(child) is nn.Linear:
            child.__class__ = FewRowsLinear


class Int8Linear(FewRowsLinear):
    """`FewRowsLinear` that multiplies inputs of at most MAX_INT8_ROWS rows by int8 weights.

    Why: decoding on a CPU reads every weight per step; an int8 copy is a quarter of the bytes.
    Few rows (decode, verify, a batched step) take Flywheel's kernel where the CPU and a C
    compiler allow (`cpu_kernels.int8_mm`: int16 activations with a scale per row, exact integer
    sums, weights with evened-out columns, `cpu_kernels.quantize_int8`), else torch's
    `_weight_int8pack_mm` (bf16 activations, per-output-channel weights, `quantize_int8`). Long
    inputs (prefill) keep the float32 weight, or, where the CPU has fast bfloat16 products
    (AVX-512 BF16 or AMX), a second, bfloat16 copy (`bf16_weight`). Lossy against float32, and a
    near-tie can turn either way. Each row's product does not depend on the other rows, so
    speculative decoding writes plain decoding's tokens bit for bit where verify steps attend
    each position alone too (batched.py). With `every_row` (`EngineConfig.exact`) Flywheel's
    kernel takes long inputs too and there is no bfloat16 copy: a prefill chunk then computes
    each row as a decode step would, whatever its length, at some cost in prefill speed.

    `int8_weight`/`int8_scales`/`int8_columns` are plain attributes, not buffers: the state dict
    and training never see them, and they do not follow later changes to `weight`.
    """

    # int8 stays ahead of float32 well past this on a CPU (benchmarks/int8.py measures the rows);
    # a batched step (loop.BATCH_ROWS rows at most) takes the path its steps take alone
    MAX_INT8_ROWS = BATCH_ROWS
    int8_weight: torch.Tensor  # int8: [out, in] for torch's kernel, `pack_int8`'s for ours
    int8_scales: torch.Tensor  # [out]: float32 for our kernel, bf16 for torch's
    int8_columns: torch.Tensor | None  # [in] float32 for our kernel; None: torch's kernel
    bf16_weight: torch.Tensor | None  # [out, in] bf16 for long inputs; None: float32
    every_row: bool = False  # long inputs take the int8 product too (only with our kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not rows or (rows > self.MAX_INT8_ROWS and not self.every_row):
            if self.bf16_weight is None:
                return super().forward(x)
            y = nn.functional.linear(x.to(torch.bfloat16), self.bf16_weight).to(x.dtype)
            return y if self.bias is None else y + self.bias
        flat = x.reshape(rows, x.shape[-1])
        if self.int8_columns is not None:
            y = int8_mm(flat.float(), self.int8_weight, self.int8_scales, self.int8_columns)
        else:
            x16 = flat.to(torch.bfloat16).contiguous()
            y = torch.ops.aten._weight_int8pack_mm(x16, self.int8_weight, self.int8_scales)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


INT8_K_MULTIPLE = 16  # torch's CPU kernel reads inputs in blocks of 16 (others crash or go wrong)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 for torch's kernel: (q [out, in] int8, scales [out]
    bf16), W ≈ q * s."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).to(torch.bfloat16)  # [out]
    q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def use_int8_linear(
    module: nn.Module,
    bf16_prefill: bool | None = None,
    kernel: bool | None = None,
    every_row: bool = False,
) -> None:
    """Give every `nn.Linear`/`FewRowsLinear` inside `module` whose input width a kernel takes
    an int8 copy of its weight and make it an `Int8Linear`, in place (the rest keep float32).
    `bf16_prefill` (default: `bf16_matmul_is_fast()`) adds the bfloat16 copy for long inputs;
    `kernel` (default: where `cpu_kernels` run here) lets Flywheel's kernel take few rows, and
    every row with `every_row` (no bfloat16 copy then)."""
    if bf16_prefill is None:
        bf16_prefill = bf16_matmul_is_fast()
    if kernel is None:
        kernel = int8_kernel_unavailable() is None
    for child in module.modules():
        if type(child) in (nn.Linear, FewRowsLinear) and child.in_features % INT8_K_MULTIPLE == 0:
            if kernel and child.in_features % INT8_KERNEL_K_MULTIPLE == 0:
                q, scales, columns = kernel_quantize_int8(child.weight)
                q = pack_int8(q)
            else:
                (q, scales), columns = quantize_int8(child.weight), None
            child.int8_weight, child.int8_scales, child.int8_columns = q, scales, columns
            child.every_row = every_row and columns is not None
            long_bf16 = bf16_prefill and not child.every_row
            child.bf16_weight = child.weight.detach().to(torch.bfloat16) if long_bf16 else None
            child.__class__ = Int8Linear


@functools.cache
def bf16_matmul_is_fast() -> bool:
    """Whether this CPU multiplies bfloat16 matrices faster than float32 (oneDNN's bfloat16
    kernels: AVX-512 BF16 or AMX). Without them torch runs bfloat16 products on a slow,
    single-threaded fallback (AVX2-only CPUs, for instance)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")


def int8_unavailable() -> str | None:
    """Why this torch cannot run `Int8Linear` on the CPU (None: it can), tried on a small product."""
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return f"torch {torch.__version__} has no _weight_int8pack_mm"
    weight = torch.linspace(-1, 1, 24 * 48).reshape(24, 48)
    x = torch.linspace(-2, 2, 2 * 48).reshape(2, 48)
    q, scales = quantize_int8(weight)
    try:
        y = op(x.to(torch.bfloat16), q, scales).float()
    except (RuntimeError, NotImplementedError) as exc:
        return f"torch {torch.__version__}'s _weight_int8pack_mm fails on the CPU ({exc})"
    reference = x @ weight.T
    if not (y - reference).norm() <= 0.02 * reference.norm():
        return f"torch {torch.__version__}'s _weight_int8pack_mm gives wrong results on this CPU"
    return None


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

"""Low-bit linear layers for CPU decoding: weight-only int8 and int4 copies beside float32.

A CPU decode step reads every weight once, so its time is the bytes of the weights; these layers
keep the float32 weight (the state dict, training, prefill and the tied embedding lookup still
see it) and add a smaller copy that decode-sized inputs (1..`MAX_LOWBIT_ROWS` rows: a decode,
verify or batched step) are multiplied by. Lossy against float32; a near-tie can turn either way.

The engine's precisions (`EngineConfig.dtype`, `--dtype`; config.DTYPES is the one list):

| dtype    | decode-sized products              | long inputs (prefill)              | layers        |
| -------- | ---------------------------------- | ---------------------------------- | ------------- |
| float32  | float32 (`FewRowsLinear`)          | float32                            | all           |
| bfloat16 | bfloat16                           | bfloat16                           | all           |
| float16  | float16                            | float16                            | all           |
| int8     | int8 per output channel            | float32, or bf16 where it is fast  | all           |
|          | (`Int8Linear`)                     | (int8 under `exact`)               |               |
| int4     | int4, a scale and zero per group   | float32, or bf16 where it is fast  | vocabulary    |
|          | of `INT4_GROUP_SIZE` inputs        | (int4 under `exact`)               | projections   |
|          | (`Int4Linear`)                     |                                    | take int8     |

int8 and int4 are the local backend's CPU options. Under int4 the vocabulary projections
(`lm_head`, an MTP head's output: the layers with `vocab_size` outputs) take int8: their error
lands on the logits unaveraged, and with tied embeddings the same matrix is the input
embedding, which keeps its float32 lookup either way. `use_int4_linear(..., vocab_size=None)`
puts them in int4 too.

Not here: quantized checkpoints on disk (weights are quantized at load), activation
quantization beyond what the kernels do, and GPUs.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from agent.engine.config import LOWBIT_DTYPES
from agent.engine.local.cpu_kernels import K_MULTIPLE as INT8_KERNEL_K_MULTIPLE
from agent.engine.local.cpu_kernels import int8_mm, pack_int8
from agent.engine.local.cpu_kernels import quantize_int8 as kernel_quantize_int8
from agent.engine.local.cpu_kernels import unavailable as int8_kernel_unavailable
from agent.engine.local.few_rows import FewRowsLinear
from agent.engine.scheduler import BATCH_ROWS

# A batched step (loop.BATCH_ROWS rows at most) takes the path its steps take alone. int8 stays
# ahead of float32 well past this on a CPU (benchmarks/int8.py measures the rows); torch's int4
# kernel costs more with every row and falls behind float32 below it (benchmarks/lowbit_matmul.py
# --rows), the price of a batched step computing each row's decode-step bits
MAX_LOWBIT_ROWS = BATCH_ROWS


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

    MAX_INT8_ROWS = MAX_LOWBIT_ROWS
    int8_weight: torch.Tensor  # int8: [out, in] for torch's kernel, `pack_int8`'s for ours
    int8_scales: torch.Tensor  # [out]: float32 for our kernel, bf16 for torch's
    int8_columns: torch.Tensor | None  # [in] float32 for our kernel; None: torch's kernel
    bf16_weight: torch.Tensor | None  # [out, in] bf16 for long inputs; None: float32
    every_row: bool = False  # long inputs take the int8 product too (only with our kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not rows or (rows > self.MAX_INT8_ROWS and not self.every_row):
            return _long_product(self, x)
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


class Int4Linear(FewRowsLinear):
    """`FewRowsLinear` that multiplies inputs of at most MAX_INT4_ROWS rows by int4 weights.

    Why: an int4 copy is an eighth of float32's bytes (plus a bf16 scale and zero per group of
    `group_size` inputs). Few rows take torch's CPU kernel `_weight_int4pack_mm_for_cpu` with
    bf16 activations and a bf16 result (its float32-activation path is many times slower);
    the weights are asymmetric per group, w ≈ (q - 8) · scale + zero with q in [0, 15]
    (`quantize_int4`). Each row's product does not depend on the other rows, so under
    `every_row` (`EngineConfig.exact`) every input takes it and a prefill chunk computes each
    row as a decode step would. Long inputs otherwise keep the float32 weight, or the bfloat16
    copy where the CPU multiplies bfloat16 fast, as `Int8Linear` does.

    Widths the kernel cannot read directly are padded: the copy has zero rows up to a multiple
    of 16 outputs (the result is cut back) and zero columns up to a multiple of `group_size`
    (inputs get zero columns to match). Like `Int8Linear`'s, the int4 tensors are plain
    attributes: the state dict and training never see them.
    """

    MAX_INT4_ROWS = MAX_LOWBIT_ROWS
    int4_weight: torch.Tensor  # uint8 [out padded to 16, in padded / 2], the kernel's packing
    int4_scales_zeros: torch.Tensor  # bf16 [in padded / group_size, out padded to 16, 2]
    group_size: int = 32  # inputs sharing one scale and zero (32, 64, 128 or 256)
    bf16_weight: torch.Tensor | None  # [out, in] bf16 for long inputs; None: float32
    every_row: bool = False  # long inputs take the int4 product too

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not rows or (rows > self.MAX_INT4_ROWS and not self.every_row):
            return _long_product(self, x)
        flat = x.reshape(rows, x.shape[-1]).to(torch.bfloat16)
        padded_in = self.int4_weight.shape[1] * 2
        if padded_in != self.in_features:
            flat = nn.functional.pad(flat, (0, padded_in - self.in_features))
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat.contiguous(), self.int4_weight, self.group_size, self.int4_scales_zeros
        )  # [rows, out padded] bf16
        y = y[:, : self.out_features].to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def _long_product(layer: Int8Linear | Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """A long input's product: the float32 weight, or the bfloat16 copy where there is one."""
    if layer.bf16_weight is None:
        return FewRowsLinear.forward(layer, x)
    y = nn.functional.linear(x.to(torch.bfloat16), layer.bf16_weight).to(x.dtype)
    return y if layer.bias is None else y + layer.bias


INT8_K_MULTIPLE = 16  # torch's CPU kernel reads inputs in blocks of 16 (others crash or go wrong)
INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's CPU int4 kernel takes
INT4_GROUP_SIZE = 32  # the default; benchmarks/lowbit_matmul.py compares the sizes
INT4_N_MULTIPLE = 16  # torch's int4 packing takes outputs in blocks of 16


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 for torch's kernel: (q [out, in] int8, scales [out]
    bf16), W ≈ q * s."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).to(torch.bfloat16)  # [out]
    q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(
    weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of `group_size` inputs, padded as the kernel needs (zero rows
    up to a multiple of 16 outputs, zero columns up to a multiple of `group_size`).

    Returns (q [out', in'] int32 in [0, 15], scales [out', in' / group_size] bf16, zeros [same]
    bf16) with W ≈ (q - 8) · scale + zero, group by group; scale and zero are rounded to bf16
    before q is chosen, so q is the nearest level under the scales the kernel reads.
    """
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(
            f"int4 group size {group_size} is not one torch's CPU kernel takes; "
            f"use one of {', '.join(map(str, INT4_GROUP_SIZES))}"
        )
    w = weight.detach().float()
    out_features, in_features = w.shape
    padded_out = -(-out_features // INT4_N_MULTIPLE) * INT4_N_MULTIPLE
    padded_in = -(-in_features // group_size) * group_size
    w = nn.functional.pad(w, (0, padded_in - in_features, 0, padded_out - out_features))
    groups = w.reshape(padded_out, padded_in // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)  # [out', groups]
    scales = ((high - low).clamp(min=1e-12) / 15).to(torch.bfloat16)
    zeros = (low + 8 * scales.float()).to(torch.bfloat16)
    levels = (groups - zeros.float()[..., None]) / scales.float()[..., None] + 8
    q = torch.round(levels).clamp(0, 15).to(torch.int32).reshape(padded_out, padded_in)
    return q, scales, zeros


def dequantize_int4(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """`quantize_int4`'s weight back in float32, cut to `shape` [out, in]: the reference the
    kernel's product is tested against."""
    group_size = q.shape[1] // scales.shape[1]
    groups = q.float().reshape(q.shape[0], -1, group_size) - 8
    w = groups * scales.float()[..., None] + zeros.float()[..., None]
    return w.reshape(q.shape)[: shape[0], : shape[1]]


def pack_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor):
    """`quantize_int4`'s output in the layout `_weight_int4pack_mm_for_cpu` reads: (packed
    uint8 [out', in' / 2], scales and zeros bf16 [groups, out', 2])."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)  # 2: inner k tiles, unused
    scales_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
    return packed, scales_zeros


def _linears(module: nn.Module) -> list[nn.Linear]:
    """The layers inside `module` still on the float product (none converted yet)."""
    return [c for c in module.modules() if type(c) in (nn.Linear, FewRowsLinear)]


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
    for child in _linears(module):
        if child.in_features % INT8_K_MULTIPLE == 0:
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


def use_int4_linear(
    module: nn.Module,
    group_size: int = INT4_GROUP_SIZE,
    vocab_size: int | None = None,
    bf16_prefill: bool | None = None,
    every_row: bool = False,
) -> None:
    """Make every `nn.Linear`/`FewRowsLinear` inside `module` an `Int4Linear` with an int4 copy
    of its weight, in place; those with `vocab_size` outputs (the vocabulary projections) become
    `Int8Linear`s instead (None: int4 too). `bf16_prefill` (default: `bf16_matmul_is_fast()`)
    adds the bfloat16 copy for long inputs; with `every_row` every input takes the int4 product
    (no bfloat16 copy then)."""
    if bf16_prefill is None:
        bf16_prefill = bf16_matmul_is_fast()
    for child in _linears(module):
        if vocab_size is not None and child.out_features == vocab_size:
            use_int8_linear(child, bf16_prefill, every_row=every_row)
            continue
        q, scales, zeros = quantize_int4(child.weight, group_size)
        child.int4_weight, child.int4_scales_zeros = pack_int4(q, scales, zeros)
        child.group_size = group_size
        child.every_row = every_row
        long_bf16 = bf16_prefill and not every_row
        child.bf16_weight = child.weight.detach().to(torch.bfloat16) if long_bf16 else None
        child.__class__ = Int4Linear


def use_lowbit_linear(
    module: nn.Module, dtype: str, vocab_size: int | None = None, every_row: bool = False
) -> None:
    """`use_int8_linear` or `use_int4_linear` for a dtype of LOWBIT_DTYPES, in place."""
    if dtype == "int8":
        use_int8_linear(module, every_row=every_row)
    elif dtype == "int4":
        use_int4_linear(module, vocab_size=vocab_size, every_row=every_row)
    else:
        raise ValueError(f"dtype {dtype!r} is not low-bit; use one of {', '.join(LOWBIT_DTYPES)}")


def is_lowbit(layer: nn.Module) -> bool:
    """Whether `layer` multiplies decode-sized inputs by a low-bit copy of its weight."""
    return isinstance(layer, (Int8Linear, Int4Linear))


@functools.cache
def bf16_matmul_is_fast() -> bool:
    """Whether this CPU multiplies bfloat16 matrices faster than float32 (oneDNN's bfloat16
    kernels: AVX-512 BF16 or AMX). Without them torch runs bfloat16 products on a slow,
    single-threaded fallback (AVX2-only CPUs, for instance)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")


def unavailable(dtype: str) -> str | None:
    """Why this torch cannot run `dtype`'s layers on the CPU (None: it can)."""
    return int8_unavailable() if dtype == "int8" else int4_unavailable()


def int8_unavailable() -> str | None:
    """Why this torch cannot run `Int8Linear` on the CPU (None: it can), tried on a small product."""
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return f"torch {torch.__version__} has no _weight_int8pack_mm"
    weight = torch.linspace(-1, 1, 24 * 48).reshape(24, 48)
    x = torch.linspace(-2, 2, 2 * 48).reshape(2, 48)
    q, scales = quantize_int8(weight)
    return _wrong_product(
        "_weight_int8pack_mm", lambda: op(x.to(torch.bfloat16), q, scales), x, weight, 0.02
    )


@functools.cache
def int4_unavailable() -> str | None:
    """Why this torch cannot run `Int4Linear` on the CPU (None: it can), tried on a small product."""
    ops = ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu")
    missing = [op for op in ops if not hasattr(torch.ops.aten, op)]
    if missing:
        return f"torch {torch.__version__} has no {missing[0]} (int4 needs torch 2.6 or later)"
    weight = torch.linspace(-1, 1, 32 * 64).reshape(32, 64).sin()
    x = torch.linspace(-2, 2, 2 * 64).reshape(2, 64)

    def product() -> torch.Tensor:
        packed, scales_zeros = pack_int4(*quantize_int4(weight, 32))
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), packed, 32, scales_zeros
        )

    return _wrong_product("int4 CPU kernel", product, x, weight, 0.05)


def _wrong_product(name: str, product, x: torch.Tensor, weight: torch.Tensor, tolerance: float):
    """Why `product()`, the kernel `name` computing `x @ weight.T`, cannot serve on this CPU: it
    fails, or misses by more than `tolerance` (relative norm). None: it serves."""
    try:
        y = product().float()
    except (RuntimeError, NotImplementedError) as exc:
        return f"torch {torch.__version__}'s {name} fails on this CPU ({exc})"
    reference = x @ weight.T
    if not (y - reference).norm() <= tolerance * reference.norm():
        return f"torch {torch.__version__}'s {name} gives wrong results on this CPU"
    return None

"""The engine's float32 linear layer for CPU inference, and the base of its low-bit ones.

`FewRowsLinear` keeps `nn.Linear`'s weights and numerics for one row and changes only how torch
is asked for the product of a few rows (a decode or verify step). The low-bit layers in
lowbit.py extend it: what they do not take (long inputs, widths their kernels cannot read) runs
here. Inference only: training loads plain `nn.Linear`s.
"""

from __future__ import annotations

import torch
from torch import nn

from agent.engine.scheduler import BATCH_ROWS


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

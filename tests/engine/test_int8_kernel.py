"""Flywheel's int8 kernel (agent/engine/int8_mm.c): close to float32, and every row's result
independent of the rows beside it, bit for bit (what exact speculative decoding relies on)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agent.engine import int8_kernel
from agent.engine.model_runner import Int8Linear, quantize_int8, use_int8_linear

pytestmark = pytest.mark.skipif(
    int8_kernel.unavailable() is not None,
    reason=f"Flywheel's int8 kernel: {int8_kernel.unavailable()}",
)


def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    w = torch.randn(n, k)
    q, scales = quantize_int8(w)
    return w, q, scales.float()


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 6, 11, 32])
@pytest.mark.parametrize("n, k", [(48, 64), (50, 96), (7, 32)])  # 50 and 7: a tail of columns
def test_product_matches_the_dequantized_weights(rows, n, k):
    _, q, scales = weights(n, k)
    x = torch.randn(rows, k) * 3
    want = x.double() @ (q.double() * scales.double()[:, None]).T
    got = int8_kernel.int8_mm(x, q, scales)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert (got.double() - want).norm() <= 2e-4 * want.norm()  # int16 activations, one scale a row


@pytest.mark.parametrize("rows", [2, 5, 6, 13])
def test_each_row_is_the_same_alone_or_with_others(rows):
    _, q, scales = weights(52, 128)
    x = torch.randn(rows, 128)
    x[1] *= 1000  # a row of much larger values must not change its neighbours
    together = int8_kernel.int8_mm(x, q, scales)
    alone = torch.cat([int8_kernel.int8_mm(x[i : i + 1], q, scales) for i in range(rows)])
    assert torch.equal(together, alone)


def test_a_zero_row_gives_zeros_and_a_nan_row_gives_nans():
    _, q, scales = weights(8, 32)
    x = torch.randn(3, 32)
    x[0] = 0
    x[2, 5] = float("nan")
    y = int8_kernel.int8_mm(x, q, scales)
    assert torch.equal(y[0], torch.zeros(8))
    assert torch.isfinite(y[1]).all() and torch.isnan(y[2]).all()


def test_int8_linear_takes_the_kernel_for_few_rows_and_torch_without_it():
    torch.manual_seed(0)
    own, theirs = nn.Linear(64, 48), nn.Linear(64, 48)
    theirs.load_state_dict(own.state_dict())
    use_int8_linear(own, bf16_prefill=False)
    use_int8_linear(theirs, bf16_prefill=False, kernel=False)
    assert type(own) is Int8Linear and own.kernel_scales is not None
    assert theirs.kernel_scales is None
    x = torch.randn(5, 64)
    _, q, scales = own.weight, own.int8_weight, own.kernel_scales
    assert torch.equal(own(x), int8_kernel.int8_mm(x, q, scales) + own.bias)
    want = nn.functional.linear(x, own.weight, own.bias)
    for layer in (own, theirs):
        assert (layer(x) - want).norm() <= 0.02 * want.norm()


def test_the_environment_can_keep_torchs_kernel(monkeypatch):
    monkeypatch.setenv(int8_kernel.DISABLE_ENV, "torch")
    int8_kernel._load.cache_clear()
    try:
        assert int8_kernel.unavailable() == f"{int8_kernel.DISABLE_ENV}=torch"
        layer = nn.Linear(64, 16)
        use_int8_linear(layer, bf16_prefill=False)
        assert layer.kernel_scales is None
    finally:
        monkeypatch.delenv(int8_kernel.DISABLE_ENV)
        int8_kernel._load.cache_clear()

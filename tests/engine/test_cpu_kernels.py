"""Flywheel's CPU kernels (agent/engine/local/cpu_kernels.c): close to torch's float32 results, and
every row's result independent of the rows beside it, bit for bit (what exact speculative
decoding relies on)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agent.engine.local import cpu_kernels
from agent.engine.local.kv_cache import KVCache
from agent.engine.local.lowbit import Int8Linear, use_int8_linear

pytestmark = pytest.mark.skipif(
    cpu_kernels.unavailable() is not None,
    reason=f"Flywheel's CPU kernels: {cpu_kernels.unavailable()}",
)


def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(w, q, scales, columns) with q [n, k] as `quantize_int8` gives it."""
    torch.manual_seed(seed)
    w = torch.randn(n, k)
    w[:, 3] *= 20  # a column of large weights, as real layers have
    return (w, *cpu_kernels.quantize_int8(w))


def packed(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(packed q, scales, columns): what `int8_mm` takes."""
    _, q, scales, columns = weights(n, k, seed)
    return cpu_kernels.pack_int8(q), scales, columns


def test_quantized_weights_come_back_close():
    w, q, scales, columns = weights(40, 96)
    assert q.dtype == torch.int8 and scales.shape == (40,) and columns.shape == (96,)
    back = q.float() * scales[:, None] * columns
    assert (back - w).norm() <= 0.005 * w.norm()
    plain = w.abs().amax(1, keepdim=True) / 127  # one step per row, for the same columns
    plain_back = torch.round(w / plain) * plain
    assert (back - w).norm() < (plain_back - w).norm()  # evening out the columns pays


def test_packing_puts_each_weight_where_the_kernel_reads_it():
    q = torch.arange(40 * 6, dtype=torch.int32).reshape(40, 6).remainder(251).sub(125)
    q = q.to(torch.int8)
    p = cpu_kernels.pack_int8(q)
    assert p.shape == (2, 3, 64)  # 40 columns: two blocks of 32, the second padded
    for c in range(40):
        for k in range(6):
            assert p[c // 32, k // 2, 2 * (c % 32) + k % 2] == q[c, k]
    assert not p[1, :, 2 * 8 :].any()  # the padding columns are zeros


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 6, 11, 32])
@pytest.mark.parametrize("n, k", [(64, 64), (50, 96), (7, 32), (33, 48)])  # padded blocks
def test_product_matches_the_dequantized_weights(rows, n, k):
    _, q, scales, columns = weights(n, k)
    x = torch.randn(rows, k) * 3
    want = x.double() @ (q.double() * scales.double()[:, None] * columns.double()).T
    got = cpu_kernels.int8_mm(x, cpu_kernels.pack_int8(q), scales, columns)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert (got.double() - want).norm() <= 2e-4 * want.norm()  # int16 activations, one scale a row


@pytest.mark.parametrize("rows", [2, 5, 6, 13])
def test_each_row_is_the_same_alone_or_with_others(rows):
    quantized = packed(52, 128)
    x = torch.randn(rows, 128)
    x[1] *= 1000  # a row of much larger values must not change its neighbours
    together = cpu_kernels.int8_mm(x, *quantized)
    alone = torch.cat([cpu_kernels.int8_mm(x[i : i + 1], *quantized) for i in range(rows)])
    assert torch.equal(together, alone)


def test_a_zero_row_gives_zeros_and_a_nan_row_gives_nans():
    quantized = packed(8, 32)
    x = torch.randn(3, 32)
    x[0] = 0
    x[2, 5] = float("nan")
    y = cpu_kernels.int8_mm(x, *quantized)
    assert torch.equal(y[0], torch.zeros(8))
    assert torch.isfinite(y[1]).all() and torch.isnan(y[2]).all()


def test_int8_linear_takes_the_kernel_for_few_rows_and_torch_without_it():
    torch.manual_seed(0)
    own, theirs = nn.Linear(64, 48), nn.Linear(64, 48)
    theirs.load_state_dict(own.state_dict())
    use_int8_linear(own, bf16_prefill=False)
    use_int8_linear(theirs, bf16_prefill=False, kernel=False)
    assert type(own) is Int8Linear and own.int8_columns is not None
    assert theirs.int8_columns is None and theirs.int8_scales.dtype == torch.bfloat16
    x = torch.randn(5, 64)
    quantized = own.int8_weight, own.int8_scales, own.int8_columns
    assert torch.equal(own(x), cpu_kernels.int8_mm(x, *quantized) + own.bias)
    want = nn.functional.linear(x, own.weight, own.bias)
    for layer in (own, theirs):
        assert (layer(x) - want).norm() <= 0.02 * want.norm()


def test_the_environment_can_keep_torchs_kernel(monkeypatch):
    monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "torch")
    cpu_kernels._load.cache_clear()
    try:
        assert cpu_kernels.unavailable() == f"{cpu_kernels.DISABLE_ENV}=torch"
        layer = nn.Linear(64, 16)
        use_int8_linear(layer, bf16_prefill=False)
        assert layer.int8_columns is None
    finally:
        monkeypatch.delenv(cpu_kernels.DISABLE_ENV)
        cpu_kernels._load.cache_clear()


def cache_views(rows: int, kv_heads: int, length: int, hd: int) -> tuple[torch.Tensor, ...]:
    """Keys and values as the KV cache hands them out: views into longer buffers."""
    keys = torch.randn(rows, kv_heads, length + 9, hd)[:, :, :length]
    values = torch.randn(rows, kv_heads, length + 9, hd)[:, :, :length]
    return keys, values


@pytest.mark.parametrize("m, length", [(1, 1), (1, 300), (5, 37), (17, 600)])
def test_attention_matches_torchs_causal_attention(m, length):
    torch.manual_seed(0)
    q = torch.randn(2, 9, m, 64) * 2
    k, v = cache_views(2, 3, length, 64)
    mask = torch.ones(m, length, dtype=torch.bool).tril(length - m)
    want = nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True
    )  # [rows, heads, m, hd]
    assert cpu_kernels.can_attend(q, k)
    got = cpu_kernels.attend(q, k, v, 0.125)
    assert got.shape == (2, m, 9 * 64)
    assert torch.allclose(got, want.transpose(1, 2).reshape(2, m, -1), atol=1e-5)


def test_each_attention_position_is_the_same_as_a_decode_step_there():
    torch.manual_seed(1)
    q = torch.randn(1, 6, 5, 32)
    k, v = cache_views(1, 2, 40, 32)
    together = cpu_kernels.attend(q, k, v, 0.2)
    for j in range(5):  # the decode step at position 35 + j sees 36 + j keys
        keys = 36 + j
        alone = cpu_kernels.attend(q[:, :, j : j + 1], k[:, :, :keys], v[:, :, :keys], 0.2)
        assert torch.equal(together[:, j], alone[:, 0])


def test_attention_declines_what_it_cannot_take():
    q = torch.randn(1, 4, 1, 24)
    assert not cpu_kernels.can_attend(q, torch.randn(1, 4, 3, 24))  # head size 24
    q = torch.randn(1, 4, 1, 32)
    assert not cpu_kernels.can_attend(q.double(), torch.randn(1, 4, 3, 32).double())
    assert not cpu_kernels.can_attend(q, torch.randn(1, 4, 32, 3).transpose(-1, -2))


def test_parts_attend_each_over_its_own_cache_as_each_would_alone():
    """`attend_parts` writes each part's new keys and values into its cache and gives every
    token what `attend` gives its part alone, bit for bit."""
    torch.manual_seed(2)
    heads, kv_heads, hd = 6, 2, 32
    shapes = [(1, 1, 30), (2, 1, 7), (1, 5, 50)]  # (rows, m, past) of each part
    total = sum(rows * m for rows, m, _ in shapes)
    q, k_new, v_new = (torch.randn(1, n, total, hd) for n in (heads, kv_heads, kv_heads))
    metas, want, filled, at = [], [], [], 0
    for rows, m, past in shapes:
        cache = KVCache(1, capacity=past + 1)
        cache.update(*(torch.randn(rows, kv_heads, past, hd) for _ in range(2)), 0)
        assert cache.reserve(m)  # grows the buffers: room for past + m
        new = [
            t[0, :, at : at + rows * m].reshape(-1, rows, m, hd).transpose(0, 1)
            for t in (q, k_new, v_new)
        ]
        keys = torch.cat([cache.layers[0].keys, new[1]], dim=2)
        values = torch.cat([cache.layers[0].values, new[2]], dim=2)
        want.append(cpu_kernels.attend(new[0], keys, values, 0.2).reshape(rows * m, -1))
        metas.append(cpu_kernels.part_meta(at, rows, m, past + m, *cache.buffers(0)))
        filled.append((cache, m, keys, values))
        at += rows * m
    out = torch.zeros(total, heads * hd)
    cpu_kernels.attend_parts(q, k_new, v_new, torch.tensor(metas), 0.2, out)
    assert torch.equal(out, torch.cat(want))
    for cache, m, keys, values in filled:
        cache.extend(m)
        assert torch.equal(cache.layers[0].keys, keys)
        assert torch.equal(cache.layers[0].values, values)


def test_an_empty_cache_reserves_nothing():
    assert not KVCache(2).reserve(1)  # its first update allocates the buffers


def test_parts_apply_the_rotary_embedding_as_torch_does():
    """With (cos, sin), `attend_parts` rotates q and the new keys itself: the same bits as
    `apply_rotary_pos_emb` followed by `attend_parts` without them."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(3)
    heads, kv_heads, hd, rows, m, past = 9, 3, 64, 1, 5, 40
    q, k_new, v_new = (torch.randn(1, n, rows * m, hd) for n in (heads, kv_heads, kv_heads))
    angles = torch.arange(past, past + m)[:, None] * torch.rand(hd // 2)
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).contiguous() for f in (torch.cos, torch.sin))
    outs, caches = [], []
    for fused in (True, False):
        cache = KVCache(1, capacity=past + m)
        torch.manual_seed(4)
        cache.update(*(torch.randn(rows, kv_heads, past, hd) for _ in range(2)), 0)
        assert cache.reserve(m)
        meta = torch.tensor([cpu_kernels.part_meta(0, rows, m, past + m, *cache.buffers(0))])
        out = torch.zeros(rows * m, heads * hd)
        if fused:
            cpu_kernels.attend_parts(q, k_new, v_new, meta, 0.125, out, (cos, sin))
        else:
            q_r, k_r = apply_rotary_pos_emb(q, k_new, cos[None], sin[None])
            q_r, k_r = q_r.contiguous(), k_r.contiguous()
            cpu_kernels.attend_parts(q_r, k_r, v_new, meta, 0.125, out)
        cache.extend(m)
        outs.append(out)
        caches.append(cache.layers[0].keys)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(caches[0], caches[1])


def test_tree_masks_mark_each_position_s_branch():
    # [x, a1, a2, b1]: a2 follows a1, b1 is a second branch after x
    masks = cpu_kernels.tree_masks([-1, 0, 1, 0]).tolist()
    assert masks == [0b0001, 0b0011, 0b0111, 0b1001]
    assert cpu_kernels.tree_masks(list(range(-1, 63)))[-1] == -1  # 64 bits, the sign bit set
    with pytest.raises(ValueError, match="earlier position"):
        cpu_kernels.tree_masks([-1, 1])
    with pytest.raises(ValueError, match="at most 64"):
        cpu_kernels.tree_masks([-1] * 65)

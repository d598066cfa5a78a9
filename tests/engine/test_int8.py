"""dtype "int8": int8 weights for decode-sized inputs, float32 (or bf16) for prefill (int8 too
under `exact`), engine only."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from agent.engine import BadRequest, EngineConfig, Request, SamplingParams, open_engine
from agent.engine.local import cpu_kernels
from agent.engine.local.few_rows import FewRowsLinear
from agent.engine.local.lowbit import Int8Linear, int8_unavailable, use_int8_linear
from agent.engine.local.model_runner import LoadedModel

pytestmark = pytest.mark.skipif(
    int8_unavailable() is not None, reason=f"no int8 kernel: {int8_unavailable()}"
)

PROMPT = "def parse(text):\n    return json.loads(text)\n\ndef parse("


def int8_layer(
    in_features: int = 64,
    out_features: int = 48,
    bias: bool = True,
    bf16_prefill: bool = False,
    every_row: bool = False,
) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias)
    use_int8_linear(layer, bf16_prefill, every_row=every_row)
    return layer


ours = pytest.mark.skipif(
    cpu_kernels.unavailable() is not None, reason=f"Flywheel's kernels: {cpu_kernels.unavailable()}"
)


@pytest.mark.parametrize("rows", [1, 3, Int8Linear.MAX_INT8_ROWS])
def test_int8_product_is_close_to_float32(rows):
    layer = int8_layer()
    assert type(layer) is Int8Linear
    x = torch.randn(rows, 64)
    want = nn.functional.linear(x, layer.weight, layer.bias)
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert not torch.equal(got, want)  # lossy: the int8 product ran
    assert (got - want).norm() <= 0.02 * want.norm()


def test_longer_inputs_use_the_float32_weight_exactly():
    layer = int8_layer()
    x = torch.randn(2, 20, 64)  # 40 rows: prefill
    assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
    few = torch.randn(Int8Linear.MAX_INT8_ROWS + 1, 64)
    reference = int8_layer()
    reference.__class__ = FewRowsLinear
    assert torch.equal(layer(few), reference(few))


def test_longer_inputs_use_a_bf16_weight_where_the_cpu_multiplies_bf16_fast():
    layer = int8_layer(bf16_prefill=True)
    x = torch.randn(2, 20, 64)  # 40 rows: prefill
    weight = layer.weight.to(torch.bfloat16)
    want = nn.functional.linear(x.to(torch.bfloat16), weight).float() + layer.bias
    got = layer(x)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    exact = nn.functional.linear(x, layer.weight, layer.bias)
    assert (got - exact).norm() <= 0.01 * exact.norm()
    few = torch.randn(3, 64)  # decode-sized inputs still take the int8 product
    assert torch.equal(layer(few), int8_layer(bf16_prefill=False)(few))


def test_widths_the_kernel_cannot_take_stay_float32():
    layer = int8_layer(in_features=40)
    assert type(layer) is FewRowsLinear or type(layer) is nn.Linear
    assert not hasattr(layer, "int8_weight")


def test_prefill_is_float32_and_decoding_int8(lively_checkpoint, monkeypatch):
    from agent.engine.local import lowbit

    monkeypatch.setattr(lowbit, "bf16_matmul_is_fast", lambda: False)
    exact = LoadedModel.load(str(lively_checkpoint))
    int8 = LoadedModel.load(str(lively_checkpoint), dtype="int8")
    assert type(int8.trunk.lm_head) is Int8Linear
    assert type(int8.trunk.get_input_embeddings()) is nn.Embedding  # the lookup stays float32
    assert int8.trunk.lm_head.weight is int8.trunk.get_input_embeddings().weight  # still tied
    assert all(
        type(m) is Int8Linear for m in int8.checkpoint.heads.modules() if isinstance(m, nn.Linear)
    )
    ids = torch.tensor([exact.tokenizer.encode(PROMPT * 3)])
    assert ids.shape[1] > Int8Linear.MAX_INT8_ROWS
    with torch.inference_mode():
        exact_cache, int8_cache = exact.new_cache(), int8.new_cache()
        want, want_hidden = exact.forward(ids, exact_cache)
        got, got_hidden = int8.forward(ids, int8_cache)
        assert torch.equal(got, want) and torch.equal(got_hidden, want_hidden)  # prefill
        want, _ = exact.forward(ids[:, -1:], exact_cache)  # one decode step
        got, _ = int8.forward(ids[:, -1:], int8_cache)
    assert not torch.equal(got, want)
    assert (got - want).norm() <= 0.05 * want.norm()


@ours
def test_with_every_row_prefill_sized_inputs_take_the_int8_kernel_row_by_row():
    """`every_row` (exact): a row's result is the same alone or among 300 others, what makes a
    prefix-cache hit compute what a cold prefill does; no bfloat16 copy is made."""
    layer = int8_layer(bf16_prefill=True, every_row=True)
    assert layer.bf16_weight is None
    x = torch.randn(300, 64)
    together = layer(x)
    assert not torch.equal(together, nn.functional.linear(x, layer.weight, layer.bias))
    for i in (0, 7, 299):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])


@ours
def test_exact_int8_prefill_computes_what_chunks_and_decode_steps_would(lively_checkpoint):
    """Loaded `exact`: the prompt in one prefill, in two chunks (a prefix-cache hit's tail) and
    token by token give the same logits and cache, bit for bit; without `exact` they differ."""
    int8 = LoadedModel.load(str(lively_checkpoint), dtype="int8", exact=True)
    assert int8.rows_alone
    assert not LoadedModel.load(str(lively_checkpoint), dtype="int8").rows_alone
    ids = torch.tensor([int8.tokenizer.encode(PROMPT * 3)])
    n = ids.shape[1]
    assert n > Int8Linear.MAX_INT8_ROWS + 8
    with torch.inference_mode():
        whole, split, steps = (int8.new_cache() for _ in range(3))
        want, _ = int8.forward(ids, whole)
        head, _ = int8.forward(ids[:, : n - 40], split)
        tail, _ = int8.forward(ids[:, n - 40 :], split)
        int8.forward(ids[:, : n - 8], steps)
        singles = [int8.forward(ids[:, i : i + 1], steps)[0] for i in range(n - 8, n)]
    assert torch.equal(torch.cat([head, tail], dim=1), want)
    assert torch.equal(torch.cat(singles, dim=1), want[:, n - 8 :])
    for a, b in zip(whole.layers, split.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_engine_with_int8_generates(tiny_checkpoint):
    engine = open_engine(EngineConfig(model=str(tiny_checkpoint), dtype="int8"))
    params = SamplingParams(temperature=0, max_tokens=8)
    result = engine.generate(Request(prompt=PROMPT, params=params))
    assert len(result.completions[0].token_ids) == 8
    assert type(engine._model.trunk.lm_head) is Int8Linear
    engine.close()


def test_state_dict_and_training_modules_are_unaffected(tiny_checkpoint):
    from agent.model import load_checkpoint

    exact = LoadedModel.load(str(tiny_checkpoint)).trunk.state_dict()
    int8_trunk = LoadedModel.load(str(tiny_checkpoint), dtype="int8").trunk
    state = int8_trunk.state_dict()
    assert state.keys() == exact.keys()
    assert all(torch.equal(state[k], exact[k]) for k in exact)
    assert all(p.dtype == torch.float32 for p in int8_trunk.parameters())
    trained = load_checkpoint(tiny_checkpoint).trunk  # what training loads: plain nn.Linear
    assert not any(isinstance(m, FewRowsLinear) for m in trained.modules())


def test_missing_kernel_falls_back_to_float32_with_one_error_line(
    tiny_checkpoint, monkeypatch, caplog
):
    from agent.engine.local import lowbit

    monkeypatch.setattr(lowbit, "int8_unavailable", lambda: "no kernel here")
    with caplog.at_level(logging.ERROR, logger="flywheel.engine"):
        model = LoadedModel.load(str(tiny_checkpoint), dtype="int8")
    assert not any(isinstance(m, Int8Linear) for m in model.trunk.modules())
    assert [r.getMessage() for r in caplog.records] == [
        "dtype int8: no kernel here; running float32 instead"
    ]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(dtype="int2"), "unknown dtype 'int2'"),
        (dict(dtype="int8", backend="vllm"), "backend 'vllm'"),
        (dict(dtype="int8", device="cuda"), "device 'cuda'"),
    ],
)
def test_unsupported_dtype_is_a_clear_error(kwargs, words):
    with pytest.raises(BadRequest, match=words):
        EngineConfig(model="default", **kwargs)


def test_dtype_flags_offer_int8():
    from agent.serve.cli import _parser
    from benchmarks.engine.decoding import build_parser

    assert build_parser().parse_args(["--dtype", "int8"]).dtype == "int8"
    assert _parser().parse_args(["--dtype", "int8"]).dtype == "int8"

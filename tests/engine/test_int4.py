"""dtype "int4": int4 weights with a scale and zero per group for decode-sized inputs, int8 for
the vocabulary projections, float32 (or bf16) for prefill (int4 too under `exact`); engine only.
The models are tiny Qwen2s, the default model's architecture (q, k and v biases, tied
embeddings)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from agent.engine import (
    BadRequest,
    EngineConfig,
    Request,
    SamplingParams,
    SpeculativeConfig,
)
from agent.engine.local import cpu_kernels
from agent.engine.local.batched import takes_trees
from agent.engine.local.engine import LocalEngine
from agent.engine.local.few_rows import FewRowsLinear
from agent.engine.local.lowbit import (
    INT4_GROUP_SIZES,
    Int4Linear,
    Int8Linear,
    dequantize_int4,
    int4_unavailable,
    quantize_int4,
    use_int4_linear,
)
from agent.engine.local.model_runner import LoadedModel
from agent.model import build_trunk
from tests.engine.test_batched import verify_and_steps
from tests.engine.test_speculative_equivalence import code_prompts, greedy_outputs

pytestmark = pytest.mark.skipif(
    int4_unavailable() is not None, reason=f"no int4 kernel: {int4_unavailable()}"
)

PROMPT = "def parse(text):\n    return json.loads(text)\n\ndef parse("


def int4_layer(
    in_features: int = 128,
    out_features: int = 48,
    group_size: int = 32,
    bias: bool = True,
    every_row: bool = False,
) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias)
    use_int4_linear(layer, group_size, bf16_prefill=False, every_row=every_row)
    return layer


def dequantized(layer: nn.Linear, group_size: int) -> torch.Tensor:
    """The float32 weight [out, in] the layer's int4 copy stands for."""
    return dequantize_int4(*quantize_int4(layer.weight, group_size), tuple(layer.weight.shape))


@pytest.mark.parametrize("group_size", INT4_GROUP_SIZES[:3])
@pytest.mark.parametrize("rows", [1, 5, Int4Linear.MAX_INT4_ROWS])
def test_int4_product_matches_the_dequantized_weights(rows, group_size):
    """The kernel computes bf16 inputs times the dequantized weights, rounded to bf16 once."""
    layer = int4_layer(in_features=256, group_size=group_size)
    assert type(layer) is Int4Linear
    x = torch.randn(rows, 256)
    want = x.to(torch.bfloat16).float() @ dequantized(layer, group_size).T + layer.bias
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got - want).norm() <= 4e-3 * want.norm()
    exact = nn.functional.linear(x, layer.weight, layer.bias)
    assert not torch.equal(got, exact)  # lossy: the int4 product ran
    assert (got - exact).norm() <= 0.15 * exact.norm()


def test_quantization_error_shrinks_with_the_group():
    torch.manual_seed(1)
    weight = torch.randn(64, 256)
    errors = [
        (dequantize_int4(*quantize_int4(weight, g), (64, 256)) - weight).norm().item()
        for g in INT4_GROUP_SIZES
    ]
    assert errors == sorted(errors) and errors[0] < 0.1 * weight.norm()


@pytest.mark.parametrize("in_features, out_features", [(40, 50), (72, 7), (96, 100)])
def test_widths_off_the_kernels_blocks_are_padded_and_still_match(in_features, out_features):
    """Torch's kernel takes outputs in blocks of 16 and inputs in whole groups; other widths
    get zero padding and the same product."""
    layer = int4_layer(in_features, out_features)
    assert type(layer) is Int4Linear
    x = torch.randn(3, in_features)
    want = x.to(torch.bfloat16).float() @ dequantized(layer, 32).T + layer.bias
    got = layer(x)
    assert got.shape == (3, out_features)
    assert (got - want).norm() <= 4e-3 * want.norm()


def test_a_group_size_the_kernel_cannot_take_is_one_clear_error():
    with pytest.raises(ValueError, match="int4 group size 48 .* use one of 32, 64, 128, 256"):
        use_int4_linear(nn.Linear(96, 32), group_size=48)


def test_each_row_is_the_same_alone_or_among_300_others():
    """What lets a verify step compute plain decoding's steps and, under `exact`, a prefill
    chunk compute what decode steps would."""
    layer = int4_layer(every_row=True)
    assert layer.bf16_weight is None
    x = torch.randn(300, 128)
    together = layer(x)
    for i in (0, 7, 299):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])


def test_longer_inputs_use_the_float32_weight_exactly():
    layer = int4_layer()
    x = torch.randn(2, 20, 128)  # 40 rows: prefill
    assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
    few = torch.randn(Int4Linear.MAX_INT4_ROWS + 1, 128)
    reference = int4_layer()
    reference.__class__ = FewRowsLinear
    assert torch.equal(layer(few), reference(few))


def test_vocabulary_projections_take_int8_unless_told():
    torch.manual_seed(0)
    body, head = nn.Linear(64, 64), nn.Linear(64, 1024, bias=False)
    use_int4_linear(nn.Sequential(body, head), vocab_size=1024, bf16_prefill=False)
    assert type(body) is Int4Linear and type(head) is Int8Linear
    head = nn.Linear(64, 1024, bias=False)
    use_int4_linear(head, vocab_size=None, bf16_prefill=False)
    assert type(head) is Int4Linear


# -- a tiny Qwen2 --------------------------------------------------------------------------


def qwen2_checkpoint(folder: Path, tokenizer, seed: int, std: float | None) -> Path:
    """A tiny Qwen2 with 2 MTP heads; with `std` its matrices are redrawn with that spread so
    greedy output varies (tests/engine/conftest.py's lively checkpoints, as a Qwen2)."""
    from agent.model import save_checkpoint
    from agent.mtp import MTPConfig, MTPHeads

    trunk = build_trunk("test", vocab_size=len(tokenizer), seed=seed, family="qwen2")
    torch.manual_seed(seed + 1000)
    heads = MTPHeads(trunk, MTPConfig(depth=2))
    if std is not None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in (trunk, heads):
                for param in module.parameters():
                    if param.ndim == 2:
                        param.normal_(0.0, std, generator=generator)
    return save_checkpoint(folder, trunk, tokenizer, heads, meta={"version": f"qwen2-{seed}"})


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory, tokenizer) -> Path:
    return qwen2_checkpoint(tmp_path_factory.mktemp("qwen2"), tokenizer, seed=0, std=None)


@pytest.fixture(scope="module")
def lively_qwen2(tmp_path_factory, tokenizer) -> Path:
    return qwen2_checkpoint(tmp_path_factory.mktemp("lively_qwen2"), tokenizer, seed=0, std=0.15)


def test_a_qwen2_under_int4_prefills_in_float32_and_decodes_close_to_it(qwen2, monkeypatch):
    from agent.engine.local import lowbit

    monkeypatch.setattr(lowbit, "bf16_matmul_is_fast", lambda: False)
    exact = LoadedModel.load(str(qwen2))
    int4 = LoadedModel.load(str(qwen2), dtype="int4")
    assert int4.lowbit == "int4" and int4.trunk.config.model_type == "qwen2"
    layer = int4.trunk.model.layers[0]
    assert type(layer.self_attn.q_proj) is Int4Linear and layer.self_attn.q_proj.bias is not None
    assert type(layer.mlp.down_proj) is Int4Linear
    assert type(int4.trunk.lm_head) is Int8Linear  # the vocabulary projection
    assert type(int4.trunk.get_input_embeddings()) is nn.Embedding  # the lookup stays float32
    assert int4.trunk.lm_head.weight is int4.trunk.get_input_embeddings().weight  # still tied
    heads = [m for m in int4.checkpoint.heads.modules() if isinstance(m, nn.Linear)]
    assert heads and all(type(m) in (Int4Linear, Int8Linear) for m in heads)
    ids = torch.tensor([exact.tokenizer.encode(PROMPT * 3)])
    assert ids.shape[1] > Int4Linear.MAX_INT4_ROWS
    with torch.inference_mode():
        exact_cache, int4_cache = exact.new_cache(), int4.new_cache()
        want, want_hidden = exact.forward(ids, exact_cache)
        got, got_hidden = int4.forward(ids, int4_cache)
        assert torch.equal(got, want) and torch.equal(got_hidden, want_hidden)  # prefill
        want, _ = exact.forward(ids[:, -1:], exact_cache)  # one decode step
        got, _ = int4.forward(ids[:, -1:], int4_cache)
    assert not torch.equal(got, want)
    assert (got - want).norm() <= 0.15 * want.norm()
    assert got.argmax(-1).item() == want.argmax(-1).item()


def test_engine_with_int4_generates(qwen2):
    engine = LocalEngine(EngineConfig(model=str(qwen2), dtype="int4"))
    params = SamplingParams(temperature=0, max_tokens=8)
    result = engine.generate(Request(prompt=PROMPT, params=params))
    assert len(result.completions[0].token_ids) == 8
    assert type(engine._model.trunk.model.layers[0].mlp.up_proj) is Int4Linear
    engine.close()


kernels = pytest.mark.skipif(
    cpu_kernels.unavailable() is not None, reason=f"Flywheel's kernels: {cpu_kernels.unavailable()}"
)


@pytest.mark.parametrize("exact", [pytest.param(False, marks=kernels), True])
def test_greedy_under_int4_is_the_same_with_every_proposer(lively_qwen2, qwen2, exact):
    """Speculative decoding under int4 writes plain int4 decoding's tokens: int4 products are
    per row, and verify steps attend each position alone (Flywheel's attention kernel, or
    `exact`), MTP trees included. The engines share the target's prefix cache, so without
    `exact` it is off: a hit's tail takes the int4 product where a cold prefill took float32."""
    cache_mb = 512 if exact else 0
    target = LoadedModel.load(str(lively_qwen2), dtype="int4", exact=exact)
    draft = LoadedModel.load(str(qwen2), dtype="int4", exact=exact)
    prompts = code_prompts(8, seed=0)
    plain = greedy_outputs(
        LocalEngine(
            EngineConfig(str(lively_qwen2), dtype="int4", exact=exact, prefix_cache_mb=cache_mb),
            target,
        ),
        prompts,
    )
    assert sum(len(set(ids)) for ids in plain) > 5 * len(prompts)
    for method in ("ngram", "mtp", "ngram+mtp", "draft"):
        spec = SpeculativeConfig(method=method, draft_model=str(qwen2))
        config = EngineConfig(
            str(lively_qwen2), dtype="int4", speculative=spec, exact=exact, prefix_cache_mb=cache_mb
        )
        outputs = greedy_outputs(LocalEngine(config, target, draft), prompts)
        for i, (want, got) in enumerate(zip(plain, outputs, strict=True)):
            assert got == want, f"{method} differs from plain on prompt {i}"


@kernels
def test_under_int4_a_verify_step_computes_plain_decodings_steps_bit_for_bit(lively_qwen2):
    model = LoadedModel.load(str(lively_qwen2), dtype="int4")
    trunk = model.trunk
    assert takes_trees(trunk)
    verify, steps = verify_and_steps(trunk, prompt_len=200)
    assert torch.equal(verify, steps)


@kernels
def test_exact_int4_prefill_computes_what_chunks_and_decode_steps_would(lively_qwen2):
    int4 = LoadedModel.load(str(lively_qwen2), dtype="int4", exact=True)
    assert int4.rows_alone
    assert not LoadedModel.load(str(lively_qwen2), dtype="int4").rows_alone
    ids = torch.tensor([int4.tokenizer.encode(PROMPT * 3)])
    n = ids.shape[1]
    assert n > Int4Linear.MAX_INT4_ROWS + 8
    with torch.inference_mode():
        whole, split, steps = (int4.new_cache() for _ in range(3))
        want, _ = int4.forward(ids, whole)
        head, _ = int4.forward(ids[:, : n - 40], split)
        tail, _ = int4.forward(ids[:, n - 40 :], split)
        int4.forward(ids[:, : n - 8], steps)
        singles = [int4.forward(ids[:, i : i + 1], steps)[0] for i in range(n - 8, n)]
    assert torch.equal(torch.cat([head, tail], dim=1), want)
    assert torch.equal(torch.cat(singles, dim=1), want[:, n - 8 :])


def test_state_dict_is_unaffected(qwen2):
    exact = LoadedModel.load(str(qwen2)).trunk.state_dict()
    int4_trunk = LoadedModel.load(str(qwen2), dtype="int4").trunk
    state = int4_trunk.state_dict()
    assert state.keys() == exact.keys()
    assert all(torch.equal(state[k], exact[k]) for k in exact)


def test_missing_kernel_falls_back_to_float32_with_one_error_line(qwen2, monkeypatch, caplog):
    from agent.engine.local import lowbit

    monkeypatch.setattr(lowbit, "int4_unavailable", lambda: "no kernel here")
    with caplog.at_level(logging.ERROR, logger="flywheel.engine"):
        model = LoadedModel.load(str(qwen2), dtype="int4")
    assert model.lowbit is None
    assert not any(lowbit.is_lowbit(m) for m in model.trunk.modules())
    assert [r.getMessage() for r in caplog.records] == [
        "dtype int4: no kernel here; running float32 instead"
    ]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(dtype="int4", backend="vllm"), "dtype int4 is the local backend's CPU option"),
        (dict(dtype="int4", device="cuda"), "device 'cuda'"),
    ],
)
def test_int4_off_the_local_cpu_is_a_clear_error(kwargs, words):
    with pytest.raises(BadRequest, match=words):
        EngineConfig(model="default", **kwargs)


def test_generate_cli_takes_int4(qwen2, capsys):
    from agent.engine.generate import main

    argv = ["--model", str(qwen2), "--prompt", PROMPT, "--max-tokens", "4", "--dtype", "int4"]
    assert main(argv) == 0
    assert "output 4 tokens" in capsys.readouterr().err


def test_every_dtype_flag_and_setting_offers_int4():
    from typing import get_args, get_type_hints

    from agent.serve.cli import _parser
    from benchmarks.engine.decoding import build_parser
    from lsp.settings import ModelSettings

    assert build_parser().parse_args(["--dtype", "int4"]).dtype == "int4"
    assert _parser().parse_args(["--dtype", "int4"]).dtype == "int4"
    assert "int4" in get_args(get_type_hints(ModelSettings)["dtype"])

"""The local backend's own guarantees: KV-cache rollback, logprobs, swap, threads, errors."""

from __future__ import annotations

import threading

import pytest
import torch

from agent.chat_format import END
from agent.engine import (
    BadRequest,
    EngineConfig,
    EngineError,
    Request,
    RequestMetrics,
    SamplingParams,
    SpeculativeConfig,
    open_engine,
)
from agent.engine.local.engine import LocalEngine, SpeculativeSequence
from agent.engine.local.sampling import target_probs
from agent.engine.sample_output import SampleOutput
from agent.engine.scheduler import Step
from tests.conftest import make_checkpoint

PROMPT = "def parse(text):\n    return json.loads(text)\n\ndef parse("


def local(checkpoint, method="none", **spec) -> LocalEngine:
    config = EngineConfig(model=str(checkpoint), speculative=SpeculativeConfig(method, **spec))
    return open_engine(config)


def test_kv_cache_after_rejections_equals_a_fresh_prefill(lively_checkpoint):
    engine = local(lively_checkpoint, "mtp")  # random heads: almost every draft is rejected
    job = engine._prepare(
        Request(prompt=PROMPT, params=SamplingParams(max_tokens=40)), engine._model
    )
    metrics = RequestMetrics()
    output = SampleOutput(0, job.model.token_bytes, set(), [], 40, True)
    cache, logits, hidden, cached = _returned(engine._prefill(job, metrics))
    seq = SpeculativeSequence(engine, job, output, cache, metrics)
    seq.start(logits, hidden[0], cached)
    for _ in range(6):
        _returned(seq.step())
    assert metrics.drafts_accepted < metrics.drafts_proposed  # there were rejections
    model = job.model
    with torch.inference_mode():
        assert cache.get_seq_length() == len(seq.tokens) - 1
        after, _ = model.forward(torch.tensor([seq.tokens[-1:]]), cache)
        fresh, _ = model.forward(torch.tensor([seq.tokens]), model.new_cache())
    torch.testing.assert_close(after[0, -1], fresh[0, -1], atol=1e-4, rtol=1e-4)


def _returned(steps):
    """What a generator returns, each forward pass it yields run alone."""
    try:
        while True:
            item = next(steps)
            if isinstance(item, Step):
                type(item).run_batch([item])
    except StopIteration as stop:
        return stop.value


@pytest.mark.parametrize("method", ["none", "ngram", "draft"])
def test_logprobs_match_a_fresh_forward_pass(lively_checkpoint, lively_checkpoint_b, method):
    engine = local(lively_checkpoint, method, draft_model=str(lively_checkpoint_b))
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, max_tokens=16, seed=3)
    completion = engine.generate(Request(prompt=PROMPT, params=params)).completions[0]
    model = engine._model
    prompt = model.tokenizer.encode(PROMPT, add_special_tokens=False)
    with torch.inference_mode():
        logits = model.trunk(torch.tensor([prompt + completion.token_ids])).logits[0]
    positions = range(len(prompt) - 1, len(prompt) - 1 + len(completion.token_ids))
    probs = target_probs(logits[list(positions)], params)
    want = probs[range(len(positions)), completion.token_ids].log()
    torch.testing.assert_close(torch.tensor(completion.logprobs), want, atol=1e-4, rtol=1e-4)


def test_n_samples_with_speculation_are_reproducible(lively_checkpoint):
    engine = local(lively_checkpoint, "ngram")
    params = SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=11)
    a = engine.generate(Request(prompt=PROMPT, params=params))
    b = engine.generate(Request(prompt=PROMPT, params=params))
    assert [c.index for c in a.completions] == [0, 1, 2]
    assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
    assert len({tuple(c.token_ids) for c in a.completions}) > 1


def test_swap_lets_running_requests_finish_on_the_old_weights(
    lively_checkpoint, lively_checkpoint_b
):
    engine = local(lively_checkpoint)
    greedy = SamplingParams(temperature=0, max_tokens=20)
    want_a = engine.generate(Request(prompt=PROMPT, params=greedy)).completions[0]
    stream = engine.stream(Request(prompt=PROMPT, params=greedy))
    next(stream)
    new_version = engine.swap(str(lively_checkpoint_b))
    list(stream)
    running = stream.result.completions[0]
    assert running.token_ids == want_a.token_ids
    assert running.model_version == want_a.model_version == "lively0"
    after = engine.generate(Request(prompt=PROMPT, params=greedy)).completions[0]
    assert new_version == engine.model_version == after.model_version == "lively1"
    assert after.token_ids != want_a.token_ids


def test_concurrent_requests_from_threads(lively_checkpoint):
    engine = local(lively_checkpoint, "ngram")
    prompts = [PROMPT, "import json\n", "class A:\n    def", "x = [1, 2, 3]\n"]
    greedy = SamplingParams(temperature=0, max_tokens=16)
    want = [
        engine.generate(Request(prompt=p, params=greedy)).completions[0].token_ids for p in prompts
    ]
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        got[i] = engine.generate(Request(prompt=prompts[i], params=greedy)).completions[0].token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [got[i] for i in range(len(prompts))] == want


def test_bytes_prompts_take_invalid_utf8(tiny_checkpoint):
    engine = local(tiny_checkpoint)
    result = engine.generate(
        Request(prompt=b"x = '\xff\xfe'\n", params=SamplingParams(max_tokens=3))
    )
    assert result.metrics.prompt_tokens > 0


def test_chat_requests_stop_at_end_of_turn(tiny_checkpoint):
    engine = local(tiny_checkpoint)
    job = engine._prepare(Request(messages=[{"role": "user", "content": "hi"}]), engine._model)
    tokenizer = engine._model.tokenizer
    assert tokenizer.convert_tokens_to_ids(END) in job.stop_ids
    assert tokenizer.eos_token_id in job.stop_ids
    plain = engine._prepare(Request(prompt="hi"), engine._model)
    assert tokenizer.convert_tokens_to_ids(END) not in plain.stop_ids


def test_mtp_without_heads_is_refused(tmp_path, tokenizer):
    folder = make_checkpoint(tmp_path / "noheads", tokenizer, seed=0, mtp_depth=0)
    with pytest.raises(EngineError, match="MTP heads"):
        local(folder, "mtp")


@pytest.mark.parametrize("alternatives", [-1, 9])
def test_draft_alternatives_out_of_range_are_refused(alternatives):
    with pytest.raises(BadRequest, match=r"draft_alternatives must be in \[0, 8\]"):
        SpeculativeConfig(method="mtp", draft_alternatives=alternatives)


def test_draft_model_with_another_tokenizer_is_refused(tmp_path, tiny_checkpoint):
    from agent.tokenizer import train_tokenizer

    other = train_tokenizer(["def f(x):\n    return x * 2\n" * 50], vocab_size=300)
    folder = make_checkpoint(tmp_path / "other", other, seed=0)
    with pytest.raises(EngineError, match="tokenizer"):
        local(tiny_checkpoint, "draft", draft_model=str(folder))


def test_broken_checkpoint_folders_name_the_problem(tmp_path, tiny_checkpoint):
    with pytest.raises(EngineError, match="does not exist"):
        local(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match="missing"):
        local(tmp_path / "empty")


def test_stream_holds_back_a_possible_stop_string():
    table = [b"a", b"b", b"c", b"\xe2", b"\x82", b"\xac"]  # the last three spell the euro sign
    out = SampleOutput(
        0, table, stop_ids=set(), stop_strings=["bc!"], max_tokens=10, logprobs=False
    )
    out.add(0, None)
    assert out.delta().text == "a"
    out.add(1, None)
    out.add(2, None)  # "bc" could still become "bc!"
    assert out.delta().text == ""
    out.add(3, None)
    out.add(4, None)  # an incomplete character is not text yet: "bc" stays held back
    assert out.delta().text == ""
    out.add(5, None)  # "bc€" cannot start "bc!"
    assert out.delta().text == "bc€"
    out.finish("length")
    last = out.delta()
    assert last.text == "" and last.finish_reason == "length"
    assert out.delta() is None
    assert out.text == "abc€"


def test_a_stop_string_counts_only_from_stop_after_on():
    table = [b"\n", b"  x", b"\n", b"y"]
    out = SampleOutput(0, table, set(), ["\n"], max_tokens=10, logprobs=False, stop_after=1)
    assert not out.add(0, None) and not out.add(1, None)  # the line break at 0 is not the end
    assert out.add(2, None) and out.text == "\n  x" and out.finish_reason == "stop"


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(tmp_path, tokenizer):
    from agent.model import build_trunk, save_checkpoint

    folder = save_checkpoint(tmp_path / "mismatch", build_trunk("test", vocab_size=500), tokenizer)
    with pytest.raises(EngineError, match="does not belong to this model"):
        local(folder)


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17])
def test_few_rows_linear_computes_the_same_product(rows):
    """Decode (one row, padded), verify (a few rows) and prefill (many rows) all compute x · Wᵀ,
    and gradients still flow (the layer stays trainable)."""
    from agent.engine.local.few_rows import FewRowsLinear

    torch.manual_seed(rows)
    layer = torch.nn.Linear(64, 48)
    reference = torch.nn.Linear(64, 48)
    reference.load_state_dict(layer.state_dict())
    layer.__class__ = FewRowsLinear
    x = torch.randn(1, rows, 64, requires_grad=True)
    got, want = layer(x), reference(x)
    assert got.shape == want.shape == (1, rows, 48)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    torch.testing.assert_close(layer.weight.grad, x.detach()[0].sum(0).expand(48, 64))


def test_generate_cli_takes_a_dtype(tiny_checkpoint, capsys):
    from agent.engine.generate import main

    argv = ["--model", str(tiny_checkpoint), "--prompt", PROMPT, "--max-tokens", "4"]
    assert main([*argv, "--dtype", "bfloat16"]) == 0
    out, err = capsys.readouterr()
    assert "output 4 tokens" in err
    with pytest.raises(SystemExit):
        main([*argv, "--dtype", "int2"])
    assert "invalid choice: 'int2'" in capsys.readouterr().err

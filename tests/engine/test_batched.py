"""Batching across requests: the ragged forward pass (batched.py) and the scheduler that batches."""

from __future__ import annotations

import threading

import pytest
import torch

from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
from agent.engine.local.batched import Part, forward_parts, supports_ragged, takes_trees
from agent.engine.local.engine import LocalEngine
from agent.engine.local.kv_cache import KVCache
from agent.engine.local.model_runner import LoadedModel
from agent.engine.scheduler import BATCH_ROWS, STEP, EngineThread, Step
from agent.model import build_trunk
from tests.engine.test_engine_thread import _drain

PROMPTS = [
    "def add(a, b):",
    "class Stack:\n    def push(self, item):",
    "import os\n",
    "for i in range(10):\n    print(",
]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_parts_of_any_shape_match_each_request_run_through_the_trunk_alone(family):
    from transformers import DynamicCache

    trunk = build_trunk("test", vocab_size=512, seed=3, family=family).eval()
    assert supports_ragged(trunk)
    torch.manual_seed(0)
    # (rows, context, new): a decode row, a group of two rows, a verify step, a prefill chunk
    shapes = [(1, 9, 1), (2, 5, 1), (1, 17, 5), (1, 3, 12)]
    contexts = [torch.randint(0, 512, (rows, n)) for rows, n, _ in shapes]
    news = [torch.randint(0, 512, (rows, m)) for rows, _, m in shapes]
    with torch.inference_mode():
        caches = [DynamicCache(config=trunk.config) for _ in shapes]
        forward_parts(
            trunk,
            [Part(c, cache, last_only=True) for c, cache in zip(contexts, caches, strict=True)],
        )
        got = forward_parts(trunk, [Part(n, cache) for n, cache in zip(news, caches, strict=True)])
        for context, new, cache, (logits, hidden) in zip(contexts, news, caches, got, strict=True):
            whole = trunk(torch.cat([context, new], dim=1), output_hidden_states=True)
            m = new.shape[1]
            torch.testing.assert_close(logits, whole.logits[:, -m:], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(
                hidden, whole.hidden_states[-1][:, -m:], atol=1e-4, rtol=1e-4
            )
            assert cache.get_seq_length() == context.shape[1] + m


class _Fake(Step):
    """A step that records which batch it ran in."""

    def __init__(self, name: str, rows: int, key: object, runs: list) -> None:
        self.name, self._rows, self._key, self.runs = name, rows, key, runs

    @property
    def key(self) -> object:
        return self._key

    @property
    def rows(self) -> int:
        return self._rows

    @classmethod
    def run_batch(cls, steps: list[Step]) -> None:
        steps[0].runs.append(sorted(step.name for step in steps))


def _steps(name: str, rows: list[int], runs: list, key: object = "weights"):
    for size in rows:
        yield _Fake(name, size, key, runs)
    return name


def _queued(scheduler: EngineThread, streams) -> list:
    """Open every stream while the scheduler is busy, so that all are waiting when it looks."""
    gate = threading.Event()
    busy = threading.Event()

    def hold():
        busy.set()
        gate.wait(30)

    blocker = threading.Thread(target=scheduler.call, args=(hold,), kwargs={"lane": "interactive"})
    blocker.start()
    busy.wait(30)
    relays = [scheduler.stream(generator, lane) for generator, lane in streams]
    gate.set()
    blocker.join()
    return relays


def test_small_steps_of_one_lane_run_together_and_ride_with_the_first_large_one():
    scheduler, runs = EngineThread(), []
    relays = _queued(
        scheduler,
        [
            (_steps("a", [1, 1, 1], runs), "interactive"),
            (_steps("b", [1, 1], runs), "interactive"),
            (_steps("c", [100, 1], runs), "interactive"),  # a prefill chunk, then decoding
            (_steps("other-weights", [1], runs, key="other"), "interactive"),
            (_steps("agent", [1, 1], runs), "normal"),
        ],
    )
    assert [_drain(relay) for relay in relays] == ["a", "b", "c", "other-weights", "agent"]
    scheduler.close()
    assert runs == [
        ["a", "b", "c"],  # c's large step first, the small ones riding along
        ["a", "b", "c"],
        ["a"],
        ["other-weights"],  # its own weights: never in another batch
        ["agent"],  # a less urgent lane never rides along with an editor's steps
        ["agent"],
    ]


def test_a_batch_takes_at_most_batch_rows():
    scheduler, runs = EngineThread(), []
    half = BATCH_ROWS // 2
    relays = _queued(scheduler, [(_steps(name, [half], runs), "normal") for name in "xyz"])
    for relay in relays:
        _drain(relay)
    scheduler.close()
    assert runs == [["x", "y"], ["z"]]


def test_a_step_yielded_after_a_boundary_still_joins_the_batch():
    scheduler, runs = EngineThread(), []

    def slow(name):
        yield STEP  # work between steps that is a switching point of its own
        yield _Fake(name, 1, "weights", runs)

    relays = _queued(scheduler, [(slow("p"), "normal"), (slow("q"), "normal")])
    for relay in relays:
        _drain(relay)
    scheduler.close()
    assert runs == [["p", "q"]]


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_requests_batched_on_the_engine_thread_write_what_each_writes_alone(
    tiny_checkpoint, monkeypatch, method
):
    spec = SpeculativeConfig(method)
    params = SamplingParams(max_tokens=16, temperature=0)
    prompts = [*PROMPTS, "\n".join(PROMPTS) * 4]  # the last one's prefill is a large step
    alone_engine = LocalEngine(EngineConfig(model=str(tiny_checkpoint), speculative=spec))
    alone = [
        alone_engine.generate(Request(prompt=p, params=params)).completions[0].token_ids
        for p in prompts
    ]
    passes: list[list[int]] = []  # the token rows of every part, per pass
    forward_parts_ = LoadedModel.forward_parts

    def recording(self, parts):
        passes.append([part.ids.numel() for part in parts])
        return forward_parts_(self, parts)

    monkeypatch.setattr(LoadedModel, "forward_parts", recording)
    config = EngineConfig(model=str(tiny_checkpoint), speculative=spec, own_thread=True)
    engine = LocalEngine(config)
    requests = [Request(prompt=p, params=params, priority="interactive") for p in prompts]
    streams = _queued_requests(engine, requests)
    together = [stream.finish().completions[0].token_ids for stream in streams]
    engine.close()
    assert together == alone
    assert max(len(rows) for rows in passes) == len(prompts)  # all five decoded in one pass
    # the large prefill went through with small steps riding along
    assert any(len(rows) > 1 and max(rows) > BATCH_ROWS for rows in passes)


def test_requests_cancelled_or_abandoned_mid_batch_leave_the_others_as_they_were(
    tiny_checkpoint,
):
    params = SamplingParams(max_tokens=24, temperature=0)
    engine = LocalEngine(EngineConfig(model=str(tiny_checkpoint), own_thread=True))
    alone = [engine.generate(Request(prompt=p, params=params)).completions[0] for p in PROMPTS]
    requests = [Request(prompt=p, params=params, cancel=threading.Event()) for p in PROMPTS]
    streams = _queued_requests(engine, requests)
    next(streams[1])  # decoding has started: cancel one request, stop reading another
    requests[1].cancel.set()
    next(streams[2])
    streams[2].close()
    results = {i: streams[i].finish().completions[0] for i in (0, 1, 3)}
    engine.close()
    assert results[1].finish_reason == "cancelled"
    assert len(results[1].token_ids) < len(alone[1].token_ids)
    for i in (0, 3):
        assert results[i].token_ids == alone[i].token_ids


def test_requests_sent_together_with_one_prompt_prefill_it_once(tiny_checkpoint):
    """The samples of a group arrive at once: the first prefills, the others start from its
    cached prefix (each request looks up when its turn to prefill comes)."""
    engine = LocalEngine(EngineConfig(model=str(tiny_checkpoint), own_thread=True))
    prompt = "\n".join(PROMPTS) * 8
    requests = [
        Request(prompt=prompt, params=SamplingParams(max_tokens=4, temperature=1.0, seed=i))
        for i in range(4)
    ]
    results = [stream.finish() for stream in _queued_requests(engine, requests)]
    engine.close()
    prompt_tokens = results[0].metrics.prompt_tokens
    assert prompt_tokens > BATCH_ROWS  # a prefill that runs as a step of its own
    assert results[0].metrics.cached_tokens == 0
    assert all(r.metrics.cached_tokens >= prompt_tokens - 2 for r in results[1:])


def _queued_requests(engine: LocalEngine, requests: list[Request]) -> list:
    """Every request's stream, opened while the engine's scheduler is busy."""
    gate, busy = threading.Event(), threading.Event()

    def hold():
        busy.set()
        gate.wait(30)

    blocker = threading.Thread(target=engine._scheduler.call, args=(hold,))
    blocker.start()
    busy.wait(30)
    streams = [engine.stream(request) for request in requests]
    gate.set()
    blocker.join()
    return streams


@pytest.mark.base
@pytest.mark.parametrize("method", ["none", "ngram"])
def test_the_default_model_batched_writes_what_it_writes_alone(method):
    """The product's engine (int8, its drafts) on the real weights: batching changes no token."""
    spec = SpeculativeConfig(method)
    config = EngineConfig(model="default", dtype="int8", speculative=spec, own_thread=True)
    engine = LocalEngine(config)
    params = SamplingParams(max_tokens=24, temperature=0)
    requests = [Request(prompt=p, params=params, priority="interactive") for p in PROMPTS]
    alone = [engine.generate(request).completions[0].token_ids for request in requests]
    streams = _queued_requests(engine, requests)
    together = [stream.finish().completions[0].token_ids for stream in streams]
    engine.close()
    assert together == alone


def test_under_int8_a_verify_step_computes_plain_decodings_steps_bit_for_bit():
    """Speculative decoding is lossless only if a verify step's rows are what plain decoding's
    one-row steps compute: at the same positions, the same logits to the last bit (the int8
    products' bf16 outputs turn the least rounding difference into a possible flip of a greedy
    token). int8 products are per row and each position attends alone; float32 BLAS products
    round by row count, so there the equality is close, not exact."""
    from agent.engine.local.lowbit import use_int8_linear

    trunk = build_trunk("40m", vocab_size=512, seed=3).eval()  # the base's layer shapes
    use_int8_linear(trunk)
    verify, steps = verify_and_steps(trunk, prompt_len=500, alone=True)
    assert torch.equal(verify, steps)


def verify_and_steps(trunk, prompt_len: int, alone: bool = False) -> tuple:
    """The logits of one verify step over 6 random tokens after a random prompt, and those of
    6 one-row decode steps over the same tokens ([1, 6, vocab] each)."""

    torch.manual_seed(0)
    vocab = trunk.config.vocab_size
    prompt, new = torch.randint(0, vocab, (1, prompt_len)), torch.randint(0, vocab, (1, 6))
    layers = trunk.config.num_hidden_layers
    with torch.inference_mode():
        one, several = KVCache(layers), KVCache(layers)
        forward_parts(trunk, [Part(prompt, one, last_only=True)])
        forward_parts(trunk, [Part(prompt, several, last_only=True)])
        steps = [forward_parts(trunk, [Part(new[:, j : j + 1], one)])[0][0] for j in range(6)]
        ((verify, _),) = forward_parts(trunk, [Part(new, several, alone=alone)])
    return verify, torch.cat(steps, dim=1)


@pytest.mark.parametrize("exact", [False, True])
def test_exact_speculation_marks_verify_steps_to_attend_alone(tiny_checkpoint, monkeypatch, exact):
    import agent.engine.local.model_runner as runner

    seen: list[bool] = []

    def spy(trunk, parts):
        seen.extend(p.alone for p in parts if p.ids.shape[1] > 1 and not p.last_only)
        return forward_parts(trunk, parts)

    monkeypatch.setattr(runner, "forward_parts", spy)
    spec = SpeculativeConfig(method="ngram")
    engine = LocalEngine(EngineConfig(model=str(tiny_checkpoint), speculative=spec, exact=exact))
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=False)
    engine.generate(Request(prompt="a b a b a b a b a b", params=params))
    engine.close()
    assert seen and set(seen) == {exact}  # verify steps ran, each marked as asked


def test_under_int8_a_tree_step_computes_each_branchs_decode_steps_bit_for_bit():
    """A tree of drafts (`Part.parents`): two branches after the last token, [x, a1, a2] and
    [x, b1, b2], in one verify step. Each row is what plain decoding's step at that point of its
    own branch computes, and keeping branch b's rows leaves the cache plain decoding would."""
    from agent.engine.local.lowbit import use_int8_linear

    trunk = build_trunk("40m", vocab_size=512, seed=3).eval()
    use_int8_linear(trunk)
    if not takes_trees(trunk):
        pytest.skip("the CPU kernels do not build here")
    torch.manual_seed(1)
    prompt = torch.randint(0, 512, (1, 300))
    x, a1, a2, b1, b2 = torch.randint(0, 512, (5,)).tolist()
    layers = trunk.config.num_hidden_layers
    with torch.inference_mode():
        tree, plain_a, plain_b = KVCache(layers), KVCache(layers), KVCache(layers)
        for cache in (tree, plain_a, plain_b):
            forward_parts(trunk, [Part(prompt, cache, last_only=True)])
        rows = torch.tensor([[x, a1, a2, b1, b2]])
        ((logits, _),) = forward_parts(trunk, [Part(rows, tree, parents=[-1, 0, 1, 0, 3])])

        def steps(cache, tokens):
            return [forward_parts(trunk, [Part(torch.tensor([[t]]), cache)])[0][0] for t in tokens]

        branch_a, branch_b = steps(plain_a, [x, a1, a2]), steps(plain_b, [x, b1, b2])
        tree.keep_new(5, [0, 3, 4])
    assert torch.equal(logits, torch.cat(branch_a + branch_b[1:], dim=1))
    for layer in range(layers):
        assert tree.get_seq_length(layer) == plain_b.get_seq_length(layer) == 303
        assert torch.equal(tree.layers[layer].keys, plain_b.layers[layer].keys)
        assert torch.equal(tree.layers[layer].values, plain_b.layers[layer].values)


def test_a_tree_step_off_the_kernels_attends_through_a_masked_call():
    """A float32 trunk has no kernel of ours: a tree part's rows see their own branch through a
    mask, and come out close to each branch's own decode steps."""

    trunk = build_trunk("test", vocab_size=256, seed=2).eval()
    assert not takes_trees(trunk)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (1, 40), generator=generator)
    x, a1, b1 = torch.randint(0, 256, (3,), generator=generator).tolist()
    layers = trunk.config.num_hidden_layers
    with torch.inference_mode():
        tree, plain_a, plain_b = KVCache(layers), KVCache(layers), KVCache(layers)
        for cache in (tree, plain_a, plain_b):
            forward_parts(trunk, [Part(prompt, cache, last_only=True)])
        rows = torch.tensor([[x, a1, b1]])
        ((logits, _),) = forward_parts(trunk, [Part(rows, tree, parents=[-1, 0, 0])])
        want = [
            forward_parts(trunk, [Part(torch.tensor([tokens]), cache)])[0][0]
            for tokens, cache in (([x, a1], plain_a), ([x, b1], plain_b))
        ]
    assert torch.allclose(logits[0, :2], want[0][0], atol=1e-4)
    assert torch.allclose(logits[0, 2], want[1][0, 1], atol=1e-4)

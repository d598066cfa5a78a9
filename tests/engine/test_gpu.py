"""The `gpu` tier: the local engine on a CUDA device matches the CPU, token for token, with
prefix caching and batching on.

Runs with `pytest -m gpu` on a machine with CUDA; skips cleanly without one. The test marked
`base` too compares the real default model (float32 on both devices).
"""

from __future__ import annotations

import pytest
import torch

from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
from agent.engine.local.engine import LocalEngine
from tests.engine.test_batched import _queued_requests

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = ["def add(a, b):\n    return", "import json\n\ndef load(path):", "class Stack:\n"]
GREEDY = SamplingParams(max_tokens=24, temperature=0)
HEAD = "\n".join(PROMPTS) * 6 + "\n"  # a shared opening long enough to be worth caching


def _alone(model: str, device: str, method: str, head: str = "") -> list[list[int]]:
    """Each prompt's greedy tokens, one request at a time, no prefix cache."""
    config = EngineConfig(
        model=model, device=device, speculative=SpeculativeConfig(method=method), prefix_cache_mb=0
    )
    engine = LocalEngine(config)
    try:
        return [
            engine.generate(Request(prompt=head + p, params=GREEDY)).completions[0].token_ids
            for p in PROMPTS
        ]
    finally:
        engine.close()


@pytest.mark.parametrize("method", ["none", "ngram", "mtp", "ngram+mtp"])
def test_cuda_greedy_equals_cpu(tiny_checkpoint, method):
    model = str(tiny_checkpoint)
    assert _alone(model, "cuda", method) == _alone(model, "cpu", method)


@pytest.mark.parametrize("method", ["none", "ngram+mtp"])
def test_cuda_batched_and_cached_equals_cpu_alone(tiny_checkpoint, method):
    """Requests queued together decode in shared forward passes on the GPU; each next turn of a
    conversation starts from the cached prefix of the last; greedy tokens are the CPU's."""
    model = str(tiny_checkpoint)
    want = _alone(model, "cpu", method, head=HEAD)
    config = EngineConfig(
        model=model,
        device="cuda",
        speculative=SpeculativeConfig(method=method),
        own_thread=True,
        prefix_cache_mb=64,
    )
    engine = LocalEngine(config)
    try:
        requests = [Request(prompt=HEAD + p, params=GREEDY) for p in PROMPTS]
        together = [s.finish().completions[0].token_ids for s in _queued_requests(engine, requests)]
        # the same prompts again, queued together: every one is a prefix-cache hit now
        again = [s.finish() for s in _queued_requests(engine, requests)]
        stats = engine.prefix_cache_stats()
    finally:
        engine.close()
    assert together == want
    assert [r.completions[0].token_ids for r in again] == want
    assert all(r.metrics.cached_tokens > 0 for r in again)
    assert stats["hits"] > 0


@pytest.mark.base
def test_the_default_model_on_cuda_writes_what_it_writes_on_the_cpu():
    assert _alone("default", "cuda", "ngram+mtp") == _alone("default", "cpu", "ngram+mtp")

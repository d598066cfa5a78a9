"""The `gpu` tier: the local engine on a CUDA device matches the CPU, token for token.

Runs with `pytest -m gpu` on a machine with CUDA; skips cleanly without one.
"""

from __future__ import annotations

import pytest
import torch

from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
from agent.engine.local import LocalEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = ["def add(a, b):\n    return", "import json\n\ndef load(path):", "class Stack:\n"]


@pytest.mark.parametrize("method", ["none", "ngram", "mtp", "ngram+mtp"])
def test_cuda_greedy_equals_cpu(tiny_checkpoint, method):
    spec = SpeculativeConfig(method=method)
    outputs = {}
    for device in ("cpu", "cuda"):
        engine = LocalEngine(
            EngineConfig(model=str(tiny_checkpoint), device=device, speculative=spec)
        )
        outputs[device] = [
            engine.generate(Request(prompt=p, params=SamplingParams(max_tokens=24, temperature=0)))
            .completions[0]
            .token_ids
            for p in PROMPTS
        ]
        engine.close()
    assert outputs["cuda"] == outputs["cpu"]

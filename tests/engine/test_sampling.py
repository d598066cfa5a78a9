"""The target distribution: temperature, top-k, top-p, seeds."""

from __future__ import annotations

import pytest
import torch

from agent.engine.local.sampling import make_generator, next_tokens, target_probs
from agent.engine.request import BadRequest, SamplingParams


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    p = target_probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(p, torch.softmax(logits / 0.5, -1))


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    p = target_probs(logits, SamplingParams(top_k=2))
    assert (p[0, [0, 2]] == 0).all()
    assert torch.allclose(p[0, [1, 3]], torch.softmax(torch.tensor([3.0, 2.0]), -1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    logits = probs.log()
    p = target_probs(logits, SamplingParams(top_p=0.7))  # 0.5 + 0.25 reaches 0.7
    assert torch.allclose(p, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    p = target_probs(logits, SamplingParams(top_p=0.75))  # exactly reached: the third not needed
    assert torch.allclose(p, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    p = target_probs(logits, SamplingParams(top_p=0.3))  # the most likely token always stays
    assert torch.allclose(p, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_greedy_takes_the_argmax_with_model_logprobs():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]])
    tokens, logprobs = next_tokens(logits, SamplingParams(temperature=0), make_generator(0))
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logprobs, logits.log_softmax(-1)[[0, 1], [1, 0]])


def test_same_seed_same_samples():
    logits = torch.randn(4, 50)
    params = SamplingParams(temperature=1.0)
    a = next_tokens(logits, params, make_generator(5))[0]
    b = next_tokens(logits, params, make_generator(5))[0]
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("bad", [dict(top_p=0), dict(temperature=-0.1), dict(top_k=-1)])
def test_impossible_settings_are_refused(bad):
    with pytest.raises(BadRequest):
        SamplingParams(**bad)

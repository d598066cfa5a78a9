"""From logits to the target distribution p, and drawing tokens from it.

`target_probs` is a pure function: logits -> temperature -> top-k -> top-p -> softmax. It is the
distribution p that plain decoding samples from and that the rejection sampler
(`rejection_sampler.py`) verifies drafts against, so speculative and plain decoding agree on what
"the target distribution" is.

Greedy (temperature 0) does not build p: it takes the argmax of the logits. Its reported logprobs
are under the model's own (temperature 1, untruncated) distribution, since the one-hot greedy
distribution would report 0 for every token.

Randomness comes only from a per-request `torch.Generator` (`make_generator`), so the same seed
and the same request give the same samples; nothing touches torch's global RNG.
"""

from __future__ import annotations

import secrets

import torch

from agent.engine.request import SamplingParams


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator for one request; a fresh random seed when `seed` is None."""
    generator = torch.Generator(device=device)
    generator.manual_seed(secrets.randbits(63) if seed is None else int(seed))
    return generator


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution p to sample from (non-greedy params).

    logits: [rows, vocab] (any float dtype)
    returns [rows, vocab] float32, each row sums to 1, zeros outside top-k / top-p
    """
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [rows, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (the first is always kept).
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row. probs: [rows, vocab] -> [rows] int64."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample the next token of each row; plain decoding's whole sampling step.

    logits: [rows, vocab] -> (tokens [rows] int64, logprobs [rows] float32 or None)
    """
    if params.greedy:
        tokens = logits.argmax(-1)
        if not params.logprobs:
            return tokens, None
        logprobs = logits.float().log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    probs = target_probs(logits, params)
    tokens = sample(probs, generator)
    if not params.logprobs:
        return tokens, None
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()


def token_logprobs(
    logits: torch.Tensor, probs: torch.Tensor | None, tokens: torch.Tensor
) -> torch.Tensor:
    """log p(token) for each row: under `probs` when given (sampling), else the model's softmax.

    logits: [rows, vocab], probs: [rows, vocab] or None, tokens: [rows] -> [rows]
    """
    if probs is not None:
        return probs.gather(-1, tokens[:, None]).squeeze(-1).log()
    return logits.float().log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)

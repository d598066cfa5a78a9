"""Speculative decoding is lossless.

Greedy: every proposer gives token-for-token the output of plain decoding, on 50 prompts spread
over two differently seeded targets (each the other's draft model). Sampling: the distribution of sampled tokens with every
proposer equals the target distribution (chi-square against exact probabilities computed by
brute force on a 16-token vocabulary).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
from agent.engine.local import proposers
from agent.engine.local.batched import takes_trees
from agent.engine.local.engine import LocalEngine
from agent.engine.local.kv_cache import KVCache
from agent.engine.local.model_runner import LoadedModel
from agent.engine.local.sampling import target_probs
from agent.model import Checkpoint, build_trunk
from agent.mtp import MTPConfig, MTPHeads

STDLIB_JSON = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def code_prompts(count: int, seed: int) -> list[tuple[str, str | None]]:
    """(prompt, speculation) pairs cut from the standard library's json package."""
    text = "".join(p.read_text() for p in sorted((STDLIB_JSON / "json").glob("*.py")))
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        start = rng.randrange(len(text) - 400)
        prompt = text[start : start + rng.randint(10, 300)]
        # every third prompt is an apply-style request: speculate the text that follows
        speculation = text[start + len(prompt) : start + len(prompt) + 200] if i % 3 == 0 else None
        prompts.append((prompt, speculation))
    return prompts


def greedy_outputs(engine, prompts) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=False)
    return [
        engine.generate(Request(prompt=p, speculation=s, params=params)).completions[0].token_ids
        for p, s in prompts
    ]


@pytest.mark.parametrize("pair", ["lively", "tiny"])
def test_greedy_identical_with_every_proposer(pair, request):
    names = ("lively_checkpoint", "lively_checkpoint_b")
    if pair == "tiny":
        names = ("tiny_checkpoint", "tiny_checkpoint_b")
    a, b = (request.getfixturevalue(n) for n in names)
    # 2 x 25 prompts on the lively pair; the plain tiny models mostly repeat one token
    count = 25 if pair == "lively" else 5
    for seed, (target, draft) in enumerate(((a, b), (b, a))):
        prompts = code_prompts(count, seed=seed)
        target_model = LoadedModel.load(str(target))
        draft_model = LoadedModel.load(str(draft))
        plain = greedy_outputs(LocalEngine(EngineConfig(model=str(target)), target_model), prompts)
        assert sum(len(set(ids)) for ids in plain) > (5 * count if pair == "lively" else 0)
        for method in ("ngram", "mtp", "ngram+mtp", "draft"):
            spec = SpeculativeConfig(method=method, draft_model=str(draft))
            engine = LocalEngine(
                EngineConfig(model=str(target), speculative=spec), target_model, draft_model
            )
            outputs = greedy_outputs(engine, prompts)
            for i, (want, got) in enumerate(zip(plain, outputs, strict=True)):
                assert got == want, f"{method} differs from plain on prompt {i} of {target}"


# -- sampling: exact distribution on a 16-token vocabulary --------------------------------------

VOCAB = 16
STEPS = 4  # tokens per sample: the first comes from the prefill, the rest from verify steps
SPREAD = 0.5  # weight standard deviation: sharp distributions make a wrong rule show quickly
PROMPT = [3, 7, 1, 12, 3, 7, 9, 0, 3, 7, 1, 5, 14, 2, 3, 7]  # repeats give n-gram matches


def tiny_vocab_model(seed: int, heads: bool) -> LoadedModel:
    """A 16-token model with sharp enough distributions, and a 17-token tokenizer whose EOS (16)
    the model can never produce, so every sample has exactly STEPS tokens."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    trunk = build_trunk("test", vocab_size=VOCAB, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in trunk.parameters():
            if param.ndim == 2:
                param.normal_(0.0, SPREAD, generator=generator)
    trunk.eval()
    mtp = MTPHeads(trunk, MTPConfig(depth=2)).eval() if heads else None
    vocab = {chr(ord("a") + i): i for i in range(VOCAB)} | {"<|endoftext|>": VOCAB}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="a")),
        eos_token="<|endoftext|>",
    )
    return LoadedModel.wrap(Checkpoint(trunk, tokenizer, mtp, f"v{seed}", "memory"))


def exact_distribution(model: LoadedModel, params: SamplingParams) -> np.ndarray:
    """P[t1, ..., tSTEPS] under the target distribution, by brute force. [VOCAB] * STEPS"""
    joint = torch.ones(1)
    prefixes = torch.tensor([PROMPT])
    with torch.inference_mode():
        for _ in range(STEPS):
            logits = model.trunk(prefixes).logits[:, -1]  # [VOCAB ** step, VOCAB]
            joint = (joint[:, None] * target_probs(logits, params)).reshape(-1)
            rows = prefixes.repeat_interleave(VOCAB, 0)
            nxt = torch.arange(VOCAB).repeat(prefixes.shape[0])[:, None]
            prefixes = torch.cat([rows, nxt], 1)
    return joint.reshape([VOCAB] * STEPS).double().numpy()


def sample_tokens(engine, samples: int, params: SamplingParams) -> np.ndarray:
    """[samples, STEPS] token ids, from requests of n = 64 with consecutive seeds."""
    out = []
    seed = 0
    while len(out) < samples:
        p = SamplingParams(
            temperature=params.temperature, top_p=params.top_p, max_tokens=STEPS, n=64, seed=seed
        )
        out += [c.token_ids for c in engine.generate(Request(prompt=PROMPT, params=p)).completions]
        seed += 1
    return np.array(out[:samples])


def pooled_chisquare(observed: np.ndarray, expected_p: np.ndarray) -> float:
    """p-value of a chi-square test, pooling cells expected to hold fewer than 5 samples."""
    total = observed.sum()
    expected = expected_p.reshape(-1) * total
    observed = observed.reshape(-1)
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert obs.sum() == total
    exp = exp * obs.sum() / exp.sum()
    return float(chisquare(obs, exp).pvalue)


@pytest.fixture(scope="module")
def vocab16():
    return tiny_vocab_model(seed=3, heads=True), tiny_vocab_model(seed=4, heads=False)


@pytest.mark.parametrize("setting", ["temperature-1", "top-p-0.9"])
@pytest.mark.parametrize("method", ["none", "ngram", "mtp", "ngram+mtp", "draft"])
def test_sampled_distribution_matches_the_target(vocab16, method, setting):
    target, draft = vocab16
    params = SamplingParams(temperature=1.0, top_p=0.9 if setting == "top-p-0.9" else 1.0)
    spec = SpeculativeConfig(method=method, draft_model="memory", num_draft_tokens=3)
    engine = LocalEngine(EngineConfig(model="memory", speculative=spec), target, draft)
    samples = sample_tokens(engine, 2048 if method == "none" else 640, params)
    exact = exact_distribution(target, params)
    # the speculative positions: each one's marginal, and the joint of the first two of them
    for position in range(1, STEPS):
        axes = tuple(a for a in range(STEPS) if a != position)
        marginal = exact.sum(axis=axes)
        observed = np.bincount(samples[:, position], minlength=VOCAB)
        assert pooled_chisquare(observed, marginal) > 1e-3, f"position {position}"
    pair = exact.sum(axis=(0, 3))  # [VOCAB, VOCAB] over positions 1 and 2
    observed = np.zeros((VOCAB, VOCAB))
    np.add.at(observed, (samples[:, 1], samples[:, 2]), 1)
    assert pooled_chisquare(observed, pair) > 1e-3
    if method != "none":
        assert (
            engine.generate(
                Request(prompt=PROMPT, params=SamplingParams(max_tokens=STEPS, n=8, seed=0))
            ).metrics.drafts_proposed
            > 0
        )


# -- a tree of drafts: the first head's alternatives (int8, where the kernels take trees) -------


def int8_model(path) -> LoadedModel:
    model = LoadedModel.load(str(path), dtype="int8")
    if not (model.lowbit == "int8" and takes_trees(model.trunk)):
        pytest.skip("no int8 kernels here: the engine drafts chains only")
    return model


def kept_branches(monkeypatch) -> list[list[int]]:
    """The rows each kept alternative's branch kept, as the engine's caches are told them."""
    branches: list[list[int]] = []
    keep_new = KVCache.keep_new

    def spy(self, m, kept):
        branches.append(kept)
        keep_new(self, m, kept)

    monkeypatch.setattr(KVCache, "keep_new", spy)
    return branches


def test_greedy_identical_with_alternatives_to_the_first_draft(lively_checkpoint, monkeypatch):
    """With alternatives, a verify step is a tree; the output is still plain decoding's, and some
    steps keep an alternative's branch (the cache moves its row up)."""
    alternatives = 3  # the lively model's heads are untrained: room for them to be right
    monkeypatch.setattr(proposers, "MIN_ALTERNATIVE_P", 0.0)  # and too unsure to offer any
    target = int8_model(lively_checkpoint)
    prompts = code_prompts(20, seed=0)
    plain = greedy_outputs(
        LocalEngine(EngineConfig(model=str(lively_checkpoint), dtype="int8"), target), prompts
    )
    branches = kept_branches(monkeypatch)
    for method in ("mtp", "ngram+mtp"):
        spec = SpeculativeConfig(method=method, draft_alternatives=alternatives)
        config = EngineConfig(model=str(lively_checkpoint), dtype="int8", speculative=spec)
        outputs = greedy_outputs(LocalEngine(config, target), prompts)
        for i, (want, got) in enumerate(zip(plain, outputs, strict=True)):
            assert got == want, f"{method} with {alternatives} alternatives differs on prompt {i}"
    assert branches  # an alternative was kept at least once


def test_sampling_with_alternatives_matches_plain_sampling_under_int8(monkeypatch):
    """Sampled tokens with the heads' drafts and their alternatives against plain decoding's,
    both int8 (whose distribution the brute-force float32 one only approximates): a two-sample
    chi-square test at each speculative position."""
    from scipy.stats import chi2_contingency

    checkpoint = tiny_vocab_model(seed=3, heads=True).checkpoint
    target = LoadedModel.wrap(checkpoint, lowbit="int8")
    if not (target.lowbit == "int8" and takes_trees(target.trunk)):
        pytest.skip("no int8 kernels here: the engine drafts chains only")
    params = SamplingParams(temperature=1.0)
    spec = SpeculativeConfig(method="mtp", num_draft_tokens=2, draft_alternatives=2)
    monkeypatch.setattr(proposers, "MIN_ALTERNATIVE_P", 0.0)
    branches = kept_branches(monkeypatch)
    samples = {
        name: sample_tokens(
            LocalEngine(EngineConfig(model="memory", speculative=s), target), 768, params
        )
        for name, s in (("plain", SpeculativeConfig()), ("tree", spec))
    }
    for position in range(1, STEPS):
        counts = np.array([np.bincount(samples[n][:, position], minlength=VOCAB) for n in samples])
        counts = counts[:, counts.sum(axis=0) > 0]
        assert chi2_contingency(counts).pvalue > 1e-3, f"position {position}"
    assert branches


@pytest.mark.parametrize("least, offered", [(0.0, 3), (1.01, 0)])
def test_the_heads_offer_alternatives_as_likely_as_the_threshold(
    lively_checkpoint, monkeypatch, least, offered
):
    monkeypatch.setattr(proposers, "MIN_ALTERNATIVE_P", least)
    model = int8_model(lively_checkpoint)
    proposer = proposers.MTPProposer(model, alternatives=3)
    ids = model.tokenizer.encode("def add(a, b):\n    return a + b\n")
    with torch.inference_mode():
        _, hidden = model.forward(torch.tensor([ids[:-1]]), model.new_cache())
        proposer.observe(hidden[0])
        draft = proposer.propose(ids, 2)
    assert len(draft.token_ids) == 2
    assert len(draft.alternatives) == offered
    assert draft.token_ids[0] not in draft.alternatives

"""Prefix caching (agent/engine/local/prefix_cache.py): a conversation's later turns and a repeated
prompt reuse the computed prefix, outputs are the same as without the cache, memory is bounded."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
from agent.engine.local.engine import LocalEngine
from agent.engine.local.prefix_cache import MIN_MATCH, PrefixCache
from tests.engine.test_speculative_equivalence import code_prompts


def _engine(
    folder, mb: int, method: str = "none", dtype: str = "float32", exact: bool = False
) -> LocalEngine:
    config = EngineConfig(
        model=str(folder),
        prefix_cache_mb=mb,
        speculative=SpeculativeConfig(method=method),
        dtype=dtype,
        exact=exact,
    )
    return LocalEngine(config)


def _conversation(turns: int = 4) -> list[str]:
    """Prompts that each extend the previous one, as an agent's turns do."""
    head = "".join(p for p, _ in code_prompts(3, seed=5))  # a shared opening, as a system prompt
    pieces = [p for p, _ in code_prompts(turns, seed=3)]
    return [head + "".join(pieces[: i + 1]) for i in range(turns)]


@pytest.mark.parametrize("method", ["none", "ngram", "mtp", "ngram+mtp"])
def test_outputs_are_the_same_with_and_without_the_cache(lively_checkpoint, method):
    cached, plain = _engine(lively_checkpoint, 64, method), _engine(lively_checkpoint, 0, method)
    _same_with_and_without(cached, plain, method)


@pytest.mark.parametrize("method", ["none", "ngram+mtp"])
def test_exact_int8_hits_compute_a_cold_prefill_s_logprobs_bit_for_bit(lively_checkpoint, method):
    """`exact` int8 computes every row alone, prefill included, so a hit's logprobs are a cold
    prefill's to the last bit (not only its tokens)."""
    cached = _engine(lively_checkpoint, 64, method, dtype="int8", exact=True)
    if not cached._model.rows_alone:
        pytest.skip("no int8 kernels of ours here")
    plain = _engine(lively_checkpoint, 0, method, dtype="int8", exact=True)
    _same_with_and_without(cached, plain, method, logprobs=True)


def test_exact_without_rows_computed_alone_turns_the_cache_off(lively_checkpoint, caplog):
    """float32 prefill rounds by the rows in a call, so `exact` there keeps no prefixes."""
    engine = _engine(lively_checkpoint, 64, exact=True)
    assert "the prefix cache is off" in caplog.text
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=False)
    prompt = _conversation(1)[0]
    for _ in range(2):
        assert engine.generate(Request(prompt=prompt, params=params)).metrics.cached_tokens == 0
    assert engine.prefix_cache_stats() == {}


def _same_with_and_without(cached, plain, method: str, logprobs: bool = False) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=16, logprobs=logprobs)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=7, logprobs=False)
    hits = []
    for prompt in _conversation():
        for params in (greedy, sampled):
            got = cached.generate(Request(prompt=prompt, params=params))
            want = plain.generate(Request(prompt=prompt, params=params))
            assert [c.token_ids for c in got.completions] == [c.token_ids for c in want.completions]
            assert [c.logprobs for c in got.completions] == [c.logprobs for c in want.completions]
            assert want.metrics.cached_tokens == 0
            hits.append((got.metrics.cached_tokens, got.metrics.prompt_tokens))
    assert hits[0][0] == 0  # the first prompt was new
    tail = 1 + (32 if "mtp" in method else 0)  # computed again: logits, and the MTP window
    assert hits[1][0] == hits[1][1] - tail  # the same prompt again
    assert all(h > 0 for h, _ in hits[2:]), hits  # each turn extends the last


@pytest.mark.parametrize("method", ["none", "ngram"])  # plain and speculative decoding
def test_a_next_turn_finds_the_last_prompt_and_reply_and_the_stats_count_them(
    lively_checkpoint, method
):
    engine = _engine(lively_checkpoint, 64, method)
    tokenizer = engine._model.tokenizer
    first = tokenizer.encode(_conversation(1)[0], add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=False)
    a = engine.generate(Request(prompt=first, params=params))
    reply = a.completions[0].token_ids
    # the next turn: the conversation so far, its reply and a tool result
    second = first + reply + tokenizer.encode(" and then some more text", add_special_tokens=False)
    b = engine.generate(Request(prompt=second, params=params)).metrics
    stats = engine.prefix_cache_stats()
    assert stats["queries"] == a.metrics.prompt_tokens + b.prompt_tokens
    # every token of the first turn but its reply's last, which was never fed to the model
    assert stats["hits"] == b.cached_tokens == len(first) + len(reply) - 1
    assert stats["entries"] == 1  # the second turn extends the first, which it replaced
    assert _engine(lively_checkpoint, 0).prefix_cache_stats() == {}


def _cache_of(length: int, width: int = 8) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(2):
        kv = torch.full((1, 1, length, width), float(layer))
        cache.update(kv, kv.clone(), layer)
    return cache


def test_memory_is_bounded_least_recently_used_first():
    per_token = 2 * 2 * 8 * 4  # layers x (keys, values) x width x float32
    cache = PrefixCache(max_bytes=per_token * 100)
    a, b, c = ([k] * 40 for k in (1, 2, 3))
    cache.store(a, _cache_of(40))
    cache.store(b, _cache_of(40))
    assert cache.lookup(a + [9], limit=100)[0] == 40  # a is now the most recently used
    cache.store(c, _cache_of(40))  # 120 tokens > 100: the least recently used (b) goes
    assert cache.lookup(b, limit=100) == (0, None)
    assert cache.lookup(a, limit=39)[0] == 39 and cache.lookup(c, limit=100)[0] == 40
    assert cache.stats.evictions == 1 and cache.stats.bytes == 80 * per_token
    cache.store([5] * (MIN_MATCH - 1), _cache_of(MIN_MATCH - 1))  # too short to keep
    assert cache.stats.entries == 2
    cache.store([1] * 300, _cache_of(300))  # larger than the whole budget: not kept
    assert cache.stats.entries == 2


def test_a_swap_starts_an_empty_cache(lively_checkpoint, lively_checkpoint_b):
    engine = _engine(lively_checkpoint, 64)
    prompt = _conversation(1)[0]
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=False)
    engine.generate(Request(prompt=prompt, params=params))
    assert engine.generate(Request(prompt=prompt, params=params)).metrics.cached_tokens > 0
    engine.swap(str(lively_checkpoint_b))
    assert engine.generate(Request(prompt=prompt, params=params)).metrics.cached_tokens == 0

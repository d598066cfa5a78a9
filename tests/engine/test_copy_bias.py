"""Fast apply's copy bias (agent/engine/local/copy_bias.py): where the output stands in its sources,
which tokens get the bonus, and that decoding under it stays lossless across methods."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent.chat_format import apply_messages, apply_parts
from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
from agent.engine.local.copy_bias import CopyBias, _anchor
from agent.engine.local.engine import LocalEngine
from agent.engine.request import BadRequest

ORIGINAL = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"


def test_the_output_follows_the_source_and_the_bonus_goes_to_its_next_token():
    state = CopyBias([[10, 11, 12, 13]], bias=2.0).start()
    assert state.favoured() == [10]
    for token, following in ((10, 11), (11, 12), (12, 13)):
        state.advance(token)
        assert state.favoured() == [following]
    logits = torch.zeros(2, 20)
    state.adjust_(logits)
    assert logits[:, 13].tolist() == [2.0, 2.0] and logits.sum().item() == 4.0
    state.advance(13)
    assert state.favoured() == []  # the source is written out: the model ends freely


def test_after_a_substitution_it_re_anchors_forward_on_two_tokens():
    #         0  1  2  3  4  5  6  7  8  9
    source = [1, 2, 3, 9, 5, 1, 2, 3, 4, 5]
    state = CopyBias([source], bias=1.0).start()
    for token in (1, 2, 3, 9, 5, 1, 2):
        state.advance(token)
    assert state.favoured() == [3]
    state.advance(7)  # leaves the source: 2, 7 occurs nowhere
    assert state.favoured() == []
    state.advance(4)  # 7, 4: nowhere either
    assert state.favoured() == []
    state.advance(5)  # 4, 5 occurs at 8..9, but nothing follows it
    assert state.favoured() == []


def test_re_anchoring_prefers_the_longest_suffix_then_the_first_occurrence_ahead():
    source = np.array([1, 2, 3, 8, 0, 2, 3, 9, 0, 2, 3, 7, 5])
    assert _anchor(source, [2, 3], cursor=0) == 3
    assert _anchor(source, [2, 3], cursor=4) == 7  # the first one ending after the cursor
    assert _anchor(source, [2, 3], cursor=12) == 11  # none ahead: the last
    assert _anchor(source, [0, 2, 3], cursor=0) == 7  # longer beats earlier
    assert _anchor(source, [5, 6], cursor=0) is None
    assert _anchor(source, [3], cursor=0) is None  # shorter than ANCHOR_MIN


def test_the_sketch_source_starts_unanchored_and_both_sources_can_be_favoured():
    state = CopyBias([[1, 2, 3, 4], [2, 3, 6]], bias=1.0).start()
    assert state.favoured() == [1]  # the speculation only
    state.advance(1)
    state.advance(2)
    state.advance(3)
    assert state.favoured() == [4, 6]  # the original goes on with 4, the sketch with 6
    copy = state.copy()
    copy.advance(6)
    assert copy.favoured() == [] and state.favoured() == [4, 6]  # copies are independent


def test_sources_of_a_request_are_the_speculation_and_the_prompt_after_it(tokenizer):
    messages = apply_messages("shapes.py", ORIGINAL, "def area(w, h, d):\n")
    prompt = tokenizer.encode(messages[1]["content"], add_special_tokens=False)
    ids = tokenizer.encode(ORIGINAL, add_special_tokens=False)
    rule = CopyBias.for_request(prompt, ORIGINAL, ids, tokenizer, bias=3.0)
    original, rest = (tokenizer.decode(s.tolist()) for s in rule.sources)
    assert original == ORIGINAL
    assert rest == "</file>\n<edit>\ndef area(w, h, d):\n</edit>"
    assert CopyBias.for_request(prompt, None, None, tokenizer, bias=3.0) is None
    assert CopyBias.for_request(prompt, ORIGINAL, ids, tokenizer, bias=0.0) is None
    assert apply_parts(messages[1]["content"]) == ("shapes.py", ORIGINAL, "def area(w, h, d):\n")
    assert apply_parts("no apply layout") is None


def _apply(checkpoint, method: str, bias: float, prompt: str, temperature=0.0, **config):
    spec = SpeculativeConfig(method=method, max_draft_tokens=8)
    engine = LocalEngine(
        EngineConfig(
            model=str(checkpoint),
            apply_copy_bias=bias,
            prefix_cache_mb=0,
            speculative=spec,
            exact=True,
            **config,
        )
    )
    params = SamplingParams(temperature=temperature, max_tokens=40, seed=3, logprobs=False)
    return engine.generate(Request(prompt=prompt, speculation=ORIGINAL, params=params, apply=True))


@pytest.mark.parametrize("bias", [0.0, 4.0])
def test_decoding_under_the_bias_is_the_same_with_every_drafting_method(lively_checkpoint, bias):
    prompt = ORIGINAL + "# the same, with area renamed to surface:\n"
    outputs = {
        method: _apply(lively_checkpoint, method, bias, prompt).completions[0].token_ids
        for method in ("none", "ngram", "mtp", "ngram+mtp")
    }
    assert len(set(map(tuple, outputs.values()))) == 1, outputs


def test_the_bias_shapes_every_branch_of_a_tree_of_drafts(lively_checkpoint, monkeypatch):
    """Under int8 a verify step may be a tree of drafts; each branch's row is biased by its own
    state. Heads that always put the right token among the alternatives and a wrong one first
    make every step keep a branch, and the output is still plain decoding's."""
    from agent.engine.local.proposers import Draft, MTPProposer
    from tests.engine.test_speculative_equivalence import int8_model, kept_branches

    vocab = int8_model(lively_checkpoint).vocab_size  # skips where the kernels do not build
    prompt = ORIGINAL + "# the same, with area renamed to surface:\n"
    plain = _apply(lively_checkpoint, "none", 4.0, prompt, dtype="int8").completions[0].token_ids
    emitted_from: list[int] = []  # len(tokens) before the first output token

    def knowing(self, tokens, k):
        emitted_from[:] = emitted_from or [len(tokens) - 1]
        right = plain[len(tokens) - emitted_from[0]]
        return Draft([(right + 1) % vocab], alternatives=[(right + 2) % vocab, right])

    monkeypatch.setattr(MTPProposer, "propose", knowing)
    branches = kept_branches(monkeypatch)
    tree = _apply(lively_checkpoint, "mtp", 4.0, prompt, dtype="int8").completions[0].token_ids
    assert tree == plain
    assert len(branches) >= len(plain) // 2 - 1  # two tokens per step, each from a branch


def test_a_large_bias_makes_a_random_model_copy_the_original(lively_checkpoint, tokenizer):
    prompt = ORIGINAL + "\n"  # after the speculation: one token, nothing to anchor on
    plain = _apply(lively_checkpoint, "none", 0.0, prompt).completions[0]
    copied = _apply(lively_checkpoint, "ngram", 1000.0, prompt).completions[0]
    wanted = tokenizer.encode(ORIGINAL, add_special_tokens=False)
    assert plain.token_ids[: len(wanted)] != wanted  # the model alone does not copy
    assert copied.token_ids[: len(wanted)] == wanted[: len(copied.token_ids)]
    sampled = _apply(lively_checkpoint, "none", 1000.0, prompt, temperature=1.0).completions[0]
    assert sampled.token_ids[: len(wanted)] == wanted[: len(sampled.token_ids)]


def test_requests_that_are_not_fast_apply_are_untouched(lively_checkpoint):
    prompt = ORIGINAL + "\n"
    engines = [
        LocalEngine(
            EngineConfig(model=str(lively_checkpoint), apply_copy_bias=b, prefix_cache_mb=0)
        )
        for b in (0.0, 1000.0)
    ]
    params = SamplingParams(temperature=0, max_tokens=20)
    out = [
        e.generate(Request(prompt=prompt, speculation=ORIGINAL, params=params)).completions[0]
        for e in engines
    ]
    assert out[0].token_ids == out[1].token_ids


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_bias_is_refused_in_one_line(bad):
    with pytest.raises(BadRequest, match="apply_copy_bias"):
        EngineConfig(apply_copy_bias=bad)

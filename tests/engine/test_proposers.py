"""Proposers as small, direct functions: n-gram lookup, MTP indexing, draft-model cache sync."""

from __future__ import annotations

import torch

from agent.engine.local.model_runner import LoadedModel
from agent.engine.local.proposers import DraftModelProposer, MTPProposer, NgramProposer
from agent.engine.local.sampling import make_generator
from agent.engine.request import SamplingParams


def test_ngram_worked_example_from_the_docstring():
    x, eq, one, semi, y = 10, 11, 12, 13, 14
    proposer = NgramProposer(ngram_min=1, ngram_max=2)
    draft = proposer.propose([x, eq, one, semi, y, eq, x], k=3)
    assert draft.token_ids == [eq, one, semi]
    assert draft.probs is None


def test_ngram_prefers_the_longest_suffix_and_returns_nothing_without_a_match():
    proposer = NgramProposer(ngram_min=1, ngram_max=3)
    # [2, 3] occurs twice; the 3-gram [1, 2, 3] picks the occurrence followed by 9
    assert proposer.propose([1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3], k=2).token_ids == [9, 5]
    assert proposer.propose([1, 2, 3, 4], k=2).token_ids == []


def test_ngram_drafts_a_rewrite_from_the_speculation_text():
    original = [5, 6, 7, 8, 5, 6, 9, 10, 11]
    proposer = NgramProposer(ngram_min=1, ngram_max=2, speculation=original)
    assert proposer.propose([1, 5, 6], k=3).token_ids == [7, 8, 5]
    # the output has moved on along the original: the second [5, 6] continues it
    assert proposer.propose([1, 5, 6, 7, 8, 5, 6], k=3).token_ids == [9, 10, 11]


def test_mtp_proposer_feeds_each_head_the_documented_inputs(tiny_checkpoint):
    """Head j at position i reads h_j[i] and t[i+j+1]: recompute the drafts by hand."""
    model = LoadedModel.load(str(tiny_checkpoint))
    heads = model.checkpoint.heads
    tokens = [5, 9, 33, 2, 71, 8]
    with torch.inference_mode():
        h0 = model.trunk.model(torch.tensor([tokens[:-1]])).last_hidden_state  # [1, 5, hidden]
        proposer = MTPProposer(model, window=32)
        proposer.observe(h0[0])
        draft = proposer.propose(tokens, k=2)
        positions = torch.arange(5)[None]
        h1 = heads.forward_head(0, h0, torch.tensor([tokens[1:6]]), positions)
        d1 = int(heads.logits(0, h1[:, -1]).argmax())
        h2 = heads.forward_head(1, h1, torch.tensor([tokens[2:6] + [d1]]), positions)
        d2 = int(heads.logits(1, h2[:, -1]).argmax())
    assert draft.token_ids == [d1, d2]
    assert proposer.propose(tokens, k=5).token_ids == [d1, d2]  # at most the head depth


def test_draft_model_proposer_resyncs_its_cache_after_rejections(tiny_checkpoint_b):
    model = LoadedModel.load(str(tiny_checkpoint_b))
    params = SamplingParams(temperature=0)
    proposer = DraftModelProposer(model, params, make_generator(0), model.vocab_size)
    tokens = [5, 9, 33, 2]
    with torch.inference_mode():
        first = proposer.propose(tokens, k=3).token_ids
        # the verifier accepted one draft and recovered a different token
        tokens = tokens + [first[0], (first[1] + 1) % model.vocab_size]
        second = proposer.propose(tokens, k=3).token_ids
        fresh = DraftModelProposer(model, params, make_generator(0), model.vocab_size)
        assert second == fresh.propose(tokens, k=3).token_ids
        assert proposer.cache.get_seq_length() == len(tokens) + 2  # drafts 1..k-1 fed

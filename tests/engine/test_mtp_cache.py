"""MTP drafting with per-head KV caches equals recomputing every head over the whole sequence.

`MTPProposer` runs each head incrementally and crops its cache to the positions whose inputs are
final (accepted tokens only). The reference here is the definition: every head re-run causally
over all positions with `MTPHeads.forward_head` (the training path), drafts from the last one.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
import torch

from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
from agent.engine.local.engine import LocalEngine
from agent.engine.local.model_runner import LoadedModel
from agent.engine.local.proposers import MTPProposer
from agent.engine.request import EngineError
from agent.model import Checkpoint
from agent.mtp import DRAFT_VOCAB_FILE, MTPConfig, MTPHeads, frequent_tokens
from tests.conftest import STDLIB, make_checkpoint


def recomputed_drafts(
    heads: MTPHeads, h0: torch.Tensor, tokens: list[int], k: int, first: int = 0
) -> list[int]:
    """Drafts from every head re-run over positions first..n-2. h0: [n - 1, hidden]."""
    n = len(tokens)
    positions = torch.arange(first, n - 1)[None]
    ext = list(tokens)
    h = h0[None, first:]  # [1, n - 1 - first, hidden]
    for j in range(k):
        h = heads.forward_head(j, h, torch.tensor([ext[first + j + 1 : j + n]]), positions)
        ext.append(int(heads.logits(j, h[:, -1]).argmax(-1)))
    return ext[n:]


def lively(checkpoint: Checkpoint, depth: int, std: float = 0.15) -> LoadedModel:
    """The tiny trunk with `depth` fresh heads, re-drawn with a wide spread so drafts vary."""
    heads = MTPHeads(checkpoint.trunk, MTPConfig(depth=depth)).eval()
    generator = torch.Generator().manual_seed(depth)
    with torch.no_grad():
        for module in (checkpoint.trunk, heads):
            for param in module.parameters():
                if param.ndim == 2:
                    param.normal_(0.0, std, generator=generator)
    return LoadedModel.wrap(Checkpoint(checkpoint.trunk, checkpoint.tokenizer, heads, "t", "mem"))


@pytest.mark.parametrize(("depth", "window"), [(2, 128), (3, 128), (2, 5)])
def test_cached_drafts_equal_a_recompute_through_accepts_and_rejections(
    tiny_checkpoint, depth, window
):
    """window 128: never restarts, so the reference is a full recompute; window 5: the caches
    restart every few steps, and the reference starts where they did."""
    from agent.model import load_checkpoint

    model = lively(load_checkpoint(tiny_checkpoint), depth)
    heads, vocab = model.checkpoint.heads, model.vocab_size
    rng = random.Random(depth)
    tokens = [rng.randrange(vocab) for _ in range(9)]  # prompt + the first emitted token
    proposer = MTPProposer(model, window=window)
    observed = 0
    restarts = set()
    with torch.inference_mode():
        for step in range(14):
            # what the engine does: h_0 of every position in the target cache (all but the last)
            h0 = model.trunk.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
            proposer.observe(h0[observed:])
            observed = len(tokens) - 1
            k = 1 + step % depth if step % 5 else depth  # sometimes fewer heads than depth
            draft = proposer.propose(tokens, k).token_ids
            assert proposer.base == 0 or window < 128
            restarts.add(proposer.base)
            expected = recomputed_drafts(heads, h0, tokens, k, first=proposer.base)
            assert draft == expected, f"step {step}"
            # accept a prefix (all, some or none), then a recovered/bonus token
            accepted = [k, 0, 1, k - 1][step % 4]
            tokens += draft[:accepted] + [rng.randrange(vocab)]
    for j in range(depth):  # each head caches exactly the positions whose inputs are final
        assert proposer.cache[j].get_seq_length(j) == proposer.cached[j] - proposer.base
        assert proposer.cached[j] <= len(tokens) - 2 - j
    assert len(restarts) > (3 if window == 5 else 0)


def test_mtp_greedy_output_equals_plain(lively_checkpoint):
    """Regression guard for incremental MTP drafting: speculation never changes greedy output."""
    model = LoadedModel.load(str(lively_checkpoint))
    prompt = model.tokenizer.encode("def parse(text):\n    return", add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=40)
    outputs = {}
    for method in ("none", "mtp", "ngram+mtp"):
        spec = SpeculativeConfig(method=method, num_draft_tokens=2)
        engine = LocalEngine(EngineConfig(model="mem", speculative=spec), model)
        result = engine.generate(Request(prompt=prompt, params=params))
        outputs[method] = result.completions[0].token_ids
        if method != "none":
            assert result.metrics.verify_steps > 0
    assert outputs["mtp"] == outputs["none"] and outputs["ngram+mtp"] == outputs["none"]


def test_ngram_then_mtp_drafts_repeats_by_lookup_and_fresh_text_by_the_heads(tiny_checkpoint):
    """A suffix of two or more tokens seen before: the tokens that followed it. Otherwise (a
    one-token match included): the heads' drafts, which stay in step across lookup drafts. The
    lookup's draft length is learnt from which of its drafts came back in the tokens; the heads
    always draft with both."""
    from agent.engine.local.proposers import NgramProposer, NgramThenMTPProposer
    from agent.model import load_checkpoint

    model = lively(load_checkpoint(tiny_checkpoint), depth=2)
    hybrid = NgramThenMTPProposer(NgramProposer(2, 4), MTPProposer(model), start=3, adaptive=True)
    solo = MTPProposer(model)

    def grow(tokens: list[int], new: list[int]) -> list[int]:
        """The engine's step: the new tokens' positions go into the KV cache, h_0 observed."""
        longer = tokens + new
        with torch.inference_mode():
            h = model.trunk.model(torch.tensor([longer])).last_hidden_state[0]
        for proposer in (hybrid, solo):
            proposer.observe(h[len(tokens) - 1 : len(longer) - 1])
        return longer

    tokens = grow([5], [6, 7, 8, 9, 5, 6])  # [5, 6] occurred at 0: lookup drafts [7, 8, 9]
    assert hybrid.propose(tokens, 8).token_ids == [7, 8, 9]
    tokens = grow(tokens, [7, 8, 9, 11])  # all three accepted, then the verifier's own token
    with torch.inference_mode():
        fresh = hybrid.propose(tokens, 8).token_ids  # [9, 11] and [11] are new: the heads
        assert fresh == solo.propose(tokens, 2).token_ids and len(fresh) == 2
    assert hybrid.length == 5  # the lookup's draft was taken whole: it grew
    miss = next(t for t in range(model.vocab_size) if t != fresh[0])
    tokens = grow(tokens, [miss])  # the heads' first draft rejected
    with torch.inference_mode():
        again = hybrid.propose(tokens, 8).token_ids
        assert again == solo.propose(tokens, 2).token_ids and len(again) == 2  # not cut short
    assert hybrid.length == 5


def test_frequent_tokens_ranks_by_count_and_skips_unseen_ids():
    assert frequent_tokens([3, 3, 1, 2, 2, 2], vocab_size=5, size=2) == [2, 3]
    assert frequent_tokens([3, 3, 1, 2, 2, 2], vocab_size=5, size=10) == [2, 3, 1]


def test_draft_vocabulary_is_saved_with_the_heads_and_limits_the_drafts(tmp_path, tokenizer):
    from agent.model import load_checkpoint, save_checkpoint

    checkpoint = load_checkpoint(make_checkpoint(tmp_path / "plain", tokenizer, seed=0))
    assert checkpoint.heads.draft_vocab is None  # no draft_vocab.json: the whole vocabulary
    text = (STDLIB / "json" / "decoder.py").read_text()
    ids = frequent_tokens(tokenizer.encode(text), len(tokenizer), 40)
    checkpoint.heads.draft_vocab = torch.tensor(ids)
    folder = save_checkpoint(tmp_path / "fr", checkpoint.trunk, tokenizer, checkpoint.heads)
    model = LoadedModel.load(str(folder))
    assert model.checkpoint.heads.draft_vocab.tolist() == ids
    proposer = MTPProposer(model)
    tokens = tokenizer.encode(text[:300])
    with torch.inference_mode():
        proposer.observe(model.trunk.model(torch.tensor([tokens[:-1]])).last_hidden_state[0])
        assert set(proposer.propose(tokens, 2).token_ids) <= set(ids)

    (folder / "mtp" / DRAFT_VOCAB_FILE).write_text('{"token_ids": [1, 99999]}')
    with pytest.raises(EngineError, match="token ids below"):
        load_checkpoint(folder)


def test_cached_head_hidden_states_equal_the_layer_run_over_everything(tiny_checkpoint):
    """`forward_head_cached` (the written-out decoder layer) fed in chunks of 1-3 positions gives
    the hidden states of `forward_head` (the `transformers` layer) over the whole window."""
    from agent.model import load_checkpoint

    model = lively(load_checkpoint(tiny_checkpoint), depth=2)
    heads = model.checkpoint.heads
    torch.manual_seed(0)
    n = 13
    hidden = torch.randn(1, n, heads.trunk_config.hidden_size)
    ids = torch.randint(0, model.vocab_size, (1, n))
    positions = torch.arange(7, 7 + n)[None]  # a window need not start at position 0
    with torch.inference_mode():
        for k in range(2):
            whole = heads.forward_head(k, hidden, ids, positions)
            cache, parts, start = heads.new_cache(), [], 0
            for size in (1, 3, 2, 1, 3, 1, 2):
                part = slice(start, start + size)
                parts.append(
                    heads.forward_head_cached(
                        k, hidden[:, part], ids[:, part], positions[:, part], cache
                    )
                )
                start += size
            torch.testing.assert_close(torch.cat(parts, 1), whole, atol=1e-5, rtol=1e-5)


def test_int4_matrices_unpack_to_their_rounded_values():
    """`pack_int4` then `read_heads_state`: each value is its group's scale times an integer in
    [-8, 7], within half a step of the original; odd and even columns keep their places."""
    from safetensors.torch import save_file

    from agent.mtp import INT4_GROUP, pack_int4, read_heads_state

    torch.manual_seed(0)
    weight = torch.randn(6, 2 * INT4_GROUP)
    weight[2, 5] = 3.0  # a large value sets its group's scale
    packed = pack_int4({"w": weight, "norm": torch.ones(4)})
    assert packed["w"].dtype == torch.uint8 and packed["w"].shape == (6, INT4_GROUP)
    path = Path(tempfile.mkdtemp()) / "heads.safetensors"
    save_file(packed, str(path))
    back = read_heads_state(path)
    assert torch.equal(back["norm"], torch.ones(4))
    scales = packed["w.int4_scales"].float().repeat_interleave(INT4_GROUP, dim=1)
    q = back["w"] / scales
    assert torch.allclose(q, q.round(), atol=1e-4) and q.min() >= -8 and q.max() <= 7
    assert ((back["w"] - weight).abs() <= scales / 2 + 1e-6).all()
    assert back["w"][2, 5] == pytest.approx(3.0, rel=1e-3)

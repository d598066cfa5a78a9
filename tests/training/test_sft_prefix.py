"""SFT's shared-prefix batches: the same loss and gradients as running every row in full."""

from __future__ import annotations

import torch

from agent.chat_format import PAD
from agent.model import build_trunk
from training.stages import collate_sft, encode_conversation, sft_loss, shared_prefix_groups

SYSTEM = "You are a careful agent. " * 20  # a long shared opening, like the tool schemas


def _conversation(word: str, turns: int) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"do {word}"}]
    for turn in range(turns):
        messages.append({"role": "assistant", "content": f"{word} step {turn}"})
        messages.append({"role": "user", "content": f"ok {turn}"})
    messages.append({"role": "assistant", "content": f"{word} done"})
    return {"messages": messages}


def test_groups_share_the_opening_and_never_a_trained_token(tokenizer):
    rows = [_conversation(w, n) for w, n in (("alpha", 1), ("beta", 2), ("gamma", 0))]
    rows.append(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    )
    encoded = [encode_conversation(tokenizer, r, 4096) for r in rows]
    group_of, prefixes = shared_prefix_groups(encoded)
    assert group_of[0] == group_of[1] == group_of[2] != group_of[3]
    shared = prefixes[group_of[0]]
    assert shared >= 64
    assert prefixes[group_of[3]] == 0  # too short to share: plain batches
    for ids, mask in encoded[:3]:
        assert ids[:shared] == encoded[0][0][:shared]
        assert not any(mask[: shared + 1])


def test_shared_prefix_batch_equals_full_rows(tokenizer):
    torch.manual_seed(0)
    trunk = build_trunk("test", vocab_size=len(tokenizer))
    rows = [_conversation(w, n) for w, n in (("alpha", 1), ("beta", 3), ("gamma", 0))]
    encoded = [encode_conversation(tokenizer, r, 4096) for r in rows]
    _, prefixes = shared_prefix_groups(encoded)
    pad = tokenizer.convert_tokens_to_ids(PAD)
    grads = []
    losses = []
    for prefix in (0, prefixes[0]):
        trunk.zero_grad()
        b = collate_sft(encoded, prefix, pad, torch.device("cpu"))
        loss, extra = sft_loss(trunk, b)
        loss.backward()
        losses.append((loss.item(), extra["assistant_tokens"]))
        grads.append(torch.cat([p.grad.flatten() for p in trunk.parameters()]))
    assert losses[0][1] == losses[1][1]
    assert abs(losses[0][0] - losses[1][0]) < 1e-5
    assert torch.allclose(grads[0], grads[1], atol=1e-6)

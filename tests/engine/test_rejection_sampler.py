"""The rejection sampler as a pure function: the worked example, greedy, and exactness."""

from __future__ import annotations

import torch

from agent.engine.local.rejection_sampler import verify_greedy, verify_sampled


def test_greedy_accepts_the_matching_prefix_then_recovers():
    drafts = torch.tensor([4, 5, 6])
    assert verify_greedy(drafts, torch.tensor([4, 5, 9, 1])) == ([4, 5, 9], 2)
    assert verify_greedy(drafts, torch.tensor([4, 5, 6, 1])) == ([4, 5, 6, 1], 3)  # bonus
    assert verify_greedy(drafts, torch.tensor([0, 5, 6, 1])) == ([0], 0)
    assert verify_greedy(torch.tensor([], dtype=torch.long), torch.tensor([7])) == ([7], 0)


def test_worked_example_from_the_docstring():
    # p_1 puts 0.9 on a; p_2 puts 0.3 on b; with certain rejection the residual is (0.2, 0, 0.5)
    p = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    counts = torch.zeros(3)
    generator = torch.Generator().manual_seed(0)
    accepted_lengths = []
    for _ in range(4000):
        emitted, accepted = verify_sampled(torch.tensor([0, 1, 2]), None, p, generator)
        accepted_lengths.append(accepted)
        if accepted == 1:
            counts[emitted[1]] += 1
    assert set(accepted_lengths) <= {0, 1, 3}
    # at position 2, a recovered token is never the rejected draft b, and a:c is about 2:5
    assert counts[1] == 0
    assert abs(counts[0] / counts.sum() - 0.2 / 0.7) < 0.05


def test_emitted_tokens_follow_the_target_distribution():
    """Position by position, what comes out is distributed as p, whatever q was."""
    generator = torch.Generator().manual_seed(1)
    vocab, k, trials = 6, 2, 4000
    p = torch.softmax(torch.randn(k + 1, vocab, generator=generator) * 1.5, -1)
    q = torch.softmax(torch.randn(k, vocab, generator=generator) * 1.5, -1)
    first = torch.zeros(vocab)
    for _ in range(trials):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=generator)[0] for i in range(k)])
        emitted, _ = verify_sampled(drafts, q, p, generator)
        first[emitted[0]] += 1
    assert torch.allclose(first / trials, p[0], atol=0.03)


def test_deterministic_drafts_are_exact_too():
    generator = torch.Generator().manual_seed(2)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    first = torch.zeros(3)
    trials = 4000
    for _ in range(trials):
        emitted, _ = verify_sampled(torch.tensor([1]), None, p, generator)
        first[emitted[0]] += 1
    assert torch.allclose(first / trials, p[0], atol=0.03)

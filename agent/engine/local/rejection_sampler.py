"""The rejection sampler: keep the draft tokens the target model agrees with, exactly.

Vocabulary (used everywhere in `agent/engine`):

- *draft tokens* d_1..d_k: proposed by a proposer (n-gram lookup, MTP heads, a draft model),
  each drawn from a draft distribution q_i (a one-hot q_i when the proposer is deterministic).
- The *verify step* runs the target model once over [last token, d_1..d_k] and gets the target
  distributions p_1..p_{k+1} (`sampling.target_probs`): p_i is the distribution of the token at
  draft position i, p_{k+1} the one after the last draft.
- *accepted tokens*: the longest prefix d_1..d_a that survives. Draft d_i is accepted with
  probability min(1, p_i(d_i) / q_i(d_i)) (for a one-hot q: with probability p_i(d_i)).
- *recovered token*: at the first rejection (position a+1), a replacement drawn from the
  residual norm(max(0, p_{a+1} - q_{a+1})).
- *bonus token*: when all k drafts are accepted, one more token drawn from p_{k+1} for free.

Every verify step therefore emits a + 1 tokens (accepted + one recovered or bonus), and the
emitted sequence is distributed exactly as if each token had been sampled from p directly
(Leviathan et al. 2023; Chen et al. 2023): accepting with min(1, p/q) and resampling from the
normalised positive part of p - q reproduces p.

Greedy decoding is the limit case p = one-hot(argmax): a draft is accepted iff it equals the
target's argmax, and the recovered / bonus token is the argmax (`verify_greedy`, no randomness).

Worked example (k = 3, vocabulary {a, b, c}, deterministic drafts, so q_i = one-hot(d_i)):

    drafts          d = [a, b, c]
    target p_1      a: 0.9  b: 0.1  c: 0.0   u_1 = 0.42 <= p_1(a) = 0.9  -> accept a
    target p_2      a: 0.2  b: 0.3  c: 0.5   u_2 = 0.71 >  p_2(b) = 0.3  -> reject b
    residual        max(0, p_2 - onehot(b)) = (0.2, 0, 0.5) / 0.7 -> draws c (recovered)
    emitted         [a, c]: 1 accepted + 1 recovered; d_3 and p_3, p_4 are discarded

Had u_2 <= 0.3 and u_3 <= p_3(c), all three would be accepted and a bonus token drawn from p_4.

This module does not touch the KV cache: the caller crops the k - a rejected positions.
"""

from __future__ import annotations

import torch


def verify_greedy(draft_ids: torch.Tensor, target_argmax: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification.

    draft_ids:     [k]     d_1..d_k
    target_argmax: [k + 1] argmax of the target logits at each draft position and after the last
    returns (emitted tokens: accepted + recovered/bonus, number accepted)
    """
    k = draft_ids.shape[0]
    mismatch = (draft_ids != target_argmax[:k]).nonzero()
    accepted = int(mismatch[0, 0]) if mismatch.numel() else k
    emitted = draft_ids[:accepted].tolist() + [int(target_argmax[accepted])]
    return emitted, accepted


def verify_sampled(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Standard speculative sampling.

    draft_ids:    [k]             d_1..d_k
    draft_probs:  [k, vocab]      q_1..q_k, or None for deterministic drafts (q_i one-hot at d_i)
    target_probs: [k + 1, vocab]  p_1..p_{k+1}
    returns (emitted tokens: accepted + recovered/bonus, number accepted)
    """
    k = draft_ids.shape[0]
    positions = torch.arange(k, device=draft_ids.device)
    p_draft = target_probs[positions, draft_ids]  # [k] p_i(d_i)
    if draft_probs is None:
        accept_prob = p_draft
    else:
        q_draft = draft_probs[positions, draft_ids]  # [k] q_i(d_i) > 0: d_i was drawn from q_i
        accept_prob = (p_draft / q_draft).clamp(max=1.0)
    uniforms = torch.rand(k, generator=generator, device=accept_prob.device)  # [k]
    rejected = (uniforms >= accept_prob).nonzero()
    accepted = int(rejected[0, 0]) if rejected.numel() else k
    if accepted == k:  # bonus token
        last = torch.multinomial(target_probs[k], 1, generator=generator)
    else:  # recovered token from the residual
        p = target_probs[accepted]
        if draft_probs is None:
            residual = p.clone()
            residual[draft_ids[accepted]] = 0.0
        else:
            residual = (p - draft_probs[accepted]).clamp(min=0.0)
        if residual.sum() <= 0:  # p == q up to rounding: rejection had ~zero probability
            residual = p
        last = torch.multinomial(residual, 1, generator=generator)
    emitted = draft_ids[:accepted].tolist() + [int(last)]
    return emitted, accepted

"""`flywheel bench engine`'s step-level figures: one decode step, one verify step over 4 drafts,
one MTP head's drafting step, each timed many times on a warm KV cache, and the targets they are
held to. The report names them (b) a verify step against a decode step, (f) a head's step
against a decode step and (g) free text with the heads' drafts against plain decoding.

Speculation pays off only where a verify step over k drafts costs little more than one decode
step, and drafting from MTP heads only where a head's step costs a small fraction of one."""

from __future__ import annotations

import statistics
import time

VERIFY_VS_DECODE = 1.3
HEAD_VS_DECODE = 0.1  # one MTP head's drafting step against a trunk decode step
MTP_FREE_VS_PLAIN = 1.3  # free text with 2 heads' drafts against plain ...
MTP_ACCEPTANCE = 1.8  # ... at this mean acceptance length


def step_costs(model, prompt_ids: list[int], args) -> tuple[float, float]:
    """Median ms of one plain decode step and of one verify step over 4 drafts (warm cache).

    A decode step is what plain decoding does per token: forward 1 token, pick the argmax. A
    verify step is what speculation does per step: forward the last token + 4 drafts, greedy
    rejection sampling, crop the cache back. Both are interleaved and repeated.
    """
    import torch

    from agent.engine.local.batched import Part
    from agent.engine.local.rejection_sampler import verify_greedy

    cache = model.new_cache()
    decode_s: list[float] = []
    verify_s: list[float] = []
    with torch.inference_mode():
        model.forward(torch.tensor([prompt_ids]), cache, last_only=True)
        one = torch.tensor([[prompt_ids[-1]]])
        five = torch.tensor([prompt_ids[-5:]])
        for i in range(args.step_samples + 5):
            start = time.perf_counter()
            logits, _ = model.forward(one, cache)
            logits[:, -1].argmax(-1).tolist()
            cache.crop(-1)
            mid = time.perf_counter()
            logits, _ = model.forward_parts([Part(five, cache, alone=args.exact)])[0]
            verify_greedy(five[0, 1:], logits[0].argmax(-1))
            cache.crop(-5)
            end = time.perf_counter()
            if i >= 5:  # warm-up
                decode_s.append(mid - start)
                verify_s.append(end - mid)
    return statistics.median(decode_s) * 1000, statistics.median(verify_s) * 1000


def mtp_targets(model, rows: list[dict], prompt_ids: list[int], decode_ms: float, args) -> dict:
    """{mtp_head_cost, mtp_free_text}: the median ms of one head's drafting step (the proposer
    drafting 2 tokens after one new accepted position, halved) against a decode step, and free
    text decoded with the heads' drafts against plain, with its mean acceptance length."""
    import torch

    from agent.engine.local.proposers import MTPProposer

    proposer = MTPProposer(model)
    start = max(3, len(prompt_ids) - args.step_samples - 6)
    with torch.inference_mode():
        hidden = model.trunk.model(torch.tensor([prompt_ids])).last_hidden_state[0]
        proposer.observe(hidden[: start - 2])  # h_0 of every position but the last: known
        spent = []
        for n in range(start, len(prompt_ids)):  # one accepted token per step, as in decoding
            proposer.observe(hidden[n - 2 : n - 1])
            begin = time.perf_counter()
            proposer.propose(prompt_ids[:n], 2)
            spent.append(time.perf_counter() - begin)
    head_ms = statistics.median(spent[5:] or spent) * 1000 / proposer.max_depth
    free = {r["method"]: r for r in rows if r["workload"] == "free"}
    ratio, length = free["mtp"]["ratio_to_plain"], free["mtp"]["mean_acceptance_length"] or 0.0
    return dict(
        mtp_head_cost=dict(
            head_step_ms=head_ms,
            decode_step_ms=decode_ms,
            ratio=head_ms / decode_ms,
            target=f"<= {HEAD_VS_DECODE}",
            passed=head_ms / decode_ms <= HEAD_VS_DECODE,
            heads=proposer.max_depth,
            draft_vocab=None if proposer.draft_vocab is None else len(proposer.draft_vocab),
        ),
        mtp_free_text=dict(
            mtp_tokens_per_s=free["mtp"]["tokens_per_s"],
            plain_tokens_per_s=free["plain"]["tokens_per_s"],
            ratio=ratio,
            mean_acceptance_length=length,
            target=f">= {MTP_FREE_VS_PLAIN} at acceptance length >= {MTP_ACCEPTANCE}",
            passed=ratio >= MTP_FREE_VS_PLAIN and length >= MTP_ACCEPTANCE,
        ),
    )


def verify_target(decode_ms: float, verify_ms: float, context_tokens: int, args) -> dict:
    """(b): a verify step over 4 drafts against a decode step, with pass/fail."""
    ratio = verify_ms / decode_ms
    return dict(
        decode_step_ms=decode_ms,
        verify_step_ms=verify_ms,
        ratio=ratio,
        target=f"<= {VERIFY_VS_DECODE}",
        passed=ratio <= VERIFY_VS_DECODE,
        samples=args.step_samples,
        context_tokens=context_tokens,
    )

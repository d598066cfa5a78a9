"""Dr. GRPO with truncated importance weights: advantages, token masks and the policy loss.

Pure functions over plain lists and tensors; `policy.py` runs the model, this module decides
what the gradient is.

Advantage (Dr. GRPO, Liu et al. 2025): A_i = r_i - mean(r_group). No division by the group's
standard deviation and no 1/|o_i| length normalisation: the loss is a sum over tokens divided by
a constant (`norm` = trajectories in the batch x `loss_tokens`), so long and short answers weigh
each token alike. A group whose rewards are all equal has no signal (every A_i = 0) and is
skipped before it costs a forward pass.

Masks: a row is one model turn, `prompt + output`; the model at position j predicts token j+1,
so `input_ids = seq[:-1]`, `targets = seq[1:]`, and the loss mask is 1 exactly on the targets
that are the turn's sampled output tokens. Prompt tokens (the task, tool results, earlier turns
as the chat template re-rendered them) never carry loss. When a turn's prompt starts with the
previous turn's whole row (its prompt and its sampled output, token for token: the chat template
re-rendered the earlier answer to the same ids), the two share one row: a causal model scores
the earlier output identically inside the longer sequence, so an agent's turns cost one forward
pass over the conversation instead of one per turn, each over its whole prompt. A *truncated* trajectory (a limit cut it
off) keeps its place in its group's baseline but its rows get mask 0.

Off-policy correction: tokens were sampled by the policy mu of some earlier version; the trainer
scores them with its current policy pi. Per token,

    w   = min(pi_prox / mu, is_cap)          truncated importance weight (no gradient)
    r   = pi / pi_prox                       PPO ratio (value 1 on the first update of a batch)
    s   = min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)     clip-higher when high > low
    loss = -sum(mask * w * s) / norm

where pi_prox is the policy at the start of this batch's update (its log-probs detached). With one
update per batch, r = 1 and the gradient is w * A * grad log pi: REINFORCE with a group baseline,
importance-corrected for staleness. Clipping acts from the second mini-batch update on.

Worked example (tests/training/test_rl_grpo.py checks it): a group with rewards [1, 0, 0, 1] has
mean 0.5, so A = [+0.5, -0.5, -0.5, +0.5]. Take one output token from each of the first two
trajectories and loss_tokens = 1 (norm = 2 trajectories x 1):
- trajectory 0's token was sampled with mu = 0.1 and has pi = 0.5 now: pi/mu = 5, truncated to
  w = 2 (is_cap 2); its term is -2 x 0.5 = -1.0;
- trajectory 1's token: mu = 0.5, pi = 0.25: w = 0.5; its term is -0.5 x -0.5 = +0.25.
loss = (-1.0 + 0.25) / 2 = -0.375; d loss / d log pi = [-0.5, +0.125] (a step raises the first
token's probability and lowers the second's). Of the two raw weights [5, 0.5] one was truncated;
the effective sample size is (5 + 0.5)^2 / (2 x (25 + 0.25)) = 0.599.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.rl.trajectory import Trajectory, Turn

EPS = 1e-8


def group_advantages(rewards: list[float]) -> list[float]:
    """Dr. GRPO: reward minus the group mean (no std normalisation)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def zero_variance(rewards: list[float]) -> bool:
    return not rewards or max(rewards) - min(rewards) < EPS


@dataclass
class Row:
    """One model turn as a training sequence (lists; `collate` makes tensors)."""

    input_ids: list[int]  # [seq] prompt + output, minus the last token
    targets: list[int]  # [seq] the next token at each position
    mask: list[float]  # [seq] 1.0 where the target is a sampled output token that carries loss
    old_logprobs: list[float]  # [seq] log mu(target) on masked positions, 0 elsewhere
    advantage: float
    staleness: int  # trainer version - the turn's policy version


def turn_row(
    prompt_ids: list[int],
    output_ids: list[int],
    logprobs: list[float],
    advantage: float,
    staleness: int,
    trainable: bool = True,
) -> Row:
    """prompt [P] + output [O] -> a row of length P + O - 1 whose last O targets are the output."""
    turn = Turn(list(prompt_ids), list(output_ids), list(logprobs), -staleness)
    (row,) = trajectory_rows(Trajectory("", 0, [turn]), advantage, 0, trainable)
    return row


def group_rows(trajectories: list[Trajectory], version: int) -> tuple[list[Row], dict[str, int]]:
    """Rows of one admitted group: advantages from every trajectory's reward; truncated ones
    masked. Returns (rows, counts of trajectories by fate)."""
    rewards = [t.reward for t in trajectories]
    advantages = group_advantages([float(r) for r in rewards])
    rows: list[Row] = []
    counts = {"trained": 0, "truncated": 0}
    for traj, adv in zip(trajectories, advantages, strict=True):
        trainable = not traj.truncated
        counts["trained" if trainable else "truncated"] += 1
        rows += trajectory_rows(traj, adv, version, trainable)
    return rows, counts


def trajectory_rows(traj: Trajectory, advantage: float, version: int, trainable: bool) -> list[Row]:
    """The rows of one trajectory: consecutive turns share a row while each turn's prompt
    starts with the row so far (see the module docstring), else a new row starts."""
    rows: list[Row] = []
    seq: list[int] = []  # the row so far: every token
    loss: list[float] = []  # per token of seq: 1.0 where it is a sampled output token
    old: list[float] = []  # per token of seq: its sampling log-probability (0 elsewhere)
    oldest = version  # the oldest policy version in the row

    def close() -> None:
        if seq:
            rows.append(Row(seq[:-1], seq[1:], loss[1:], old[1:], advantage, version - oldest))

    for turn in traj.turns:
        if not turn.output_ids:
            continue
        prompt = turn.prompt_ids
        if not (seq and len(prompt) >= len(seq) and prompt[: len(seq)] == seq):
            close()
            seq, loss, old, oldest = [], [], [], version
        new_prompt = prompt[len(seq) :]
        seq = seq + list(new_prompt) + list(turn.output_ids)
        loss = loss + [0.0] * len(new_prompt) + [1.0 if trainable else 0.0] * len(turn.output_ids)
        old = old + [0.0] * len(new_prompt) + [float(x) for x in turn.logprobs]
        oldest = min(oldest, turn.version)
    close()
    return rows


@dataclass
class Batch:
    input_ids: torch.Tensor  # [rows, seq] int64, right-padded
    attention_mask: torch.Tensor  # [rows, seq] int64
    targets: torch.Tensor  # [rows, seq] int64 (pad where none)
    mask: torch.Tensor  # [rows, seq] float32
    old_logprobs: torch.Tensor  # [rows, seq] float32
    advantages: torch.Tensor  # [rows, seq] float32 (the row's advantage on every position)
    staleness: torch.Tensor  # [rows] int64


def collate(rows: list[Row], pad_id: int, device: str | torch.device = "cpu") -> Batch:
    length = max(len(r.input_ids) for r in rows)

    def pad(values: list, fill) -> list:
        return list(values) + [fill] * (length - len(values))

    return Batch(
        input_ids=torch.tensor([pad(r.input_ids, pad_id) for r in rows], device=device),
        attention_mask=torch.tensor([pad([1] * len(r.input_ids), 0) for r in rows], device=device),
        targets=torch.tensor([pad(r.targets, pad_id) for r in rows], device=device),
        mask=torch.tensor([pad(r.mask, 0.0) for r in rows], device=device),
        old_logprobs=torch.tensor([pad(r.old_logprobs, 0.0) for r in rows], device=device),
        advantages=torch.tensor(
            [[r.advantage] * length for r in rows], dtype=torch.float32, device=device
        ),
        staleness=torch.tensor([r.staleness for r in rows], device=device),
    )


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    norm: float,
    *,
    prox_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss above (a scalar to minimise) and its diagnostics.

    logprobs:      [...] log pi(target) under the policy being trained (with gradient)
    old_logprobs:  [...] log mu(target), the sampling policy's
    advantages:    [...] A of the token's trajectory
    mask:          [...] 1.0 where the token carries loss
    prox_logprobs: [...] log pi_prox (detached); None = logprobs.detach() (first update)
    Diagnostics (sums over masked tokens, to be pooled by the caller): tokens, is_weight,
    is_weight_sq, truncated, clipped, kl (k3 estimate of KL(mu || pi)).
    """
    prox = logprobs.detach() if prox_logprobs is None else prox_logprobs.detach()
    mask = mask.float()
    log_w = (prox - old_logprobs).masked_fill(mask == 0, 0.0)
    raw_w = log_w.exp()  # pi_prox / mu
    w = raw_w.clamp(max=is_cap)
    ratio = (logprobs - prox).masked_fill(mask == 0, 0.0).exp()
    surrogate = ratio * advantages
    if clip_low or clip_high:
        low, high = 1.0 - clip_low, 1.0 + (clip_high or clip_low)
        clipped = ratio.clamp(low, high) * advantages
        clipped_active = (clipped < surrogate) & (mask > 0)
        surrogate = torch.minimum(surrogate, clipped)
    else:
        clipped_active = torch.zeros_like(mask, dtype=torch.bool)
    loss = -(mask * w * surrogate).sum() / norm
    with torch.no_grad():
        delta = (logprobs.detach() - old_logprobs).masked_fill(mask == 0, 0.0)
        stats = {
            "tokens": mask.sum(),
            "is_weight": (mask * raw_w).sum(),
            "is_weight_sq": (mask * raw_w * raw_w).sum(),
            "truncated": (mask * (raw_w > is_cap).float()).sum(),
            "clipped": clipped_active.float().sum(),
            "kl": (mask * (delta.exp() - delta - 1.0)).sum(),
        }
    return loss, stats


def effective_sample_size(weight_sum: float, weight_sq_sum: float, tokens: float) -> float:
    """(sum w)^2 / (n sum w^2), in (0, 1]: 1 when every weight is equal (on-policy)."""
    if tokens <= 0 or weight_sq_sum <= 0:
        return 1.0
    return weight_sum * weight_sum / (tokens * weight_sq_sum)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    prob_all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_fail *= 1.0 - k / i
    return 1.0 - prob_all_fail

"""An RL run's curves, as PNG files beside its metrics (matplotlib, no display needed).

    rewards.png    reward mean +- spread, rollout pass@1 and pass@G per update; held-out pass@1
                   and pass@k at each evaluation
    lengths.png    length growth (turns and output tokens per trajectory) and diversity collapse
                   (distinct final diffs per group, sampled-token entropy) per update
    outcomes.png   how the held-out samples ended at the first and the last evaluation: passed,
                   error, or the harness's stop reason for an unsolved one (the failure modes)

Read from the records of metrics.jsonl (run.py writes them); nothing here computes a metric.
"""

from __future__ import annotations

from pathlib import Path

from training.rl.recipe import RLRecipe


def plot(records: list[dict], folder: Path, recipe: RLRecipe) -> None:
    """The run's curves (the module docstring) in `folder`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train" and "reward_mean" in r]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not train and not evals:
        return
    plot_rewards(plt, train, evals, folder / "rewards.png", recipe)
    if train:
        plot_lengths(plt, train, folder / "lengths.png", recipe)
    if any("outcomes" in r for r in evals):
        plot_outcomes(plt, [r for r in evals if "outcomes" in r], folder / "outcomes.png", recipe)


def plot_rewards(plt, train: list[dict], evals: list[dict], path: Path, recipe: RLRecipe) -> None:
    """Reward mean +- spread, pass@1 and pass@G per update; held-out pass@1 / pass@k points."""
    g, k = recipe.group_size, recipe.eval_samples
    fig, (ax_r, ax_p) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        steps = [r["step"] for r in train]
        mean = [r["reward_mean"] for r in train]
        std = [r["reward_std"] for r in train]
        ax_r.plot(steps, mean, label="reward mean")
        ax_r.fill_between(
            steps,
            [m - s for m, s in zip(mean, std, strict=True)],
            [m + s for m, s in zip(mean, std, strict=True)],
            alpha=0.2,
        )
        ax_p.plot(steps, [r["pass@1"] for r in train], label="rollout pass@1")
        ax_p.plot(steps, [r[f"pass@{g}"] for r in train], label=f"rollout pass@{g}")
    if evals:
        steps = [r["step"] for r in evals]
        ax_p.plot(steps, [r["pass@1"] for r in evals], "o--", label="held-out pass@1")
        ax_p.plot(steps, [r[f"pass@{k}"] for r in evals], "s--", label=f"held-out pass@{k}")
    ax_r.set(xlabel="update", ylabel="reward", title=f"{recipe.name}: reward")
    ax_p.set(xlabel="update", ylabel="share of tasks", title="pass@k", ylim=(-0.02, 1.02))
    for ax in (ax_r, ax_p):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_lengths(plt, train: list[dict], path: Path, recipe: RLRecipe) -> None:
    """Length growth (turns and output tokens per trajectory) and diversity collapse (distinct
    final diffs per group, sampled-token entropy) per update; two y axes per panel."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = (
        (
            f"{recipe.name}: length per trajectory",
            ("turns_mean", "model turns"),
            ("output_tokens_mean", "output tokens"),
        ),
        (
            "diversity",
            ("distinct_diff_fraction", "distinct final diffs / group size"),
            ("rollout_entropy", "sampled-token entropy (nats)"),
        ),
    )
    for ax, (title, *curves) in zip(axes, panels, strict=True):
        for axis, (key, label), color in zip((ax, ax.twinx()), curves, ("C0", "C1"), strict=True):
            points = [(r["step"], r[key]) for r in train if key in r]
            if points:
                axis.plot(*zip(*points, strict=True), "o-", color=color, markersize=3)
            axis.set_ylabel(label, color=color)
        ax.set(xlabel="update", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_outcomes(plt, evals: list[dict], path: Path, recipe: RLRecipe) -> None:
    """Share of held-out samples per outcome, first evaluation beside the last."""
    first, last = evals[0], evals[-1]
    kinds = sorted(set(first["outcomes"]) | set(last["outcomes"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(kinds)), 4))
    width = 0.4
    for shift, record, label in ((-width / 2, first, "before"), (width / 2, last, "after")):
        total = max(1, sum(record["outcomes"].values()))
        shares = [record["outcomes"].get(k, 0) / total for k in kinds]
        ax.bar(
            [i + shift for i in range(len(kinds))],
            shares,
            width,
            label=f"{label} (step {record['step']})",
        )
    ax.set_xticks(range(len(kinds)), kinds, rotation=20)
    ax.set(ylabel="share of held-out samples", title=f"{recipe.name}: how samples ended")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

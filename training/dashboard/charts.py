"""Panel series -> inline SVG, drawn with matplotlib on the server (no scripts in the page).

Series kinds (data.py builds them):
    stacked_bars  {"x": [label], "stacks": {name: [count]}, "ylabel"}
    lines         {"x": [label], "lines": {name: [value | None]}, "ylabel", "ylim"?, "right"?}
                  ("right": {name: [value]} on a second axis)
    curves        {"panels": {metric: {run label: ([step], [value])}}}: small multiples
    bars          {"x": [label], "y": [value | None], "colors": [status], "ylabel"}
"""

from __future__ import annotations

import io
from typing import Any

_STATUS_COLORS = {
    "promoted": "#2a7d2a",
    "completions": "#c07a12",  # the registry's completion lane
    "candidate": "#3b6fb6",
    "retired": "#999999",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "svg.hashsalt": "flywheel",
        }
    )
    return plt


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    _plt().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # inline: no XML prolog or doctype


def _ticks(ax, x: list[str]) -> None:
    step = max(1, len(x) // 8)
    ax.set_xticks(
        range(0, len(x), step), [x[i] for i in range(0, len(x), step)], rotation=20, ha="right"
    )


def render(series: dict[str, Any]) -> str | None:
    """The SVG for a panel's series, or None when it has none."""
    if not series:
        return None
    plt = _plt()
    kind = series["kind"]
    if kind == "curves":
        names = list(series["panels"])
        fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 2.6), squeeze=False)
        for ax, name in zip(axes[0], names, strict=True):
            for label, (xs, ys) in series["panels"][name].items():
                ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
            ax.set_title(name)
            ax.set_xlabel(series.get("xlabel", "step"))
        axes[0][0].legend(fontsize=7)
        return _svg(fig)
    fig, ax = plt.subplots(figsize=(6, 2.6))
    x = series["x"]
    if kind == "stacked_bars":
        bottom = [0] * len(x)
        for name, values in series["stacks"].items():
            ax.bar(range(len(x)), values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.legend(fontsize=7)
    elif kind == "lines":
        for name, values in series["lines"].items():
            pts = [(i, v) for i, v in enumerate(values) if v is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        if series.get("ylim"):
            ax.set_ylim(*series["ylim"])
        if series.get("right"):
            right = ax.twinx()
            for name, values in series["right"].items():
                pts = [(i, v) for i, v in enumerate(values) if v is not None]
                if pts:
                    right.plot(*zip(*pts, strict=True), marker="s", color="#b55", label=name)
            right.set_ylabel(", ".join(series["right"]))
            right.spines["right"].set_visible(True)
        ax.legend(fontsize=7, loc="upper left")
    elif kind == "bars":
        ys = [v if v is not None else 0 for v in series["y"]]
        colors = [_STATUS_COLORS.get(c, "#3b6fb6") for c in series["colors"]]
        ax.bar(range(len(x)), ys, color=colors)
        for i, v in enumerate(series["y"]):
            ax.text(i, ys[i], "-" if v is None else f"{v:.2f}", ha="center", va="bottom")
    ax.set_ylabel(series.get("ylabel", ""))
    _ticks(ax, x)
    return _svg(fig)

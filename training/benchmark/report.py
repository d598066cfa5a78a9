"""Reports of a `flywheel bench agent` run: a plain-text table and a self-contained HTML page.

The HTML page holds its plots as inline SVG (matplotlib, Agg backend): it opens offline, from a
file, with no scripts. Plots: pass@k per source with 95% bootstrap intervals, the distribution of
model turns and tokens per sample, the lint delta per sample, and the verifier's verdicts.

What it does not do: compute anything (result.py does); compare two runs (result.py
`compare`).
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

from agent.stats import Interval
from training.benchmark.result import BenchmarkResult, iter_groups

# metric -> (column title, digits)
_COLUMNS = {
    "lint_delta": ("lint Δ", 2),
    "tokens": ("tokens", 0),
    "steps": ("turns", 1),
    "wall_s": ("wall s", 1),
    "invalid_calls": ("invalid calls", 2),
    "final_chars": ("final chars", 0),
}


def _fmt(interval: Interval | None, digits: int, ci: bool = True) -> str:
    if interval is None:
        return "-"
    text = f"{interval.mean:.{digits}f}"
    if ci:
        text += f" [{interval.lo:.{digits}f}, {interval.hi:.{digits}f}]"
    return text


def table_rows(result: BenchmarkResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per group (overall, then each source)."""
    ks = [k for k in result.config["ks"]]
    header = ["group", "tasks", *(f"pass@{k}" for k in ks), *(c for c, _ in _COLUMNS.values())]
    rows = []
    for g in iter_groups(result):
        s = result.summary[g]
        row = [g, str(result.shape[g]["tasks"])]
        row += [_fmt(s.get(f"pass@{k}"), 3) for k in ks]
        row += [_fmt(s.get(m), d, ci=m == "lint_delta") for m, (_, d) in _COLUMNS.items()]
        rows.append(row)
    return header, rows


def shape_rows(result: BenchmarkResult) -> tuple[list[str], list[list[str]]]:
    header = ["group", "tasks", "median changed lines", "median prompt chars", "median files"]
    rows = []
    for g in iter_groups(result):
        sh = result.shape[g]
        rows.append(
            [g, str(sh["tasks"])]
            + [
                "-" if sh[k] is None else f"{sh[k]:g}"
                for k in ("median_changed_lines", "median_prompt_chars", "median_workspace_files")
            ]
        )
    return header, rows


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def render_table(result: BenchmarkResult) -> str:
    """The result as the terminal shows it: scores with 95% CIs, then the task-set shape."""
    c = result.config
    head = (
        f"model {result.model} ({result.model_version}); {c['samples']} sample(s)/task, "
        f"seed {c['seed']}, temperature {c['temperature']}; {result.seconds:.0f} s"
        + (f" ({result.reused} samples reused from an earlier run)" if result.reused else "")
    )
    return "\n\n".join(
        [head, _text_table(*table_rows(result)), "task set", _text_table(*shape_rows(result))]
    )


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline in HTML


def plots(result: BenchmarkResult) -> dict[str, str]:
    """Title -> inline SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    groups = list(iter_groups(result))
    ks = result.config["ks"]
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
        iv = [result.summary[g].get(f"pass@{k}") for g in groups]
        means = [v.mean if v else 0 for v in iv]
        err = [
            [v.mean - v.lo if v else 0 for v in iv],
            [v.hi - v.mean if v else 0 for v in iv],
        ]
        xs = [x + i * width for x in range(len(groups))]
        ax.bar(xs, means, width, yerr=err, capsize=3, label=f"pass@{k}")
    ax.set_xticks([x + width * (len(ks) - 1) / 2 for x in range(len(groups))], groups)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of tasks")
    ax.legend(loc="upper right", fontsize=8)
    out["pass@k by source (95% bootstrap CI)"] = _svg(fig)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(9, 2.6))
    for ax, (attr, title) in zip(
        axes,
        (("steps", "model turns"), ("tokens", "tokens"), ("lint_delta", "lint Δ")),
        strict=True,
    ):
        values = [getattr(s, attr) for s in result.samples if getattr(s, attr) is not None]
        if values:
            ax.hist(values, bins=min(20, max(len(set(values)), 1)))
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{title} per sample", fontsize=9)
    out["efficiency and quality per sample"] = _svg(fig)
    plt.close(fig)

    verdicts = Counter(
        s.verdict.split(":")[0] + (": timeout" if "timed out" in s.verdict else "")
        for s in result.samples
    )
    stops = Counter(s.stop_reason for s in result.samples)
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.4))
    for ax, counts, title in ((axes[0], verdicts, "verifier"), (axes[1], stops, "harness stop")):
        names = sorted(counts)
        ax.barh(names, [counts[n] for n in names])
        ax.set_title(title, fontsize=9)
    out["verdicts and stop reasons (samples)"] = _svg(fig)
    plt.close(fig)
    return out


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>flywheel bench agent: {{ r.model }}</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.fail { color: #a00; } .pass { color: #070; }
figure { margin: 1em 0; } figcaption { font-weight: 600; }
</style></head><body>
<h1>flywheel bench agent</h1>
<p>model <b>{{ r.model }}</b> ({{ r.model_version }}) &middot; {{ r.config.samples }} sample(s)
per task &middot; seed {{ r.config.seed }} &middot; temperature {{ r.config.temperature }}
&middot; {{ "%.0f"|format(r.seconds) }} s{% if r.reused %} ({{ r.reused }} samples reused from
an earlier run){% endif %}</p>
<h2>Scores (mean [95% bootstrap CI] over tasks)</h2>
<table><tr>{% for h in header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table>
<h2>Task set</h2>
<table><tr>{% for h in shape_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in shape %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table>
{% for title, svg in plots.items() %}<figure><figcaption>{{ title }}</figcaption>
{{ svg|safe }}</figure>{% endfor %}
<h2>Tasks</h2>
<table><tr><th>task</th><th>source</th><th>passed</th>
{% for k in r.config.ks %}<th>pass@{{ k }}</th>{% endfor %}<th>verdicts</th></tr>
{% for t in r.tasks %}<tr><td>{{ t.task_id }}</td><td>{{ t.source }}</td>
<td class="{{ 'pass' if t.correct else 'fail' }}">{{ t.correct }}/{{ t.n }}</td>
{% for k in r.config.ks %}<td>{{ t.scores.get('pass@' ~ k, '-') }}</td>{% endfor %}
<td style="text-align:left">{{ t.verdicts|join('; ')|truncate(160) }}</td></tr>{% endfor %}
</table>
</body></html>
"""


def render_html(result: BenchmarkResult) -> str:
    import jinja2

    header, rows = table_rows(result)
    shape_header, shape = shape_rows(result)
    env = jinja2.Environment(autoescape=True)
    return env.from_string(_PAGE).render(
        r=result,
        header=header,
        rows=rows,
        shape_header=shape_header,
        shape=shape,
        plots=plots(result),
    )


def write_html(result: BenchmarkResult, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result))
    return path

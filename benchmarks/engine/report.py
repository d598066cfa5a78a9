"""`flywheel bench engine`'s rows and printed report.

A row is one (workload, method): the weights it decoded with, tokens/s, its ratio to `plain` and
to the matching peer (`PEER_OF`), the mean acceptance length, and whether its tokens equal
`plain`'s (if not, the share that does). The printed report is the table of rows, then each
target with pass/fail, then notes on the peers and the model.
"""

from __future__ import annotations

import statistics

from benchmarks.engine.peers import same_share

PEER_OF = {
    "plain": "hf-greedy",
    "ngram": "hf-prompt-lookup",
    "mtp": "hf-greedy",
    "ngram+mtp": "hf-prompt-lookup",
    "draft": "hf-assisted",
}

WORKLOADS = ("apply", "completion", "free")
DECODING = ("apply", "free")  # the workloads whose tokens/s measure decoding, not a prefill


def summarize(
    weights: dict[str, str], items: list[dict], outputs: dict, times: dict, tokenizer
) -> list[dict]:
    """One row per (workload, method) for every method in `weights` (method -> the weights it
    decoded with), from its outputs[(method, prompt)] = (token ids, metrics) and
    times[(method, prompt)] = seconds of each repeat (the best counts)."""
    rows = []
    for workload in WORKLOADS:
        indices = [i for i, item in enumerate(items) if item["workload"] == workload]
        if not indices:
            continue
        stats = {}
        for name, weight in weights.items():
            tokens = sum(len(outputs[(name, i)][0]) for i in indices)
            seconds = sum(min(times[(name, i)]) for i in indices)
            metrics = [outputs[(name, i)][1] for i in indices]
            steps = sum(m.get("verify_steps", 0) for m in metrics)
            accepted = sum(m.get("drafts_accepted", 0) for m in metrics)
            mine = [outputs[(name, i)][0] for i in indices]
            plain = [outputs[("plain", i)][0] for i in indices]
            expected = [
                similarity(tokenizer.decode(outputs[(name, i)][0]), items[i]["expected"])
                for i in indices
                if items[i].get("expected") is not None
            ]
            stats[name] = dict(
                workload=workload,
                method=name,
                weights=weight,
                tokens=tokens,
                seconds=seconds,
                tokens_per_s=tokens / seconds if seconds else 0.0,
                mean_acceptance_length=(accepted + steps) / steps if steps else None,
                identical_to_plain=mine == plain,
                # tokens equal to plain's before the first difference (peers.same_share)
                same_share=same_share(mine, plain),
                # apply: how close the output is to the right updated file (0..1); a speedup
                # on output that does not copy the file is no fast apply
                similarity_to_expected=statistics.mean(expected) if expected else None,
            )
        for name, row in stats.items():
            row["ratio_to_plain"] = row["tokens_per_s"] / stats["plain"]["tokens_per_s"]
            peer = PEER_OF.get(name)
            row["peer"] = peer
            row["ratio_to_peer"] = (
                row["tokens_per_s"] / stats[peer]["tokens_per_s"] if peer in stats else None
            )
            rows.append(row)
    return rows


def similarity(output: str, expected: str) -> float:
    """difflib's ratio of `output` to the same number of characters of `expected`."""
    import difflib

    return difflib.SequenceMatcher(None, output, expected[: len(output)], autojunk=False).ratio()


def overall(rows: list[dict], method: str) -> float:
    """Tokens per second of `method` over the decoding workloads."""
    mine = [r for r in rows if r["method"] == method and r["workload"] in DECODING]
    return sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)


def print_report(report: dict) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough for the table's 8 columns
        console = Console(width=120)
    print_rows(console, report)
    print_targets(console, report["targets"])
    print_notes(console, report)


def print_rows(console, report: dict) -> None:
    """The table of rows, with a line under it for each peer that did not run."""
    from rich.table import Table

    model = report["model"]
    title = (
        f"flywheel bench engine — {model['version']} ({model['parameters'] / 1e6:.1f}M params, "
        f"{report['settings']['dtype']})"
    )
    table = Table(title=title)
    columns = ["workload", "method", "weights", "tokens/s", "× plain", "× peer", "accept len"]
    for column in [*columns, "same"]:
        left = column in ("workload", "method", "weights")
        table.add_column(column, justify="left" if left else "right")
    for row in report["rows"]:
        peer = f"{row['ratio_to_peer']:.2f} ({row['peer']})" if row["ratio_to_peer"] else "-"
        length = row["mean_acceptance_length"]
        same = "yes" if row["identical_to_plain"] else f"NO ({row['same_share']:.0%})"
        table.add_row(
            row["workload"],
            row["method"],
            row["weights"],
            f"{row['tokens_per_s']:.1f}",
            f"{row['ratio_to_plain']:.2f}",
            peer,
            f"{length:.2f}" if length else "-",
            same,
        )
    missing = [p for p in report.get("peers", []) if p["status"] != "ran"]
    for p in missing:  # the reason is printed under the table (one line is too wide for a cell)
        table.add_row("-", p["method"], "-", p["status"], "-", "-", "-", "-")
    console.print(table)
    notes: dict[tuple[str, str], list[str]] = {}  # (status, reason) -> methods
    for p in missing:
        notes.setdefault((p["status"], p["reason"]), []).append(p["method"])
    for (status, reason), names in notes.items():
        console.print(f"{', '.join(names)}: {status}: {reason}", soft_wrap=True)


def _verdict(target: dict) -> str:
    return f"(target {target['target']}: {'pass' if target['passed'] else 'FAIL'})"


def print_targets(console, targets: dict) -> None:
    """One line per target: the two figures compared, their ratio, pass or FAIL."""
    a = targets.get("plain_vs_hf_greedy")
    if a:
        console.print(
            f"(a) plain vs HF generate greedy: {a['plain_tokens_per_s']:.1f} vs "
            f"{a['hf_greedy_tokens_per_s']:.1f} tokens/s = {a['ratio']:.2f}× {_verdict(a)}"
        )
    b = targets["verify4_vs_decode_step"]
    console.print(
        f"(b) verify step over 4 drafts vs one decode step: {b['verify_step_ms']:.2f} vs "
        f"{b['decode_step_ms']:.2f} ms = {b['ratio']:.2f}× {_verdict(b)}"
    )
    if "mtp_head_cost" in targets:
        h, f = targets["mtp_head_cost"], targets["mtp_free_text"]
        console.print(
            f"(f) one MTP head's drafting step vs one decode step: {h['head_step_ms']:.2f} vs "
            f"{h['decode_step_ms']:.2f} ms = {h['ratio']:.3f}× {_verdict(h)}"
        )
        console.print(
            f"(g) free text with MTP drafts vs plain: {f['ratio']:.2f}× at acceptance length "
            f"{f['mean_acceptance_length']:.2f} {_verdict(f)}"
        )
    serving = [
        ("rl_group", "(c) an RL group of {samples} samples in one batch vs one by one", "tokens/s",
         "batched_tokens_per_s", "one_by_one_tokens_per_s"),
        ("agent_turn", "(d) an agent's second turn, time to first token, cache warm vs cold", "ms",
         "warm_ttft_ms", "cold_ttft_ms"),
        ("concurrent_completions", "(e) {completions} concurrent completions vs one alone, p50",
         "ms", "concurrent_p50_ms", "alone_p50_ms"),
    ]  # fmt: skip
    for key, label, unit, mine, theirs in serving:
        t = targets.get(key)
        if t:
            same = t.get("greedy_identical", t.get("greedy_rows_identical"))
            console.print(
                f"{label.format(**t)}: {t[mine]:.1f} vs {t[theirs]:.1f} {unit} = "
                f"{t['ratio']:.2f}× {_verdict(t)}"
                + ("" if same is None else f"; greedy outputs identical: {'yes' if same else 'NO'}")
            )
    cold = targets.get("cold_completion")
    if cold:
        console.print(
            f"(h) a cold completion ({cold['prompt_tokens']} prompt tokens, "
            f"{cold['max_tokens']} new) vs llama.cpp's: {cold['plain_ms']:.0f} vs "
            f"{cold['llamacpp_ms']:.0f} ms = {cold['ratio']:.2f}× {_verdict(cold)}"
        )


def print_notes(console, report: dict) -> None:
    """How faithful plain's apply output is, what each external peer ran, and the settings."""
    for row in report["rows"]:
        if row["method"] == "plain" and row.get("similarity_to_expected") is not None:
            console.print(
                f"{row['workload']}: plain output vs the expected updated file: similarity "
                f"{row['similarity_to_expected']:.2f} (1.00 = a faithful copy)"
            )
    for p in report.get("peers", []):
        if p["status"] == "ran":
            console.print(
                f"{p['method']}: {p['version']}, {p['weights']} ({p['source']}: {p['model']}), "
                f"started in {p['load_s']:.0f} s"
            )
    if report["model"]["note"]:
        console.print(f"note: {report['model']['note']}")
    settings = report["settings"]
    console.print(
        f"{settings['max_tokens']} tokens per generation, {settings['timing']}, "
        f"{report['machine']['torch_threads']} torch threads"
    )

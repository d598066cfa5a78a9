"""`flywheel bench lsp` end to end on a tiny model: a real server over stdio, a typed-into file, and
completions sent while the same server runs agent tasks."""

from __future__ import annotations

import json

from benchmarks import lsp_latency as bench


def test_typed_file_requests_share_their_start_and_never_extend_each_other():
    typed = bench.TypedFile(bench.source_text(3000))
    (a, pa), (b, pb) = typed(1), typed(2)
    before_a, before_b = a[: bench._offset(a, pa)], b[: bench._offset(b, pb)]
    assert pa.line == pb.line and a.splitlines()[: pa.line] == b.splitlines()[: pb.line]
    assert before_a.endswith("\ndef handle_1(request, ") and not before_b.startswith(before_a)
    assert a[len(before_a) :] == b[len(before_b) :]  # the rest of the file is the same


def test_bench_lsp_times_completions_idle_and_during_agent_tasks(tmp_path, tiny_checkpoint):
    out = tmp_path / "lsp.json"
    args = [
        "--model", str(tiny_checkpoint), "--iterations", "3", "--warmup", "1",
        "--temperature", "1.0", "--max-tokens", "4", "--file-tokens", "300",
        "--during-agent", "--json", str(out),
    ]  # fmt: skip
    assert bench.main(args) == 0
    report = json.loads(out.read_text())
    assert len(report["samples_ms"]["lsp_during_agent"]) == 3
    assert report["agent_tasks_started"] >= 1 and report["during_agent_vs_idle_p50"] > 0
    assert 100 <= report["prompt_tokens_p50"] <= 600  # the file, sized with the model's tokenizer

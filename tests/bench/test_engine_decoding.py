"""`flywheel bench engine` on a tiny checkpoint: every method's tokens equal plain decoding's."""

from __future__ import annotations

import json
import shutil

from benchmarks.engine.decoding import main
from tests.bench.test_engine_peers import make_fake_python


def test_bench_engine_writes_rows_for_both_workloads(tmp_path, tiny_checkpoint, capsys):
    model = tmp_path / "model"  # the tiny tokenizer makes the apply prompt ~2.4k tokens long
    shutil.copytree(tiny_checkpoint, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    out = tmp_path / "engine.json"
    args = ["--model", str(model), "--max-tokens", "12", "--apply-max-tokens", "24"]
    args += ["--repeats", "1", "--step-samples", "3", "--threads", "1", "--json", str(out)]
    args += ["--group-size", "3", "--concurrent", "2"]
    # external peers: vLLM's stands in as a fake subprocess, llama.cpp's environment is missing
    args += ["--peers", "hf,vllm,llamacpp", "--vllm-python", str(make_fake_python(tmp_path))]
    args += ["--llamacpp-python", str(tmp_path / "missing" / "bin" / "python")]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["apply_max_tokens"] == 24
    assert report["settings"]["dtype"] == "int8"  # what the engine loads on a CPU
    methods = {(r["workload"], r["method"]) for r in report["rows"]}
    for workload in ("apply", "completion", "free"):
        for method in ("plain", "ngram", "mtp", "ngram+mtp", "hf-greedy", "hf-prompt-lookup"):
            assert (workload, method) in methods
        assert {(workload, "vllm"), (workload, "vllm-ngram")} <= methods
    # Our methods agree with plain everywhere; Hugging Face's on free text (apply: it decodes
    # without our copy bias).
    ours = [
        r
        for r in report["rows"]
        if not r["method"].startswith("vllm")
        and (r["workload"] == "free" or not r["method"].startswith("hf"))
    ]
    assert all(r["identical_to_plain"] and r["same_share"] == 1.0 for r in ours)
    assert report["settings"]["apply_copy_bias"] > 0
    peers = {p["method"]: p for p in report["peers"]}
    assert peers["vllm"]["status"] == "ran" and peers["vllm-ngram"]["version"] == "fake 1.0"
    assert peers["llamacpp"]["status"] == peers["llamacpp-lookup"]["status"] == "skipped"
    targets = report["targets"]
    assert {"plain_vs_hf_greedy", "verify4_vs_decode_step"} <= set(targets)
    assert targets["mtp_head_cost"]["head_step_ms"] > 0 and targets["mtp_head_cost"]["heads"] == 2
    assert targets["mtp_free_text"]["mean_acceptance_length"] >= 1.0
    assert targets["rl_group"]["samples"] == 3 and targets["rl_group"]["greedy_rows_identical"]
    turn = targets["agent_turn"]
    assert 0 < turn["cached_tokens"] < turn["prompt_tokens"]  # the first turn's prompt, reused
    assert turn["greedy_identical"]  # the warm turn wrote what the cold one did
    concurrent = targets["concurrent_completions"]
    assert concurrent["completions"] == 2 and concurrent["greedy_identical"]
    assert all(
        targets[k]["ratio"] > 0 for k in ("rl_group", "agent_turn", "concurrent_completions")
    )
    printed = capsys.readouterr().out
    assert "apply" in printed and "llamacpp-lookup: skipped: no llamacpp environment" in printed
    apply = [r for r in report["rows"] if r["workload"] == "apply"]
    assert all(0.0 <= r["similarity_to_expected"] <= 1.0 for r in apply)
    assert all(r["similarity_to_expected"] is None for r in report["rows"] if r not in apply)


def test_apply_expects_the_file_with_its_definition_renamed(tokenizer):
    from benchmarks.engine.report import similarity
    from benchmarks.engine.workloads import workloads

    apply = next(item for item in workloads(tokenizer) if item["workload"] == "apply")
    assert apply["expected"] != apply["speculation"]
    assert "_checked(" in apply["expected"] and "_checked(" not in apply["speculation"]
    assert similarity(apply["expected"][:500], apply["expected"]) == 1.0
    assert similarity("of of of of of of", apply["expected"]) < 0.3


def test_the_completion_workload_is_the_servers_request_and_is_timed_against_llamacpp(tokenizer):
    from benchmarks.engine.decoding import cold_completion
    from benchmarks.engine.workloads import workloads

    items = workloads(tokenizer)
    completion = next(item for item in items if item["workload"] == "completion")
    assert completion["prompt"].endswith("<|fim_middle|>")  # a fill-in-the-middle prompt
    assert f"<|file_sep|>{completion['name']}" in completion["prompt"]
    assert items[-1]["workload"] == "free"  # the step figures still time the last free prompt

    completion["max_tokens"] = 16
    rows = [
        dict(workload="completion", method="plain", seconds=0.6, tokens=16),
        dict(workload="completion", method="llamacpp", seconds=1.0, tokens=16),
        dict(workload="free", method="llamacpp", seconds=0.1, tokens=96),
    ]
    cold = cold_completion(rows, items)["cold_completion"]
    assert cold["ratio"] == 0.6 and cold["passed"] and cold["plain_ms"] == 600
    assert cold["prompt_tokens"] == len(completion["prompt_ids"])
    assert not cold_completion(rows[:1], items)  # without llama.cpp there is nothing to compare

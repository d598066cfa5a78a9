"""The shipped default (agent/starter/: an adapter on the real base) loads as "default" and answers
with a tool call that parses. These tests load the real base (converted on first use)."""

from __future__ import annotations

import json

import pytest

from agent.base import base_version
from agent.engine import EngineConfig, Request, SamplingParams, open_engine
from agent.harness.prompts import first_messages, tool_schemas
from agent.harness.tools import TOOLS
from agent.model import STARTER_DIR, is_adapter, load_checkpoint

pytestmark = pytest.mark.base


def test_starter_loads_as_default_with_lineage():
    ckpt = load_checkpoint("default")
    assert ckpt.path == str(STARTER_DIR) and is_adapter(STARTER_DIR)
    meta = json.loads((STARTER_DIR / "flywheel.json").read_text())
    assert ckpt.version == meta["version"] and meta["version"].startswith("starter-")
    assert {"recipes", "data", "stages", "evaluation"} <= set(meta)
    assert meta["base"] == base_version()
    assert sum(f.stat().st_size for f in STARTER_DIR.rglob("*") if f.is_file()) <= 25e6
    assert ckpt.trunk.config.max_position_embeddings >= 4096  # the harness's prompts fit


def test_starter_answers_a_task_with_a_tool_call_that_parses():
    engine = open_engine(EngineConfig(model="default"))
    messages = first_messages(
        "Run the tests, find out why they fail and fix the code (not the tests).",
        "Repository map (most relevant first):\nreport.py\nstats.py\ntest_stats.py",
    )
    result = engine.generate(
        Request(
            messages=messages,
            tools=tool_schemas(),
            params=SamplingParams(max_tokens=64, temperature=0.0),
        )
    )
    completion = result.completions[0]
    assert not completion.tool_call_errors, completion.text
    assert completion.tool_calls, completion.text
    assert all(call.name in TOOLS for call in completion.tool_calls)


def test_training_that_continues_the_shipped_adapter_saves_one_that_loads(tmp_path):
    """The shipped adapter names its base by name; what training saves from it names the base's
    version (a stage started from `default`, as the cycle and RL do)."""
    from agent.model import save_checkpoint
    from training.adapters import load_adapter_for_training

    trunk, tokenizer = load_adapter_for_training(STARTER_DIR, "cpu")
    saved = save_checkpoint(tmp_path / "continued", trunk, tokenizer, meta={"version": "x"})
    assert json.loads((saved / "flywheel.json").read_text())["base"] == base_version()
    assert load_checkpoint(saved).trunk.config.hidden_size == 576

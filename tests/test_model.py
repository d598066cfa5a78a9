"""The model: named sizes, MTP heads, checkpoints that plain transformers can load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from agent.engine.request import EngineError
from agent.model import build_trunk, count_parameters, load_checkpoint, save_checkpoint
from agent.mtp import MTPConfig, MTPHeads


def test_named_sizes_include_a_laptop_size():
    counts = {
        name: count_parameters(build_trunk(name, vocab_size=8192)) for name in ("test", "10m")
    }
    assert 8e6 <= counts["10m"] <= 12e6
    assert counts["test"] < counts["10m"]
    with pytest.raises(ValueError, match="unknown model size"):
        build_trunk("huge", vocab_size=10)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_checkpoint_round_trip_with_heads(tmp_path, tokenizer, family):
    trunk = build_trunk("test", vocab_size=len(tokenizer), family=family, seed=3)
    heads = MTPHeads(trunk, MTPConfig(depth=3))
    save_checkpoint(tmp_path, trunk, tokenizer, heads, meta={"version": "v7"})
    ck = load_checkpoint(tmp_path)
    assert ck.version == "v7" and ck.heads is not None and ck.heads.config.depth == 3
    ids = torch.tensor([tokenizer.encode("def f(x):")])
    with torch.inference_mode():
        assert torch.allclose(trunk.eval()(ids).logits, ck.trunk(ids).logits, atol=1e-5)
        for k in range(3):
            assert torch.equal(ck.heads.heads[k].proj.weight, heads.heads[k].proj.weight)
    # The heads share the trunk's embedding and output head rather than copying them.
    assert ck.heads._embed is ck.trunk.get_input_embeddings()
    saved = json.loads((tmp_path / "mtp" / "config.json").read_text())
    assert saved == {"depth": 3, "hidden_size": trunk.config.hidden_size, "family": "llama"}


def test_mtp_head_shapes_and_causality(tiny_checkpoint):
    ck = load_checkpoint(tiny_checkpoint)
    ids = torch.randint(0, ck.trunk.config.vocab_size, (1, 12))
    pos = torch.arange(12)[None]
    with torch.inference_mode():
        h0 = ck.trunk.model(ids).last_hidden_state  # [1, 12, hidden]
        h1 = ck.heads.forward_head(0, h0, ids, pos)
        logits = ck.heads.logits(0, h1)  # [1, 12, vocab]
        # Changing a later input must not change earlier outputs (causal attention).
        ids2 = ids.clone()
        ids2[0, -1] = (ids2[0, -1] + 1) % ck.trunk.config.vocab_size
        h1b = ck.heads.forward_head(0, h0, ids2, pos)
    assert logits.shape == (1, 12, ck.trunk.config.vocab_size)
    assert torch.allclose(h1[:, :-1], h1b[:, :-1], atol=1e-5)
    assert not torch.allclose(h1[:, -1], h1b[:, -1])


def test_saved_trunk_loads_without_flywheel(tiny_checkpoint):
    """Plain transformers loads the trunk while importing any Flywheel package is forbidden."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('agent', 'telemetry', 'training', 'lsp'):
            raise ImportError('flywheel must not be needed: ' + name)
sys.meta_path.insert(0, Block())
from transformers import AutoModelForCausalLM, AutoTokenizer
m = AutoModelForCausalLM.from_pretrained({str(tiny_checkpoint)!r})
t = AutoTokenizer.from_pretrained({str(tiny_checkpoint)!r})
out = m.generate(**t("def f(", return_tensors="pt"), max_new_tokens=3, do_sample=False)
print("OK", out.shape[1])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OK" in out.stdout


def test_missing_files_are_named(tmp_path, tiny_checkpoint):
    with pytest.raises(EngineError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    with pytest.raises(
        EngineError, match=r"missing tokenizer.json, tokenizer_config.json, model.safetensors"
    ):
        load_checkpoint(tmp_path)


def test_mismatched_tokenizer_is_refused(tmp_path, tokenizer):
    from agent.tokenizer import iter_source_texts, train_tokenizer
    from tests.conftest import STDLIB

    small = build_trunk("test", vocab_size=600)
    big_tok = train_tokenizer(iter_source_texts(STDLIB / "json", max_bytes=500_000), vocab_size=900)
    save_checkpoint(tmp_path, small, big_tok)
    with pytest.raises(
        EngineError, match="tokenizer .* has 900 tokens but the model's vocabulary has 600"
    ):
        load_checkpoint(tmp_path)


def test_checkpoints_load_with_the_hubs_kernels_off(tiny_checkpoint):
    """transformers would fetch kernels from the Hub when a model trains on a GPU; offline, the
    training stage failed there before its first step."""
    trunk = load_checkpoint(tiny_checkpoint).trunk
    trunk.train()
    assert trunk.use_kernels is False

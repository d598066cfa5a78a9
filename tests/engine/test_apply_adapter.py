"""Fast-apply requests run on the model folder's apply/ adapter; every other request on the model.

The adapter is a real peft LoRA on the query and value layers (random, so that it changes the
output) saved into `apply/` of a copy of a lively checkpoint, as `flywheel train starter` ships
the starter's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agent.engine import EngineConfig, EngineError, Request, SamplingParams, SpeculativeConfig
from agent.engine.local.engine import LocalEngine
from agent.model import APPLY_DIR, checkpoint_version

PROMPT = "def parse(text):\n    return json.loads(text)\n\ndef parse("
ORIGINAL = "def parse(text):\n    return json.loads(text)\n"


def add_apply_adapter(folder: Path) -> Path:
    """A random LoRA adapter on `folder`'s trunk, saved as `folder`/apply."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    trunk = AutoModelForCausalLM.from_pretrained(str(folder))
    torch.manual_seed(5)
    config = LoraConfig(
        r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    adapter = get_peft_model(trunk, config)
    adapter.peft_config["default"].base_model_name_or_path = str(folder)
    out = folder / APPLY_DIR
    adapter.save_pretrained(str(out))
    meta = {"version": "tiny-apply", "base": checkpoint_version(folder)}
    (out / "flywheel.json").write_text(json.dumps(meta))
    return out


@pytest.fixture(scope="module")
def with_apply(tmp_path_factory, lively_checkpoint) -> Path:
    folder = tmp_path_factory.mktemp("with-apply") / "model"
    shutil.copytree(lively_checkpoint, folder)
    add_apply_adapter(folder)
    return folder


def request(apply: bool, **kw) -> Request:
    params = SamplingParams(temperature=0, max_tokens=24)
    return Request(prompt=PROMPT, params=params, speculation=ORIGINAL, apply=apply, **kw)


@pytest.mark.parametrize("own_thread", [False, True])
def test_apply_requests_decode_with_the_apply_adapter_and_others_with_the_model(
    with_apply, own_thread
):
    spec = SpeculativeConfig("ngram+mtp")
    # without the copy bias (test_copy_bias.py), which only apply requests get: this compares weights
    engine = LocalEngine(
        EngineConfig(
            model=str(with_apply), speculative=spec, own_thread=own_thread, apply_copy_bias=0
        )
    )
    alone = LocalEngine(EngineConfig(model=str(with_apply / APPLY_DIR)))  # the adapter as a model
    main = LocalEngine(EngineConfig(model=str(with_apply)))
    try:
        applied = engine.generate(request(apply=True)).completions[0]
        plain = engine.generate(request(apply=False)).completions[0]
        want_applied = alone.generate(request(apply=False)).completions[0]
        want_plain = main.generate(request(apply=False)).completions[0]
        assert applied.token_ids == want_applied.token_ids
        assert plain.token_ids == want_plain.token_ids
        assert applied.token_ids != plain.token_ids  # the adapter changes what is written
        assert applied.model_version == "tiny-apply"
        assert plain.model_version == checkpoint_version(with_apply)
    finally:
        for e in (engine, alone, main):
            e.close()


def test_a_model_without_an_apply_adapter_decodes_apply_requests_itself(lively_checkpoint):
    engine = LocalEngine(EngineConfig(model=str(lively_checkpoint), apply_copy_bias=0))
    try:
        applied = engine.generate(request(apply=True)).completions[0]
        plain = engine.generate(request(apply=False)).completions[0]
        assert applied.token_ids == plain.token_ids
    finally:
        engine.close()


def test_an_apply_adapter_made_for_another_model_is_refused_in_one_line(tmp_path, with_apply):
    folder = tmp_path / "model"
    shutil.copytree(with_apply, folder)
    meta = folder / APPLY_DIR / "flywheel.json"
    meta.write_text(json.dumps({"version": "tiny-apply", "base": "another-model@0123"}))
    engine = LocalEngine(EngineConfig(model=str(folder)))
    try:
        with pytest.raises(EngineError, match="another-model@0123") as caught:
            engine.generate(request(apply=True))
        assert "\n" not in str(caught.value)
        assert engine.generate(request(apply=False)).completions[0].token_ids  # still serves
    finally:
        engine.close()


def test_the_served_api_marks_a_fast_apply_chat_with_apply():
    import threading

    from agent.engine import BadRequest
    from agent.serve.request_body import chat_request

    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert not chat_request(body, threading.Event()).apply
    assert chat_request({**body, "apply": True}, threading.Event()).apply
    with pytest.raises(BadRequest, match="`apply` must be true or false"):
        chat_request({**body, "apply": "yes"}, threading.Event())


def test_a_served_model_decodes_a_client_s_apply_chat_with_its_apply_adapter(with_apply):
    """OpenAIEngine sends `apply` on chat; flywheel serve routes it to the apply adapter."""
    from agent.engine.backends.openai import OpenAIEngine
    from tests.flywheel_server import running_server

    messages = [{"role": "user", "content": ORIGINAL}]

    def chat(engine, apply: bool):
        params = SamplingParams(temperature=0, max_tokens=16)
        return engine.generate(Request(messages=messages, params=params, apply=apply)).completions[
            0
        ]

    local = LocalEngine(EngineConfig(model=str(with_apply)))
    try:
        with running_server(with_apply) as url:
            served = OpenAIEngine(EngineConfig(model=url))
            try:
                applied, plain = chat(served, True), chat(served, False)
            finally:
                served.close()
        assert applied.text == chat(local, True).text
        assert plain.text == chat(local, False).text
        assert applied.text != plain.text
        assert applied.model_version == "tiny-apply"
    finally:
        local.close()


def test_evaluate_apply_scores_held_out_examples_on_the_apply_adapter(tmp_path, with_apply):
    from agent.chat_format import apply_messages
    from training.evaluate import evaluate_apply

    updated = ORIGINAL.replace("def parse(", "def parse_checked(")
    rows = [
        {"family": "apply/rename_function", "split": split, "messages": messages}
        for split in ("train", "heldout", "heldout")
        for messages in [apply_messages("m.py", ORIGINAL, "def parse_checked(text):\n", updated)]
    ]
    examples = tmp_path / "apply.jsonl"
    examples.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    report = evaluate_apply(str(with_apply), examples, limit=5, log=lambda line: None)
    assert report["examples"] == 2 and report["version"] == "tiny-apply"
    assert 0.0 <= report["mean_similarity"] <= 1.0 and report["exact"] in (0, 1, 2)
    with pytest.raises(ValueError, match="no held-out examples"):
        evaluate_apply(str(with_apply), _train_only(tmp_path))


def _train_only(tmp_path: Path) -> Path:
    path = tmp_path / "train-only.jsonl"
    path.write_text(json.dumps({"split": "train", "messages": []}) + "\n")
    return path


def test_a_model_trained_from_one_with_an_apply_adapter_keeps_it(tmp_path, with_apply):
    """What the cycle and RL train from the default keeps its fast-apply adapter (it is on the
    base, apart from the weights they change)."""
    from tests.tiny_training import train_hello

    child = train_hello(tmp_path, with_apply)
    assert (child / APPLY_DIR / "adapter_model.safetensors").read_bytes() == (
        with_apply / APPLY_DIR / "adapter_model.safetensors"
    ).read_bytes()


def test_an_adapter_without_an_apply_adapter_applies_with_its_base(tmp_path, lively_checkpoint):
    base = tmp_path / "base"
    shutil.copytree(lively_checkpoint, base)
    agent = tmp_path / "agent"  # an adapter on `base` (the agent's), no apply/ of its own
    shutil.move(add_apply_adapter(base), agent)
    engine = LocalEngine(EngineConfig(model=str(agent), apply_copy_bias=0))
    alone = LocalEngine(EngineConfig(model=str(base)))
    try:
        applied = engine.generate(request(apply=True)).completions[0]
        plain = engine.generate(request(apply=False)).completions[0]
        want = alone.generate(request(apply=False)).completions[0]
        assert applied.token_ids == want.token_ids  # the base's tokens
        assert applied.token_ids != plain.token_ids  # not the adapter's
        assert applied.model_version == checkpoint_version(base)
    finally:
        engine.close()
        alone.close()

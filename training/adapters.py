"""LoRA adapters through `peft`: what a stage trains when its recipe sets `lora_rank`.

A stage that starts from the base (or from an adapter trained on it) trains low-rank updates of
every linear layer of the trunk plus the embedding rows of the chat format's markers
(`trainable_token_indices`: `<|arg|>` is a new row the base never saw, and the 0.5B's rows of the
tool-call and turn markers are still near their untrained start; peft keeps the tied output
layer in step). What it saves is a PEFT adapter folder that
`agent.model.load_checkpoint` merges into the base at load, and that vLLM and `transformers` read.

Starting from an adapter folder continues that adapter (same rank and targets), so the stages
(pretrain -> long context -> SFT) build one adapter on one base.
"""

from __future__ import annotations

from pathlib import Path

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def special_token_ids(tokenizer) -> list[int]:
    """Ids of the tokens whose embedding rows train beside the adapter
    (`chat_format.TRAINED_ROWS`) that the tokenizer has. The base's other special tokens keep
    their pretrained rows."""
    from agent.chat_format import TRAINED_ROWS

    vocab = tokenizer.get_vocab()
    return sorted(vocab[t] for t in TRAINED_ROWS if t in vocab)


def attach_lora(trunk, tokenizer, rank: int, alpha: float, dropout: float, targets=()):
    """`trunk` wrapped in a fresh LoRA adapter (peft's PeftModel) on `targets` (default: every
    linear layer); only the adapter trains."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha or 2 * rank,
        lora_dropout=dropout,
        target_modules=list(targets) or LORA_TARGETS,
        trainable_token_indices={"embed_tokens": special_token_ids(tokenizer)},
        bias="none",
    )
    return get_peft_model(trunk, config)


def load_adapter_for_training(folder: Path, device: str):
    """(PeftModel with the adapter in `folder` trainable, tokenizer, base version)."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    from agent.model import adapter_base, load_pretrained

    base = adapter_base(folder)
    trunk = load_pretrained(base).to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model = PeftModel.from_pretrained(trunk, str(folder), is_trainable=True)
    # A shipped adapter names its base by name only (starter.ship); the adapter this training
    # saves must name the folder it was loaded on, so that its flywheel.json records the base's
    # version (agent.model.save_checkpoint) and it loads again.
    model.peft_config["default"].base_model_name_or_path = str(base)
    return model, tokenizer


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def trainable_state(model) -> dict:
    """The parameters that train (all of them without an adapter): what a resumable checkpoint
    must keep. An adapter's frozen base is reloaded from the base folder, not saved per step."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model, state: dict) -> None:
    """Inverse of `trainable_state`; every saved tensor must find its parameter."""
    import torch

    params = dict(model.named_parameters())
    unknown = [k for k in state if k not in params]
    if unknown:
        raise ValueError(f"checkpoint has parameters this model lacks: {unknown[:3]}")
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)

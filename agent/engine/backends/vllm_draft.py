"""Export a checkpoint's MTP heads as a draft that vLLM's `mtp` speculative method loads.

    flywheel export-draft runs/ckpt runs/ckpt-vllm-draft      (main(argv) below)
    vllm serve runs/ckpt --hf-overrides '{"num_nextn_predict_layers": 1}' --speculative-config \\
        '{"method": "mtp", "model": "runs/ckpt-vllm-draft", "num_speculative_tokens": 1}'

The `vllm` backend does this by itself for `--speculative mtp` (agent/engine/backends/vllm.py).

Which vLLM layout, and why. Our head (agent/mtp.py) is DeepSeek-V3's MTP module with a Llama
block: `norm_out(Block(proj([norm_hidden(h); norm_embed(emb(t))])))` then the shared lm_head.
vLLM 0.32 has three candidates for a Llama target:
- `eagle` (EagleLlamaForCausalLM): `fc([emb(t); h])`, no input norms, the block's
  input_layernorm removed, no norm before the lm_head. Three RMSNorms of ours have no place
  there, and an RMSNorm is not linear, so no weight mapping is exact.
- `eagle3`: reads three intermediate target layers and feeds [emb; h] straight into the
  attention (no projection, no input norm): not our function either.
- `mtp` with MiMo's layout (MiMoMTPModel): token_layernorm, hidden_layernorm,
  input_proj on [hidden; embed] (our order), one Qwen2 decoder layer, final_layernorm, then the
  target's lm_head. A Qwen2 layer is a Llama layer plus q/k/v biases, which we write as zeros.
  This is our head's function, weight for weight. It is what we export.

What vLLM then computes, and where it departs from our local MTPProposer:
- The same: head 1 (the first head) at every position, reading the target's final normed
  hidden state h_0 and the embedding of the next token, with its own KV cache over the whole
  context (ours re-runs the heads over a window of the last 32 positions each step).
- Different, by vLLM's design: (1) the embedding is zeroed at position 0 (DeepSeek and MiMo
  were trained that way; ours were not), which changes the head's keys/values at that one
  position; (2) vLLM's v1 runner only ever runs the first MTP layer, re-running it on its own
  output for drafts 2..k. So only head 1 is exported and `vllm_kwargs` asks for one draft per
  step (head 1 re-run on its own output drafts poorly). The verifier keeps the output exact
  either way; only the acceptance rate moves.
- vLLM builds the MTP layer from the *target's* config, which must therefore carry
  `num_nextn_predict_layers` (TARGET_OVERRIDES, passed as a dict `hf_overrides`).

The folder written (read by vLLM only; Flywheel never loads it back):

    out/config.json         a Qwen2 config with architectures ["MiMoForCausalLM"] and
                            num_nextn_predict_layers 1; vLLM rewrites it to MiMoMTPModel
    out/model.safetensors   model.mtp_layers.0.* (the head), model.embed_tokens.weight and
                            lm_head.weight (copies vLLM's loader requires; at load it shares the
                            target's own instead)

Not here: training, and any change to what the heads compute. Needs only torch, safetensors and
transformers (both the main and the vLLM environment have them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from agent.engine.request import EngineError

ARCHITECTURE = "MiMoForCausalLM"  # vLLM's SpeculativeConfig turns this into MiMoMTPModel
# our head's parameter name (under heads.0.) -> vLLM MiMo name (under model.mtp_layers.0.)
HEAD_NAMES = {
    "norm_hidden.weight": "hidden_layernorm.weight",
    "norm_embed.weight": "token_layernorm.weight",
    "proj.weight": "input_proj.weight",  # [hidden, 2 * hidden] on [hidden; embed], same order
    "norm_out.weight": "final_layernorm.weight",
}
BLOCK_PREFIX = "block."  # heads.0.block.self_attn.q_proj.weight -> ...mtp_layers.0.self_attn...
ZERO_BIASES = ("q_proj", "k_proj", "v_proj")  # a Qwen2 layer has them; a Llama layer does not
# vLLM builds MiMo's MTP layer from the *target's* config (mimo_mtp.py reads
# vllm_config.model_config), so the target must say how many MTP layers there are; a dict
# `hf_overrides` reaches the target only, and Llama/Qwen2 ignore the field otherwise.
TARGET_OVERRIDES = {"num_nextn_predict_layers": 1}


def vllm_kwargs(draft_folder: str | Path) -> dict:
    """What `vllm.LLM(model=checkpoint, **vllm_kwargs(draft))` needs to draft with the heads.

    One draft token per step: vLLM's v1 runner runs only the first MTP layer, the one head that
    maps exactly (see the module docstring); more would re-run head 1 on its own output.
    """
    return {
        "speculative_config": {
            "method": "mtp",
            "model": str(draft_folder),
            "num_speculative_tokens": 1,
        },
        "hf_overrides": dict(TARGET_OVERRIDES),
    }


def _trunk_tensors(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named trunk tensors that exist, read from model.safetensors (or its shards)."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.exists():
        where = json.loads(index.read_text())["weight_map"]
        files = {name: folder / where[name] for name in names if name in where}
    elif (folder / "model.safetensors").exists():
        files = {name: folder / "model.safetensors" for name in names}
    else:
        raise EngineError(
            f"{folder} has no model.safetensors: re-save the checkpoint with safetensors "
            "(save_checkpoint does) before exporting its MTP heads for vLLM"
        )
    found = {}
    for name, path in files.items():
        with safe_open(str(path), "pt") as f:
            if name in f.keys():  # noqa: SIM118 - safe_open has keys(), not __contains__
                found[name] = f.get_tensor(name)
    return found


def _rope_theta(config) -> float | None:
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("rope_theta", getattr(config, "rope_theta", None))


def draft_config(trunk_config) -> dict:
    """config.json of the draft: the head block's own shape (agent.mtp.head_config)."""
    from agent.mtp import head_config

    block = head_config(trunk_config)
    if _rope_theta(block) != _rope_theta(trunk_config):
        raise EngineError(
            f"the MTP heads use RoPE theta {_rope_theta(block)} but the trunk "
            f"{_rope_theta(trunk_config)}; vLLM runs the head with the trunk's, so the export "
            "would not compute what the heads learned"
        )
    config = {
        k: v
        for k, v in block.to_dict().items()
        if k not in ("_attn_implementation", "architectures", "model_type", "transformers_version")
    }
    config.update(
        architectures=[ARCHITECTURE],
        model_type="qwen2",
        num_hidden_layers=trunk_config.num_hidden_layers,  # vLLM sets it to 0 for the draft
        num_nextn_predict_layers=1,  # vLLM's v1 runner only ever runs the first MTP layer
        use_sliding_window=False,
        tie_word_embeddings=bool(getattr(trunk_config, "tie_word_embeddings", False)),
        torch_dtype="float32",
    )
    return config


def export_vllm_draft(checkpoint_folder: str | Path, out_folder: str | Path) -> Path:
    """Write the first MTP head of `checkpoint_folder` as a vLLM `mtp` draft into `out_folder`.

    Raises EngineError when the checkpoint has no heads or its files do not fit together.
    Returns `out_folder`. Weights are written in float32 (vLLM casts them to the target's dtype).
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from agent.model import checkpoint_folder as check_folder
    from agent.model import merged_folder
    from agent.mtp import read_heads_state

    folder = merged_folder(check_folder(checkpoint_folder))  # an adapter: merged into its base
    heads_dir = folder / "mtp"
    if not (heads_dir / "config.json").exists():
        raise EngineError(
            f"{folder} has no MTP heads (mtp/config.json): train them with `flywheel train` "
            "(the mtp stage), or speculate with ngram or a draft model instead"
        )
    trunk_config = AutoConfig.from_pretrained(str(folder))
    heads = read_heads_state(heads_dir / "model.safetensors")
    head = {k[len("heads.0.") :]: v for k, v in heads.items() if k.startswith("heads.0.")}
    if not head:
        raise EngineError(f"{heads_dir}/model.safetensors holds no weights for head 0")
    hidden = trunk_config.hidden_size
    if head["proj.weight"].shape != (hidden, 2 * hidden):
        raise EngineError(
            f"MTP heads in {heads_dir} do not fit the trunk (hidden size {hidden}): "
            "retrain them for this trunk"
        )

    out: dict[str, torch.Tensor] = {}
    for name, tensor in head.items():
        if name.startswith(BLOCK_PREFIX):
            target = name[len(BLOCK_PREFIX) :]
        elif name in HEAD_NAMES:
            target = HEAD_NAMES[name]
        else:
            raise EngineError(f"unexpected MTP head weight {name!r} in {heads_dir}: not exported")
        out[f"model.mtp_layers.0.{target}"] = tensor.float()
    for proj in ZERO_BIASES:
        weight = out[f"model.mtp_layers.0.self_attn.{proj}.weight"]  # [out, hidden]
        out[f"model.mtp_layers.0.self_attn.{proj}.bias"] = weight.new_zeros(weight.shape[0])

    trunk = _trunk_tensors(folder, ["model.embed_tokens.weight", "lm_head.weight"])
    if "model.embed_tokens.weight" not in trunk:
        raise EngineError(f"{folder} has no model.embed_tokens.weight: not a Llama/Qwen2 trunk")
    embed = trunk["model.embed_tokens.weight"].float()  # [vocab, hidden]
    out["model.embed_tokens.weight"] = embed
    out["lm_head.weight"] = trunk.get("lm_head.weight", embed).float().clone()  # tied: a copy

    out_folder = Path(out_folder)
    out_folder.mkdir(parents=True, exist_ok=True)
    config = draft_config(trunk_config)
    config["flywheel_export"] = {"checkpoint": str(folder), "head": 0, "layout": "mimo_mtp"}
    (out_folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in out.items()}, str(out_folder / "model.safetensors"))
    return out_folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="flywheel export-draft",
        description="export a checkpoint's MTP heads as a vLLM `mtp` draft (MiMo layout)",
    )
    p.add_argument("checkpoint", help="checkpoint folder with mtp/ heads")
    p.add_argument("out", help="folder to write (config.json + model.safetensors)")
    args = p.parse_args(argv)
    try:
        out = export_vllm_draft(args.checkpoint, args.out)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    kwargs = vllm_kwargs(out)
    print(f"wrote {out}; serve with:")
    print(
        f"  vllm serve {args.checkpoint} "
        f"--speculative-config '{json.dumps(kwargs['speculative_config'])}' "
        f"--hf-overrides '{json.dumps(kwargs['hf_overrides'])}'"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

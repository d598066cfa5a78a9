"""The policy being trained and its update step.

`Policy.update(rows, n_trajectories)` is one training step on a batch of admitted groups:

1. (more than one update per batch only) a no-grad pass gives log pi_prox for every row;
2. for each mini-batch, for each micro-batch of `micro_batch_rows` rows: one forward pass of the
   trainable trunk over the full `prompt + output` sequences (right-padded), the log-probability
   of exactly the sampled target ids under the temperature the sampler used, the loss of
   grpo.py, backward;
3. clip the gradient norm and step AdamW, unless the loss or the gradient is not finite: then the
   step is skipped, the weights stay as they were, and `update` reports `skipped` with the reason.

Scoring reads the trunk's hidden states and applies the output head only at the masked positions
(prompts are long, outputs short): [rows, seq, hidden] -> [tokens, hidden] -> [tokens, vocab].

What trains: every weight of the trunk (`lora_rank = 0`, float32), or a LoRA adapter of rank
`lora_rank` on every linear layer plus the chat format's special-token rows (training/adapters.py),
over frozen weights in the recipe's `dtype` (bfloat16 on a GPU: half the memory and the GPU's fast
matrix units; peft keeps the adapter's own weights in float32, so AdamW's small steps survive).

Weights leave the trainer as ordinary checkpoint folders (`export`; an adapter is merged into a
copy of its base first, so an engine loads one folder whatever trained): the rollout engines load
them with `Engine.swap(path)`, and the registry takes the final one. MTP heads, when the initial
checkpoint has them, are carried along unchanged (drafting stays lossless whatever they predict).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
from pathlib import Path

import torch

from training.rl.grpo import Batch, Row, collate, effective_sample_size, policy_loss
from training.rl.recipe import RLRecipe


class Policy:
    def __init__(self, checkpoint, recipe: RLRecipe) -> None:
        self.checkpoint = checkpoint
        self.recipe = recipe
        self.trunk = checkpoint.trunk  # the causal LM: scoring reads .model and .lm_head
        self.tokenizer = checkpoint.tokenizer
        self.device = torch.device(recipe.device)
        self.trunk.to(self.device).train()
        self.adapter = None  # the PeftModel around `trunk` when a LoRA adapter trains
        if recipe.lora_rank:
            from training.adapters import attach_lora

            # peft injects the adapter's layers into `trunk` in place; `adapter` wraps it
            self.adapter = attach_lora(
                self.trunk, self.tokenizer, recipe.lora_rank, recipe.lora_alpha, 0.0
            )
            self.params = [p for p in self.adapter.parameters() if p.requires_grad]
        else:
            # Full-parameter updates: a checkpoint loaded from an adapter merged into its base
            # (the default model) comes back frozen, as peft leaves it.
            self.params = [p.requires_grad_(True) for p in self.trunk.parameters()]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay
        )
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)

    @classmethod
    def load(cls, path: str, recipe: RLRecipe) -> Policy:
        from agent.model import load_checkpoint

        return cls(load_checkpoint(path, device=recipe.device, dtype=recipe.dtype), recipe)

    # -- scoring -----------------------------------------------------------------------------

    def score(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(target) and the entropy of pi at every masked position.

        returns (logprobs [rows, seq], entropy [rows, seq]); zeros where mask == 0
        """
        out = self.trunk.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        hidden = out.last_hidden_state  # [rows, seq, hidden]
        where = batch.mask > 0  # [rows, seq]
        logits = self.trunk.lm_head(hidden[where]).float() / self.recipe.temperature  # [n, vocab]
        logp_all = logits.log_softmax(-1)
        picked = logp_all.gather(-1, batch.targets[where][:, None]).squeeze(-1)  # [n]
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # [n]
        logprobs = torch.zeros(batch.mask.shape, device=hidden.device, dtype=picked.dtype)
        ent = torch.zeros_like(logprobs)
        logprobs = logprobs.masked_scatter(where, picked)
        ent = ent.masked_scatter(where, entropy.detach())
        return logprobs, ent

    def _micro_batches(self, rows: list[Row]) -> list[list[Row]]:
        size = self.recipe.micro_batch_rows
        ordered = sorted(rows, key=lambda r: len(r.input_ids))  # similar lengths pad less
        return [ordered[i : i + size] for i in range(0, len(ordered), size)]

    # -- the update --------------------------------------------------------------------------

    def update(self, rows: list[Row], n_trajectories: int) -> dict[str, float]:
        """One training step (see the module docstring); returns its metrics."""
        recipe = self.recipe
        rows = [r for r in rows if any(r.mask)]
        if not rows:
            return {"skipped": 1.0, "skip_reason": "no trainable tokens"}  # type: ignore[dict-item]
        norm = float(max(1, n_trajectories) * (recipe.loss_tokens or recipe.max_tokens))
        prox = self._proximal_logprobs(rows) if recipe.updates_per_batch > 1 else {}
        per_update = math.ceil(len(rows) / recipe.updates_per_batch)
        totals = dict.fromkeys(
            (
                "loss",
                "tokens",
                "is_weight",
                "is_weight_sq",
                "truncated",
                "clipped",
                "kl",
                "entropy",
            ),
            0.0,
        )
        grad_norm = 0.0
        for u in range(recipe.updates_per_batch):
            part = rows[u * per_update : (u + 1) * per_update]
            if not part:
                break
            self.optimizer.zero_grad(set_to_none=True)
            for micro in self._micro_batches(part):
                skip = self._backward(micro, prox, norm, totals)
                if skip:
                    self.optimizer.zero_grad(set_to_none=True)
                    return {"skipped": 1.0, "skip_reason": skip}  # type: ignore[dict-item]
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.params, recipe.grad_clip or float("inf"))
            )
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                return {"skipped": 1.0, "skip_reason": f"gradient norm is {grad_norm}"}  # type: ignore[dict-item]
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = max(totals["tokens"], 1.0)
        return {
            "skipped": 0.0,
            "loss": totals["loss"] / recipe.updates_per_batch,
            "entropy": totals["entropy"] / tokens,
            "kl_sampling_trained": totals["kl"] / tokens,
            "ess": effective_sample_size(
                totals["is_weight"], totals["is_weight_sq"], totals["tokens"]
            ),
            "is_truncated_frac": totals["truncated"] / tokens,
            "clip_frac": totals["clipped"] / tokens,
            "grad_norm": grad_norm,
            "trained_tokens": totals["tokens"],
        }

    def _proximal_logprobs(self, rows: list[Row]) -> dict[int, torch.Tensor]:
        """log pi_prox of every row before the first update (a no-grad pass): id(row) ->
        [row length]."""
        prox: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for micro in self._micro_batches(rows):
                logprobs, _ = self.score(collate(micro, self.pad_id, self.device))
                for row, lp in zip(micro, logprobs, strict=True):
                    prox[id(row)] = lp[: len(row.input_ids)]
        return prox

    def _backward(
        self,
        micro: list[Row],
        prox: dict[int, torch.Tensor],
        norm: float,
        totals: dict[str, float],
    ) -> str:
        """The loss of one micro-batch, backward, its statistics added to `totals`; returns why
        the step must be skipped (a loss that is not finite), else ""."""
        recipe = self.recipe
        batch = collate(micro, self.pad_id, self.device)
        logprobs, entropy = self.score(batch)  # [rows, seq] each
        prox_lp = None
        if prox:
            prox_lp = torch.zeros_like(logprobs)
            for i, row in enumerate(micro):
                prox_lp[i, : len(row.input_ids)] = prox[id(row)]
        loss, stats = policy_loss(
            logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.mask,
            norm,
            prox_logprobs=prox_lp,
            is_cap=recipe.is_cap,
            clip_low=recipe.clip_low,
            clip_high=recipe.clip_high,
        )
        if not torch.isfinite(loss):
            return f"loss is {loss.item()}"
        loss.backward()
        totals["loss"] += loss.item()
        totals["entropy"] += float((entropy * batch.mask).sum())
        for key, value in stats.items():
            totals[key] += float(value)
        return ""

    def weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.trunk.parameters())

    # -- export and state ----------------------------------------------------------------------

    def export(self, folder: Path, meta: dict) -> Path:
        """A loadable checkpoint folder, written beside `folder` and renamed into place."""
        from agent.model import carry_apply, save_checkpoint

        folder = Path(folder)
        tmp = folder.with_name(f".{folder.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        trunk = self.trunk
        if self.adapter is not None:  # merged into a copy: the adapter keeps training as it is
            trunk = copy.deepcopy(self.adapter).merge_and_unload()
        save_checkpoint(tmp, trunk, self.tokenizer, self.checkpoint.heads, meta)
        del trunk
        carry_apply(self.checkpoint.path, tmp)  # the fast-apply adapter is on the base: it stays
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        return folder

    def state_dict(self) -> dict:
        """What a resumable checkpoint keeps: the weights that train (an adapter's frozen base
        comes back from `init`) and the optimizer."""
        if self.adapter is not None:
            from training.adapters import trainable_state

            model = trainable_state(self.adapter)
        else:
            model = self.trunk.state_dict()
        return {"model": model, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.adapter is not None:
            from training.adapters import load_trainable_state

            load_trainable_state(self.adapter, state["model"])
        else:
            self.trunk.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

"""The trunk's forward pass over several requests at once, each on its own KV cache.

Why: on a CPU a decode step is bound by reading the weights, and reading them once for several
rows costs little more than for one. So `forward_parts` runs the new tokens of every part (a
request's decode row, its verify step over drafts, a prefill chunk) concatenated into one
sequence through the linear layers, and only attention runs part by part, each on its own cache,
positions and causal mask. No padding and no copy of any cache: parts differ in context length
and in new tokens. This is the flattened batch of vLLM's scheduler without its paged attention
(every request keeps its own KV cache, kv_cache.py).

The engine runs every trunk forward through here, alone or batched, so a request's numbers do
not depend on which others shared its step (but for the rounding of a different row count in
float32 matrix products, which `tests/engine/test_batched.py` checks does not change greedy
output; int8 and int4 products are per row). Under int8 or int4 (lowbit.py), where Flywheel's
CPU kernels build (`cpu_kernels`), the decode-sized parts attend through `cpu_kernels.attend`,
which computes every position alone in one call: a verify step then computes what plain
decoding's steps would, bit for bit, whatever `EngineConfig.exact` says. Elsewhere `exact` makes
each of its positions attend in a torch call of its own (`_attend`) for the same guarantee.
With `exact` under int8 or int4, prefill chunks take the low-bit products too (`rows_alone`),
so a prefix-cache hit's tail computes what a cold prefill would, bit for bit.

Written out for the Llama decoder (Llama and Qwen2, what `agent.model` builds and the base is);
any other trunk runs one part at a time through its own forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from agent.engine.local import cpu_kernels
from agent.engine.local.kv_cache import KVCache
from agent.engine.local.lowbit import is_lowbit
from agent.engine.scheduler import BATCH_ROWS, Step

RAGGED_MODEL_TYPES = ("llama", "qwen2")


@dataclass
class Part:
    """One request's new tokens in a batched forward pass."""

    ids: torch.Tensor  # [rows, m] tokens after those in `cache` (rows share the cache's length)
    cache: object  # its DynamicCache, extended by m positions
    last_only: bool = False  # logits for the last position only (prefill)
    alone: bool = False  # each new position attends alone, as a decode step would (`_attend`)
    # a tree of drafts (one row): parents[j] is the new position before j on its branch (-1:
    # none). Position j sits at the cache's length + its depth and sees only its branch.
    parents: list[int] | None = None

    def depths(self) -> list[int]:
        """Each new position's offset from the cache's length: its depth in the tree."""
        if self.parents is None:
            return list(range(self.ids.shape[-1]))
        depths: list[int] = []
        for parent in self.parents:
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return depths


def supports_ragged(trunk) -> bool:
    """Whether `forward_parts` can run this trunk (else each part runs through its own forward)."""
    config = trunk.config
    return config.model_type in RAGGED_MODEL_TYPES and not getattr(
        config, "use_sliding_window", False
    )


def forward_parts(trunk, parts: list[Part]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits [rows, m or 1, vocab], hidden [rows, m, hidden]) of every part, in one pass.

    hidden is the trunk's final normed hidden state (what the MTP heads read); every part's
    cache grows by its m new positions. Small parts (decode and verify steps, BATCH_ROWS rows in
    all at most) go through each linear layer together, and a large one (a prefill chunk riding
    with them) on its own: each takes the product it would take alone (`Int8Linear`,
    `FewRowsLinear` choose by row count).
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    order = sorted(range(len(parts)), key=lambda i: parts[i].ids.numel() > BATCH_ROWS)
    if order != sorted(order):  # small parts first: the linear layers' segments are contiguous
        results = forward_parts(trunk, [parts[i] for i in order])
        return [results[order.index(i)] for i in range(len(parts))]
    body = trunk.model
    shapes = [tuple(part.ids.shape) for part in parts]
    large = [part.ids.numel() > BATCH_ROWS for part in parts]
    cuts = _segments([rows * m for rows, m in shapes], large)
    flat = torch.cat([part.ids.reshape(-1) for part in parts])  # [T]
    device = flat.device
    positions = torch.cat(
        [
            (part.cache.get_seq_length() + torch.tensor(part.depths(), device=device)).repeat(rows)
            for part, (rows, _) in zip(parts, shapes, strict=True)
        ]
    )
    trees = [
        None if part.parents is None else cpu_kernels.tree_masks(part.parents) for part in parts
    ]
    x = body.embed_tokens(flat)[None]  # [1, T, hidden]
    cos, sin = body.rotary_emb(x, positions[None])
    small_own, large_own = own_attention(body), rows_alone(body)
    own = [large_own if big else small_own for big in large]  # cpu_kernels.attend, per part
    # the own parts on caches with buffers attend in one call per layer, which also writes
    # their new keys and values into the caches
    fused = [
        mine and isinstance(part.cache, KVCache) and part.cache.reserve(m)
        for part, (_, m), mine in zip(parts, shapes, own, strict=True)
    ]
    masks = [
        None if done else _mask(part, m, mine, tree, device)
        for part, (_, m), mine, done, tree in zip(parts, shapes, own, fused, trees, strict=True)
    ]
    metas = _fused_meta(parts, shapes, fused, trees, trunk.config.num_hidden_layers)
    # every part fused: the kernel applies the rotary embedding too, to the same bits
    rotary = (cos[0].contiguous(), sin[0].contiguous()) if all(fused) else None
    for index, layer in enumerate(body.layers[: trunk.config.num_hidden_layers]):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = (
            _each(proj, h, cuts).view(1, flat.numel(), -1, attn.head_dim).transpose(1, 2)
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        if rotary is None:
            q, k = apply_rotary_pos_emb(q, k, cos, sin)  # [1, heads, T, head_dim]
        out = x.new_empty(flat.numel(), q.shape[1] * attn.head_dim)
        if metas is not None:
            q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
            cpu_kernels.attend_parts(q, k, v, metas[index], attn.scaling, out, rotary)
        at = 0
        for part, (rows, m), mask, mine, done in zip(parts, shapes, masks, own, fused, strict=True):
            span = slice(at, at + rows * m)
            at += rows * m
            if done:
                continue
            q_i, k_i, v_i = (_rows(t[0, :, span], rows, m) for t in (q, k, v))
            k_i, v_i = part.cache.update(k_i, v_i, attn.layer_idx)  # [rows, kv heads, past+m, hd]
            if mine and mask is None and cpu_kernels.can_attend(q_i, k_i):
                out[span] = cpu_kernels.attend(q_i, k_i, v_i, attn.scaling).view(rows * m, -1)
                continue
            result = _attend(q_i, k_i, v_i, mask, attn.scaling)  # [rows, heads, m, head_dim]
            out[span] = result.transpose(1, 2).reshape(rows * m, -1)
        x = x + _each(attn.o_proj, out[None], cuts)
        x = x + _each(layer.mlp, layer.post_attention_layernorm(x), cuts)
    for part, (_, m), done in zip(parts, shapes, fused, strict=True):
        if done:
            part.cache.extend(m)
    hidden = body.norm(x)[0]  # [T, hidden]
    return _split_logits(trunk, hidden, parts, shapes, large)


def _fused_meta(parts, shapes, fused, trees, layers: int) -> torch.Tensor | None:
    """[layers, fused parts, 9] int64: each layer's `cpu_kernels.part_meta` rows for the fused
    parts (None: there are none). Their buffers have room for the new positions (`reserve`);
    `trees` (kept alive by the caller) are the tree parts' masks."""
    if not any(fused):
        return None
    rows_of_layers = []
    for layer in range(layers):
        rows, at = [], 0
        for part, (n, m), done, tree in zip(parts, shapes, fused, trees, strict=True):
            if done:
                length = part.cache.get_seq_length(layer) + m
                meta = cpu_kernels.part_meta(at, n, m, length, *part.cache.buffers(layer), tree)
                rows.append(meta)
            at += n * m
        rows_of_layers.append(rows)
    return torch.tensor(rows_of_layers, dtype=torch.int64)


def takes_trees(trunk) -> bool:
    """Whether a tree step (`Part.parents`) of this trunk computes what plain decoding's steps
    would, bit for bit: where its decode-sized parts attend through the kernels."""
    return supports_ragged(trunk) and own_attention(trunk.model)


def own_attention(body) -> bool:
    """Whether the decode-sized parts of this trunk body attend through `cpu_kernels.attend`:
    a low-bit (int8, int4) trunk where the kernels build. A float32 trunk keeps torch's
    attention, the reference path."""
    return is_lowbit(body.layers[0].self_attn.q_proj) and cpu_kernels.unavailable() is None


def rows_alone(body) -> bool:
    """Whether every part of this trunk body, prefill chunks too, takes the low-bit products and
    Flywheel's attention: a low-bit trunk loaded `exact` where the kernels build."""
    q_proj = body.layers[0].self_attn.q_proj
    return own_attention(body) and getattr(q_proj, "every_row", False)


def _segments(sizes: list[int], large: list[bool]) -> list[tuple[int, int]]:
    """Row ranges of the flattened parts (of `sizes` rows, the small ones first) that go through
    a linear layer together: all the small parts, then each large one alone."""
    small = sum(n for n, big in zip(sizes, large, strict=True) if not big)
    cuts, at = ([(0, small)] if small else []), small
    for n, big in zip(sizes, large, strict=True):
        if big:
            cuts.append((at, at + n))
            at += n
    return cuts


def _each(module: nn.Module, x: torch.Tensor, cuts: list[tuple[int, int]]) -> torch.Tensor:
    """`module` over x [1, T, features], segment by segment."""
    if len(cuts) == 1:
        return module(x)
    return torch.cat([module(x[:, a:b]) for a, b in cuts], dim=1)


def _rows(t: torch.Tensor, rows: int, m: int) -> torch.Tensor:
    """[heads, rows*m, head_dim] -> [rows, heads, m, head_dim]."""
    return t.reshape(t.shape[0], rows, m, t.shape[-1]).transpose(0, 1)


def _attend(q, k, v, mask, scale: float) -> torch.Tensor:
    """Attention of q [rows, heads, m, hd] over k, v [rows, kv heads, past + m, hd].

    With a mask (or one position): one causal call. Without (a part marked `alone`): each new
    position in a call of its own over the keys up to itself, exactly the call a decode step at
    that position makes. A multi-row causal call rounds differently from a one-row call (the
    kernel's products change with the row count), and under int8 (bf16 outputs of the linear
    layers) such a difference can flip a greedy token; alone, a verify step's rows are bit for
    bit plain decoding's steps. The price: each position reads the KV cache again.
    """
    sdpa = nn.functional.scaled_dot_product_attention
    m = q.shape[-2]
    if mask is not None or m == 1:
        return sdpa(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    past = k.shape[-2] - m
    return torch.cat(
        [
            sdpa(q[:, :, j : j + 1], k[:, :, : past + j + 1], v[:, :, : past + j + 1],
                 scale=scale, enable_gqa=True)
            for j in range(m)
        ],
        dim=2,
    )  # fmt: skip


def _mask(part: Part, m: int, mine: bool, tree, device) -> torch.Tensor | None:
    """The mask of a part that attends outside the fused kernel call: its tree's, else none for
    one that attends position by position (`alone`, or through `cpu_kernels.attend`), else
    causal."""
    if tree is not None:
        return _tree_mask(tree, part.cache, device)
    return None if part.alone or mine else _causal(m, part.cache, device)


def _causal(m: int, cache, device) -> torch.Tensor | None:
    """A part's mask: one new position sees everything; several see the cache and each other
    up to themselves."""
    if m == 1:
        return None
    total = cache.get_seq_length() + m
    return torch.ones(m, total, dtype=torch.bool, device=device).tril(total - m)


def _tree_mask(tree: torch.Tensor, cache, device) -> torch.Tensor:
    """A tree part's mask (off the kernels' path, where it attends in one masked call): every
    new position sees the cache and its own branch (`cpu_kernels.tree_masks`)."""
    m = len(tree)
    bits = (tree[:, None] >> torch.arange(m)[None]) & 1  # [m, m]
    past = torch.ones(m, cache.get_seq_length(), dtype=torch.bool)
    return torch.cat([past, bits.bool()], dim=1).to(device)


def _split_logits(trunk, hidden, parts, shapes, large):
    """lm_head once over every position some part needs logits for, then split per part."""
    wanted, spans, at = [], [], 0
    for part, (rows, m) in zip(parts, shapes, strict=True):
        states = hidden[at : at + rows * m].view(rows, m, -1)
        at += rows * m
        wanted.append((states[:, -1:] if part.last_only else states).reshape(-1, states.shape[-1]))
        spans.append(states)
    segments = _segments([len(w) for w in wanted], large)
    logits = _each(trunk.lm_head, torch.cat(wanted)[None], segments)[0]  # [positions, vocab]
    results, at = [], 0
    for part, states in zip(parts, spans, strict=True):
        rows, m = states.shape[:2]
        n = rows * (1 if part.last_only else m)
        results.append((logits[at : at + n].view(rows, n // rows, -1), states))
        at += n
    return results


class Forward(Step):
    """A request's trunk forward pass, yielded by its generator to whatever runs its steps: the
    engine's loop runs those of several requests on the same weights in one pass (`run_batch`),
    a caller's thread runs it alone. The generator reads `result()` when it resumes."""

    def __init__(
        self,
        model,
        ids: torch.Tensor,
        cache,
        last_only: bool = False,
        alone: bool = False,
        parents: list[int] | None = None,
    ) -> None:
        self.model = model  # a LoadedModel
        self.part = Part(ids, cache, last_only, alone, parents)
        self._result: tuple[torch.Tensor, torch.Tensor] | None = None
        self._error: BaseException | None = None

    @property
    def key(self) -> object:
        return self.model

    @property
    def rows(self) -> int:
        return self.part.ids.numel()

    @classmethod
    def run_batch(cls, steps: list[Forward]) -> None:
        try:
            with torch.inference_mode():
                results = steps[0].model.forward_parts([step.part for step in steps])
        except Exception as exc:  # noqa: BLE001 - every request of the batch raises it
            for step in steps:
                step._error = exc
        else:
            for step, result in zip(steps, results, strict=True):
                step._result = result

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [rows, m or 1, vocab], hidden [rows, m, hidden]), or the pass's error."""
        if self._error is not None:
            raise self._error
        assert self._result is not None, "the step has not run"
        return self._result


class Admission(Step):
    """A request about to prefill a prompt of `rows` > loop.BATCH_ROWS tokens. Running it does
    nothing: it makes the request wait for its turn among its lane's prefills (large steps go one
    at a time, first come first), so that its prefix-cache lookup, made after it, sees what the
    requests before it stored. The samples of an RL group, or turns sent together, then prefill their shared prompt
    once instead of each computing it at the same time."""

    def __init__(self, model, rows: int) -> None:
        self.model = model
        self._rows = rows

    @property
    def key(self) -> object:
        return (Admission, self.model)

    @property
    def rows(self) -> int:
        return self._rows

    @classmethod
    def run_batch(cls, steps: list[Admission]) -> None:
        pass

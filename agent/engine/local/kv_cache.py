"""A request's KV cache in buffers with room to grow: a decode step writes one position in place.

Why: `transformers`' `DynamicCache` grows by concatenation, so every decode step copies the
whole cache of every layer, as much memory traffic as attention reading it, and more of it the
longer the context. `KVCache` allocates each layer's keys
and values once, for the length the engine expects (prompt + max tokens), and writes new
positions into them; it grows (by half again) only past that. Attention reads views of the
filled part.

It offers the `DynamicCache` methods the engine uses (update, get_seq_length, crop,
batch_repeat_interleave, batch_select_indices, layers[i].keys/values) and `keep_new` (a tree of
drafts keeps a branch), and is what `LoadedModel.new_cache` returns for trunks that batched.py
runs; other trunks keep DynamicCache.
`reserve`, `buffers` and `extend` let a kernel write new positions itself
(`cpu_kernels.attend_parts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROUND = 128  # capacities are multiples of this many positions


@dataclass
class LayerView:
    keys: torch.Tensor | None  # [rows, kv heads, length, head_dim], a view of the buffer
    values: torch.Tensor | None


class KVCache:
    """Per-layer key/value buffers [rows, kv heads, capacity, head_dim]; all rows share one
    length."""

    def __init__(self, num_layers: int, capacity: int = 0) -> None:
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._length = [0] * num_layers
        self.capacity_hint = capacity  # positions to allocate at the first update

    def update(
        self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *_
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `keys`/`values` [rows, kv heads, m, head_dim] to layer `layer_idx`; returns
        views of every position filled."""
        start = self._length[layer_idx]
        end = start + keys.shape[-2]
        buffer = self._keys[layer_idx]
        if buffer is None or end > buffer.shape[-2]:
            self._grow(layer_idx, keys, end)
        self._keys[layer_idx][:, :, start:end] = keys
        self._values[layer_idx][:, :, start:end] = values
        self._length[layer_idx] = end
        return self._keys[layer_idx][:, :, :end], self._values[layer_idx][:, :, :end]

    def _grow(self, layer: int, like: torch.Tensor, needed: int) -> None:
        old = self._keys[layer]
        size = (
            max(needed, self.capacity_hint) if old is None else max(needed, old.shape[-2] * 3 // 2)
        )
        size = -(-size // ROUND) * ROUND
        rows, heads, _, dim = like.shape
        for buffers in (self._keys, self._values):
            new = like.new_empty(rows, heads, size, dim)
            if buffers[layer] is not None:
                length = self._length[layer]
                new[:, :, :length] = buffers[layer][:, :, :length]
            buffers[layer] = new

    def reserve(self, m: int) -> bool:
        """Room for m more positions in every layer's buffers, grown where needed, for a kernel
        that writes them itself (`buffers`, then `extend`). False for a cache whose buffers do
        not exist yet (its first `update` allocates them)."""
        if any(buffer is None for buffer in self._keys):
            return False
        for layer, buffer in enumerate(self._keys):
            if self._length[layer] + m > buffer.shape[-2]:
                self._grow(layer, buffer, self._length[layer] + m)
        return True

    def buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s whole key and value buffers [rows, kv heads, capacity, head_dim]."""
        return self._keys[layer], self._values[layer]

    def extend(self, m: int) -> None:
        """Count m more positions in every layer, written into the buffers by a kernel."""
        self._length = [length + m for length in self._length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._length[layer_idx]

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions (negative: drop that many from the end)."""
        for i, length in enumerate(self._length):
            keep = length + max_length if max_length < 0 else max_length
            self._length[i] = max(0, min(length, keep))

    def keep_new(self, m: int, kept: list[int]) -> None:
        """Of the last m positions (a tree step's rows), keep those at offsets `kept`
        (increasing), moved up in that order; the rest are dropped."""
        offsets = torch.tensor(kept, device=self._keys[0].device)
        for layer, length in enumerate(self._length):
            start = length - m
            at = offsets + start
            for buffers in (self._keys, self._values):
                buffers[layer][:, :, start : start + len(kept)] = buffers[layer][:, :, at]
            self._length[layer] = start + len(kept)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row becomes `repeats` rows (the samples of a group share a prompt)."""
        self._map(lambda buffer: buffer.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only these rows (finished samples leave the batch)."""
        self._map(lambda buffer: buffer[indices])

    def _map(self, fn) -> None:
        for buffers in (self._keys, self._values):
            for i, buffer in enumerate(buffers):
                if buffer is not None:
                    buffers[i] = fn(buffer)

    @property
    def layers(self) -> list[LayerView]:
        """Each layer's filled keys and values (None before its first update)."""
        return [
            LayerView(None, None) if k is None else LayerView(k[:, :, :length], v[:, :, :length])
            for k, v, length in zip(self._keys, self._values, self._length, strict=True)
        ]


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_reusing = False


def reuse_freed_memory(threshold: int = 256 << 20) -> bool:
    """Have glibc keep freed blocks under `threshold` bytes for reuse (a server's choice).

    Why: every request allocates KV buffers and activations of a few hundred KB to a few MB and
    frees them when it ends. glibc serves blocks that large with fresh `mmap`s and unmaps them on
    free, so each request faults in new pages, which is slow in a virtual machine. Blocks under
    `threshold` now come from the heap and are reused. Process-wide; True where it applied (glibc
    only).
    """
    global _reusing
    if _reusing:
        return True
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    _reusing = bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 4 * threshold)
    )
    return _reusing

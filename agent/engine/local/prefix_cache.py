"""Prefix caching: reuse the keys and values of the longest prompt prefix already computed.

An agent re-sends its whole conversation every turn, an RL group sends one prompt several times,
and an editor asks for completions in the same file again and again: most of each prompt was
prefilled before. After a prefill, the engine stores the prompt's per-layer keys and values
(views of the tensors the request's cache holds: a cache only ever writes positions past its
prompt, so those are never written again; an entry counts the whole tensors it keeps alive). Before a prefill, it looks for the stored prompt sharing the
longest token prefix with the new one, starts the new cache from those keys and values, and runs
the trunk over the rest only.

How this compares: vLLM hashes fixed-size blocks (a block's hash chains its parent's) and SGLang
keeps a radix tree over tokens; both share KV memory between requests at block or token
granularity on a GPU. Here entries are whole prompts, matched token by token against at most a
few dozen entries (a linear scan is microseconds at that size), and an entry whose tokens are a
prefix of a newer one is dropped when the newer one is stored, so an agent conversation keeps one
entry that grows turn by turn. Memory is bounded in bytes, evicting the least recently used.

Lossless: the cached keys and values are the ones a full prefill computes for those positions
(causal attention: position i depends only on tokens <= i); only the floating-point grouping of
the remaining positions' matmuls differs.

A finished one-sample request stores its prompt and output the same way, so an agent's next
turn, which starts with the last one's conversation and reply, finds both; how far the match
runs into the reply depends on the rendered conversation re-tokenising it to the same tokens.

What it does not do: share memory between entries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

MIN_MATCH = 16  # shorter common prefixes are not worth a copy


@dataclass
class Entry:
    tokens: tuple[int, ...]
    ids: np.ndarray  # the same tokens, for matching
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, h, len, d]
    nbytes: int


@dataclass
class Stats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found in the cache
    entries: int = 0
    bytes: int = 0
    evictions: int = 0


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two id arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Prompt keys/values by token prefix, within `max_bytes`; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()  # LRU order
        self._lock = threading.Lock()
        self.stats = Stats()

    def lookup(self, tokens: list[int], limit: int) -> tuple[int, Entry | None]:
        """The longest stored prefix of `tokens`, at most `limit` tokens long: (length, entry);
        (0, None) when none reaches MIN_MATCH. Counts the query in the stats."""
        ids = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            self.stats.queries += len(tokens)
            best, found = 0, None
            for key, entry in self._entries.items():
                if len(key) <= best:
                    continue
                n = min(_common_prefix(entry.ids, ids), limit)
                if n > best:
                    best, found = n, entry
            if found is None or best < MIN_MATCH:
                return 0, None
            self._entries.move_to_end(found.tokens)
            self.stats.hits += best
            return best, found

    def store(self, tokens: list[int], cache) -> None:
        """Remember the keys/values `cache` (a one-row KV cache) holds for `tokens`."""
        if self.max_bytes <= 0 or len(tokens) < MIN_MATCH:
            return
        layers = []
        for layer in cache.layers:
            keys, values = layer.keys, layer.values
            if keys is None or keys.shape[0] != 1 or keys.shape[-2] < len(tokens):
                return  # not a one-row cache covering the prompt: nothing safe to keep
            layers.append((keys[..., : len(tokens), :], values[..., : len(tokens), :]))
        nbytes = sum(k.untyped_storage().nbytes() + v.untyped_storage().nbytes() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        key = tuple(tokens)
        with self._lock:
            for old in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
                self._drop(old)  # covered by the new entry
            self._entries[key] = Entry(key, np.asarray(key, dtype=np.int64), layers, nbytes)
            self.stats.bytes += nbytes
            while self.stats.bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
                self.stats.evictions += 1
            self.stats.entries = len(self._entries)

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self.stats.bytes -= entry.nbytes
        self.stats.entries = len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.stats.bytes = self.stats.entries = 0


def restore(cache, entry: Entry, length: int) -> None:
    """Fill an empty KV cache with the first `length` positions of `entry`."""
    for i, (keys, values) in enumerate(entry.layers):
        cache.update(keys[..., :length, :], values[..., :length, :], i)

"""Flywheel's CPU kernels for decode-sized steps (cpu_kernels.c), built when first needed.

- `int8_mm`, the int8 weight-only product of `Int8Linear` for a few rows. Why our own: torch's
  `_weight_int8pack_mm` splits its work over blocks of 4 rows first, so on 2 threads a verify
  step over 4 drafts (5 rows) hands one thread 4 rows and the other 1, each reading every
  weight: it costs far more than a decode step. Ours reads each weight once for all the rows and
  splits the output columns between threads. Its sums are exact integer sums of int16
  activations (one scale per row) times the int8 weights, whose columns are evened out first
  (`quantize_int8`).
- `attend`, causal attention of a few new positions over a KV cache, each position's arithmetic
  on its own. Why our own: a multi-position attention call rounds differently from the
  one-position call a decode step makes, so a verify step's greedy tokens could part from plain
  decoding's at a near-tie; computing every position alone through torch takes a call per
  position. Ours computes every position's own sums in one call, reading each key and value
  once for a tile of queries that share a KV head (the heads of a group, a verify step's
  positions).

So a row's result never depends on what shares its step: speculative decoding and batching
reproduce plain decoding's steps bit for bit (`batched.forward_parts` uses both).

They need a C compiler (`cc`, or $CC) and a CPU with AVX-512 VNNI; the source is compiled once
per process into a temporary folder (a fraction of a second). Elsewhere, or with
FLYWHEEL_CPU_KERNELS=torch, `unavailable()` says why and the engine keeps torch's kernels. The
OpenMP runtime is torch's own (the library asks for libgomp.so.1, which torch has loaded by
then), so the two share one thread pool.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_kernels.c")
K_MULTIPLE = 16  # int8_mm quantizes activations 16 at a time
CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")
DISABLE_ENV = "FLYWHEEL_CPU_KERNELS"  # "torch": keep torch's kernels
# keys from which one row's decode step attends on every thread: over a long context, reading
# the keys and values is worth a second core
LONG_CONTEXT = 2048


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the library, None), or (None, why not)."""
    if os.environ.get(DISABLE_ENV) == "torch":
        return None, f"{DISABLE_ENV}=torch"
    missing = [f for f in CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        return None, f"this CPU lacks {', '.join(missing)}"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc) on PATH"
    with tempfile.TemporaryDirectory(prefix="flywheel-kernels-") as folder:
        target = Path(folder) / "cpu_kernels.so"
        command = [compiler, "-O3", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-fopenmp",
                   "-ffp-contract=off", "-fPIC", "-shared", str(SOURCE), "-o", str(target),
                   "-lm"]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"compiling cpu_kernels.c failed: {error}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"compiling cpu_kernels.c failed: {last}"
        try:
            library = ctypes.CDLL(str(target))
        except OSError as error:
            return None, f"loading cpu_kernels.c's library failed: {error}"
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.flywheel_int8_mm.argtypes = [pointer, pointer, size, size, pointer, pointer, size,
                                         pointer, ctypes.c_int]  # fmt: skip
    library.flywheel_attend.argtypes = [pointer, size, size, size, size, size, pointer, pointer,
                                        size, size, size, size, pointer, pointer, pointer, size,
                                        ctypes.c_float, pointer, ctypes.c_int, size]  # fmt: skip
    library.flywheel_int8_mm.restype = library.flywheel_attend.restype = ctypes.c_int
    return library, None


def unavailable() -> str | None:
    """Why this process cannot use the kernels (None: it can)."""
    return _load()[1]


def _library() -> ctypes.CDLL:
    library, why = _load()
    if library is None:
        raise RuntimeError(why)
    return library


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [out, in] int8, scales [out] float32, columns [in] float32) with W ≈ q * scales *
    columns, for `int8_mm`.

    Why the columns: a weight matrix's few input columns of large weights set every row's int8
    step, and the other columns lose their precision to them. Dividing each column by the
    square root of its largest magnitude (relative to their mean) evens them out; `int8_mm`
    multiplies the activations by the same factors, where their int16 steps are fine enough.
    `int8_mm` takes q packed by `pack_int8`."""
    w = weight.detach().float()
    columns = w.abs().amax(dim=0).clamp(min=1e-12).sqrt()
    columns = columns / columns.mean()
    even = w / columns
    scales = even.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(even / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales, columns


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """`quantize_int8`'s q [out, in] in the layout `int8_mm` reads: blocks of 32 output columns
    (the last padded with zeros), each block's weights for k = 2p and 2p + 1 side by side for
    the 32 columns -> [ceil(out / 32), in / 2, 64]. One block's weights for a pair of k widen to
    two vectors of 16 columns, which every row multiplies by its broadcast pair of activations:
    the sums stay in their lanes, with no horizontal reductions."""
    n, k = q.shape
    blocks = -(-n // 32)
    padded = torch.zeros(blocks * 32, k, dtype=torch.int8)
    padded[:n] = q
    return padded.view(blocks, 32, k // 2, 2).permute(0, 2, 1, 3).reshape(blocks, k // 2, 64)


def int8_mm(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, columns: torch.Tensor
) -> torch.Tensor:
    """(x [M, K] float32 * columns [K]) @ (q [N, K] int8 * scales [N])^T -> [M, N] float32, for
    q, scales and columns from `quantize_int8`, q packed by `pack_int8`. The caller checks
    `unavailable()` and K % K_MULTIPLE."""
    library = _library()
    x = x.contiguous()
    rows, k = x.shape
    n = scales.shape[0]
    y = torch.empty(rows, n, dtype=torch.float32)
    status = library.flywheel_int8_mm(
        x.data_ptr(), columns.data_ptr(), rows, k, packed.data_ptr(), scales.data_ptr(), n,
        y.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("int8_mm: out of memory for the quantized activations")
    return y


def can_attend(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether `attend` takes these: float32 on the CPU, a head size of 16..128 in steps of 16,
    keys with contiguous positions."""
    hd = q.shape[-1]
    return (
        q.dtype == k.dtype == torch.float32
        and q.device.type == k.device.type == "cpu"
        and hd % 16 == 0
        and 16 <= hd <= 128
        and k.stride(-1) == 1
        and k.stride(-2) == hd
    )


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q [rows, heads, m, hd] over k, v [rows, kv heads, past + m, hd] (the
    last m positions are q's own) -> [rows, m, heads * hd]. The caller checks `can_attend`."""
    rows, heads, m, hd = q.shape
    q = q.transpose(1, 2).contiguous()  # [rows, m, heads, hd]: token r * m + j
    if v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    meta = part_meta(0, rows, m, k.shape[2], k, v)
    out = torch.empty(rows, m, heads * hd, dtype=torch.float32)
    _attend(q, hd, heads * hd, heads, hd, k.shape[1], None, torch.tensor([meta]), scale, out, None)
    return out


def part_meta(
    offset: int,
    rows: int,
    m: int,
    length: int,
    k: torch.Tensor,
    v: torch.Tensor,
    tree: torch.Tensor | None = None,
) -> list[int]:
    """One part's entry for `attend_parts`: its rows * m new positions are tokens offset.. of
    the step, and k, v [rows, kv heads, >= length, hd] (the same strides, positions contiguous)
    are its cache's buffers, whose first `length` positions it sees (its new ones last). With
    `tree` ([m] int64, from `tree_masks`), new position j sees the cache's earlier positions and
    the new ones whose bits are set in tree[j], instead of every new one up to itself; the
    caller keeps `tree` alive through the call."""
    pointer = 0 if tree is None else tree.data_ptr()
    return [offset, rows, m, length, k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), pointer]


def tree_masks(parents: list[int]) -> torch.Tensor:
    """[m] int64 bit masks for `part_meta`'s tree: position j sees itself and its ancestors, where
    parents[j] is the position before it on its branch (-1: none, the first)."""
    if len(parents) > 64:
        raise ValueError("a tree step has at most 64 new positions")
    masks: list[int] = []
    for j, parent in enumerate(parents):
        if not -1 <= parent < j:
            raise ValueError(f"position {j}'s parent {parent} is not an earlier position")
        masks.append((1 << j) | (masks[parent] if parent >= 0 else 0))
    # the bits as int64 (position 63's bit is the sign bit)
    return torch.tensor([mask - (1 << 64) if mask >> 63 else mask for mask in masks])


def attend_parts(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    meta: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Causal attention of several parts of a step, each over its own KV cache, in one call.

    q [1, heads, T, hd], k_new, v_new [1, kv heads, T, hd]: the step's queries and new keys and
    values (last dimension contiguous); meta [parts, 9] int64, each row a `part_meta` whose
    length counts its new positions. The new keys and values are written into the parts'
    caches first (the caller then counts them in), and token t's output goes to out [T, heads *
    hd] (float32, contiguous) row t; tokens of no part are left as they were. With `rotary`,
    (cos, sin) [T, hd] float32 contiguous, q and k_new come before Llama's rotary embedding,
    which the kernel applies as `apply_rotary_pos_emb` would, to the same bits."""
    heads, hd = q.shape[1], q.shape[3]
    new = (k_new, v_new, k_new.stride(1), k_new.stride(2), v_new.stride(1), v_new.stride(2))
    _attend(q, q.stride(1), q.stride(2), heads, hd, k_new.shape[1], new, meta, scale, out, rotary)


def _attend(q, q_head, q_tok, heads, hd, kv_heads, new, meta, scale, out, rotary) -> None:
    library = _library()
    k_new, v_new, *new_strides = new or (None, None, 0, 0, 0, 0)
    status = library.flywheel_attend(
        q.data_ptr(), q_head, q_tok, heads, hd, kv_heads,
        None if k_new is None else k_new.data_ptr(), None if v_new is None else v_new.data_ptr(),
        *new_strides, *(None, None) if rotary is None else (t.data_ptr() for t in rotary),
        meta.data_ptr(), meta.shape[0], scale, out.data_ptr(), torch.get_num_threads(),
        LONG_CONTEXT,
    )  # fmt: skip
    if status != 0:
        raise MemoryError("attend: out of memory for the attention scores")

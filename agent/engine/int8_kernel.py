"""Flywheel's int8 weight-only product for a few rows (int8_mm.c), built when first needed.

Why our own: torch's `_weight_int8pack_mm` splits its work over blocks of 4 rows first, so on
2 threads a verify step over 4 drafts (5 rows) hands one thread 4 rows and the other 1, each
reading every weight: it costs about twice a decode step. int8_mm.c reads each weight once for
all the rows and splits the output columns between threads. Its sums are exact integer sums of
int16 activations (one scale per row) times the int8 weights, so a row's output is the same
whatever rows share its call: speculative decoding and batching reproduce plain decoding's
steps bit for bit.

It needs a C compiler (`cc`, or $CC) and a CPU with AVX-512 VNNI; the source is compiled once per
process into a temporary folder (a fraction of a second). Elsewhere `unavailable()` says why and
`Int8Linear` keeps torch's kernel. The OpenMP runtime is torch's own (the library asks for
libgomp.so.1, which torch has loaded by then), so the two share one thread pool.
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

SOURCE = Path(__file__).with_name("int8_mm.c")
K_MULTIPLE = 32  # the kernel reads activations and weights 32 at a time
CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")
DISABLE_ENV = "FLYWHEEL_INT8_KERNEL"  # "torch": keep torch's kernel


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
    import torch  # noqa: F401  (torch's libgomp.so.1 is loaded before ours asks for it)

    with tempfile.TemporaryDirectory(prefix="flywheel-int8-") as folder:
        target = Path(folder) / "int8_mm.so"
        command = [compiler, "-O3", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-fopenmp",
                   "-fPIC", "-shared", str(SOURCE), "-o", str(target), "-lm"]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"compiling int8_mm.c failed: {error}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"compiling int8_mm.c failed: {last}"
        try:
            library = ctypes.CDLL(str(target))
        except OSError as error:
            return None, f"loading int8_mm.c's library failed: {error}"
    fn = library.flywheel_int8_mm
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [pointer, size, size, pointer, pointer, size, pointer, ctypes.c_int]
    fn.restype = ctypes.c_int
    return library, None


def unavailable() -> str | None:
    """Why this process cannot use the kernel (None: it can)."""
    return _load()[1]


def int8_mm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 @ (weight [N, K] int8 * scales [N] float32)^T -> [M, N] float32.

    The caller checks `unavailable()` first and K % K_MULTIPLE == 0."""
    library, why = _load()
    if library is None:
        raise RuntimeError(why)
    x = x.contiguous()
    rows, k = x.shape
    n = weight.shape[0]
    y = torch.empty(rows, n, dtype=torch.float32)
    status = library.flywheel_int8_mm(
        x.data_ptr(), rows, k, weight.data_ptr(), scales.data_ptr(), n, y.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("int8_mm: out of memory for the quantized activations")
    return y

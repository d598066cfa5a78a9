"""What every benchmark writes beside its figures: the machine it ran on, and the JSON file.

from benchmarks.record import machine, write_json
write_json(args.json, {"benchmark": "int8", "machine": machine(torch_threads=2), ...})
"""

from __future__ import annotations

import json
import platform
from pathlib import Path


def machine(**extra) -> dict:
    """The platform, processor and Python a figure was measured with, plus `extra` (torch
    threads, library versions)."""
    return dict(
        platform=platform.platform(),
        processor=platform.processor() or platform.machine(),
        python=platform.python_version(),
        **extra,
    )


def torch_machine(**extra) -> dict:
    """`machine()` with torch's thread count and torch's and transformers' versions."""
    import torch
    import transformers

    return machine(
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        **extra,
    )


def write_json(path: str | Path, report: dict) -> Path:
    """Write `report` to `path` (its folder made if missing) and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return path

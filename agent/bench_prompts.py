"""The standard-library files `flywheel bench engine` builds its prompts from.

The benchmark (benchmarks/engine/) turns them into its *apply* and *free* workloads; training
(training/code_apply.py, training/self_text.py) leaves them out of what it trains on, so that the
benchmark decodes text the model has never seen. Both import these names from here: product code
never imports from `benchmarks`.
"""

from __future__ import annotations

import sys
from pathlib import Path

STDLIB = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
APPLY_FILE = "genericpath.py"  # ~155 lines, rewritten with a one-line change (fast apply)
FREE_PROMPTS = [
    ("textwrap.py", 40),  # (stdlib file, lines of it used as the prompt)
    ("json/decoder.py", 60),
]


def benched_files() -> set[str]:
    """The files above, relative to STDLIB: what training must not use."""
    return {APPLY_FILE, *(name for name, _ in FREE_PROMPTS)}

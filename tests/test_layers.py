"""Import direction: telemetry is the bottom layer, agent sits on it, the language server
on agent, and training on everything. An arrow pointing up makes a layer impossible to use or test
without the ones above it. The only way up is the command line's lazy dispatch table
(`agent/cli.py`), which names modules as strings and imports them when a command runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Measurement code (benchmarks/) sits above every package: it imports what it measures, and no
# product code imports it.
FORBIDDEN = {
    "telemetry": {"agent", "lsp", "training", "benchmarks"},
    "agent": {"lsp", "training", "benchmarks"},
    "lsp": {"training", "benchmarks"},
    "training": {"benchmarks"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down(package: str):
    wrong = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in sorted((REPO / package).rglob("*.py"))
        for line, module in _imports(path)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert not wrong, "\n".join(wrong)


def test_an_import_from_benchmarks_in_training_is_caught(tmp_path):
    """The check sees both forms of import, at any depth of a function."""
    source = tmp_path / "stage.py"
    source.write_text(
        "import benchmarks.engine\n"
        "def gate():\n    from benchmarks.infill import run_model\n"
        "from training.data import PackedTokens\n"
    )
    found = [module for _, module in _imports(source)]
    assert [m for m in found if m.split(".")[0] in FORBIDDEN["training"]] == [
        "benchmarks.engine",
        "benchmarks.infill",
    ]

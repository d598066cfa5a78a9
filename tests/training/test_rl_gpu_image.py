"""`make rl-gpu`'s image check (training/rl/gpu_image.py) and its wheel list: the GPU machine's
image plus the carried wheels must hold everything the measured run imports, and what is missing
must be named with its fix before anything runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from training.rl import gpu_image

ROOT = Path(__file__).parents[2]
IMAGE = ROOT / "training" / "rl" / "gpu_image_packages.txt"

# Imported only where this machine has them, never needed by the run (transformers' hub kernels,
# langsmith's tracing), or part of the project and the test runner.
OPTIONAL = {"kernels", "opentelemetry_api", "flywheel", "pytest", "_pytest", "iniconfig"}

# A subprocess that refuses every third-party module whose distribution is neither on the image
# nor carried, then imports what the measured run imports on its way to its first rollout.
BLOCKED_IMPORTS = textwrap.dedent(
    """
    import importlib.abc, importlib.metadata, re, sys
    allowed = set(sys.argv[1].split(","))
    owners = importlib.metadata.packages_distributions()
    norm = lambda n: re.sub(r"[-_.]+", "_", n).lower()
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            dists = owners.get(top)
            if "." in name or top in sys.stdlib_module_names or not dists:
                return None
            if not any(norm(d) in allowed for d in dists):
                raise ModuleNotFoundError(f"{top} (from {dists}) is neither on the image nor carried")
    sys.meta_path.insert(0, Block())
    import matplotlib.pyplot, peft
    import training.rl.measured_run, training.rl.environments, training.rl.policy
    import agent.harness, agent.harness.scratch, agent.engine.local.engine, telemetry.rewards
    import training.tasks.generation, training.tasks.real, training.tasks.oracle
    print("imports ok")
    """
)


def _names(path: Path) -> set[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {gpu_image.normalized(line.split("==")[0]) for line in lines if line}


def test_the_image_and_the_carried_wheels_cover_what_the_run_imports():
    allowed = _names(IMAGE) | _names(gpu_image.WHEEL_LIST) | OPTIONAL
    run = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS, ",".join(sorted(allowed))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0 and "imports ok" in run.stdout, run.stderr[-2000:]
    # and the check works: without the carried wheels, langgraph is refused
    run = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS, ",".join(sorted(_names(IMAGE) | OPTIONAL))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode != 0 and "is neither on the image nor carried" in run.stderr


def test_no_carried_wheel_is_already_on_the_image_except_for_its_version():
    assert _names(gpu_image.WHEEL_LIST) & _names(IMAGE) == {"typing_extensions"}  # pydantic's


def test_a_package_neither_on_the_image_nor_carried_is_named_with_its_fix(tmp_path, monkeypatch):
    lines: list[str] = []
    assert gpu_image.package_problems(tmp_path, lines.append) == []  # all installed here
    monkeypatch.setattr(gpu_image, "installed", lambda name: None)
    problems = gpu_image.package_problems(tmp_path, lines.append)
    assert len(problems) == len(gpu_image.wanted())
    assert "langgraph 1.2.24 is neither on the image nor carried: run `make rl-gpu-wheels`" in (
        "\n".join(problems)
    )
    (tmp_path / "langgraph-0.1.0-py3-none-any.whl").write_bytes(b"")
    problems = gpu_image.package_problems(tmp_path, lines.append)
    assert f"{tmp_path}/ carries langgraph 0.1.0, not 1.2.24" in "\n".join(problems)


def test_bubblewrap_missing_is_one_line_unless_carried_or_not_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_image.shutil, "which", lambda name: None)
    problem = gpu_image.bwrap_problem(tmp_path, unconfined=False)
    assert problem.startswith("bubblewrap is not installed") and "--unconfined" in problem
    assert gpu_image.bwrap_problem(tmp_path, unconfined=True) == ""
    (tmp_path / "bubblewrap_0.8.0-2_amd64.deb").write_bytes(b"")
    assert gpu_image.bwrap_problem(tmp_path, unconfined=False) == ""

"""What a lent GPU machine's image has and lacks for `make rl-gpu`, checked before anything runs.

    cuda        torch sees a CUDA device (its name is printed), when --device is cuda
    torch       at least MIN_TORCH; transformers at least MIN_TRANSFORMERS; peft present
    packages    every package of gpu_wheels.txt is on the image or carried as a wheel in --wheels
                (the carried ones are installed over the image's by gpu_run.sh)
    bubblewrap  `bwrap` runs a command, or its Debian package is carried in --wheels (gpu_run.sh
                unpacks it), or --unconfined says the agent's commands may run without it

Prints one line per check and exits 1 with one line per problem, each naming its fix. Run as a
script (python3 training/rl/gpu_image.py): it imports only the standard library and torch, since
the packages it checks for are not installed yet.

    python3 training/rl/gpu_image.py --wheels .whl --device cuda
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

WHEEL_LIST = Path(__file__).with_name("gpu_wheels.txt")
MIN_TORCH = (2, 4)
MIN_TRANSFORMERS = (4, 56)
FETCH = "run `make rl-gpu-wheels` where pip works and carry .whl"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wanted(path: Path = WHEEL_LIST) -> dict[str, str]:
    """name -> version of every package the run needs beyond the image."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, pin = line.partition("==")
            pins[name] = pin
    return pins


def carried(folder: Path) -> dict[str, str]:
    """normalized name -> version of the wheels in `folder`."""
    out = {}
    for wheel in folder.glob("*.whl"):
        name, ver = wheel.name.split("-")[:2]
        out[normalized(name)] = ver
    return out


def release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:2])


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def package_problems(folder: Path, log) -> list[str]:
    have, problems = carried(folder), []
    for name, pin in wanted().items():
        on_image, wheel = installed(name), have.get(normalized(name))
        if wheel is not None and wheel != pin:
            problems.append(f"{folder}/ carries {name} {wheel}, not {pin}: {FETCH}")
        elif wheel is None and on_image is None:
            problems.append(f"{name} {pin} is neither on the image nor carried: {FETCH}")
        log(f"  {name:<28} image {on_image or '-':<10} carried {wheel or '-'}")
    return problems


def bwrap_problem(folder: Path, unconfined: bool) -> str:
    """ "" when the agent's commands can be confined here (or need not be)."""
    if unconfined:
        return ""
    binary = shutil.which("bwrap")
    if binary is None:
        if list(folder.glob("bubblewrap_*.deb")):
            return ""  # gpu_run.sh unpacks it; measured_run checks that it runs
        return (
            f"bubblewrap is not installed and no bubblewrap_*.deb is in {folder}/: {FETCH}, or "
            "pass --unconfined (the agent's commands then run unconfined on this machine)"
        )
    probe = [binary, "--ro-bind", "/", "/", "--unshare-all", "true"]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    if result.returncode:
        why = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return (
            f"bwrap cannot confine a command here ({why}): pass --unconfined (the agent's "
            "commands then run unconfined on this machine)"
        )
    return ""


def check(folder: Path, device: str, unconfined: bool, log) -> list[str]:
    import torch

    problems = []
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    if release(torch.__version__) < MIN_TORCH:
        problems.append(f"torch {torch.__version__} is older than {MIN_TORCH}: use a newer image")
    if device.startswith("cuda"):
        if torch.cuda.is_available():
            log(f"cuda: {torch.cuda.get_device_name()} (torch built for CUDA {torch.version.cuda})")
        else:
            problems.append(
                f"torch {torch.__version__} sees no CUDA device: run on the GPU machine, or "
                "DEVICE=cpu"
            )
    for name, least in (("transformers", MIN_TRANSFORMERS), ("peft", (0, 0))):
        have = installed(name)
        log(f"{name} {have or 'missing'}")
        if have is None or release(have) < least:
            problems.append(f"{name} {have or 'is missing'} (need >= {least}): use a newer image")
    log(f"packages beyond the image (training/rl/{WHEEL_LIST.name}):")
    problems += package_problems(folder, log)
    bwrap = bwrap_problem(folder, unconfined)
    found = shutil.which("bwrap") or ("not needed" if unconfined else "the carried package")
    log(f"bubblewrap: {'unusable' if bwrap else found}")
    return problems + ([bwrap] if bwrap else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wheels", default=".whl", help="folder of carried wheels and bubblewrap")
    p.add_argument("--device", default="cuda")
    p.add_argument("--unconfined", action="store_true", help="no sandbox needed")
    args = p.parse_args(argv)
    problems = check(Path(args.wheels), args.device, args.unconfined, print)
    for problem in problems:
        print(f"error: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

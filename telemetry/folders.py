"""Where Flywheel keeps its per-user files, following the XDG base-directory convention.

    data_home()   $XDG_DATA_HOME/flywheel (~/.local/share/flywheel): telemetry.db, models/, cycles/
    cache_home()  $FLYWHEEL_CACHE, else $XDG_CACHE_HOME/flywheel (~/.cache/flywheel): converted
                  base models, generated task sets
    db_path()     the telemetry database a command line uses: --db, else $FLYWHEEL_DB, else
                  data_home()/telemetry.db
    command_line_path()  the same rule for any such path (the model registry uses it)

It lives in telemetry, the bottom layer, so that every package resolves these folders one way.
Only command-line entry points call it; library code takes paths as arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def data_home(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    root = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(root).expanduser() / "flywheel"


def cache_home(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("FLYWHEEL_CACHE"):
        return Path(env["FLYWHEEL_CACHE"]).expanduser()
    root = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root).expanduser() / "flywheel"


def command_line_path(
    flag: str | None, variable: str, name: str, environ: Mapping[str, str] | None = None
) -> Path:
    """The path a command line uses: its flag, else the environment's `variable`, else
    data_home()/`name`."""
    env = os.environ if environ is None else environ
    if flag:
        return Path(flag).expanduser()
    if env.get(variable):
        return Path(env[variable]).expanduser()
    return data_home(env) / name


def db_path(flag: str | None = None, environ: Mapping[str, str] | None = None) -> Path:
    return command_line_path(flag, "FLYWHEEL_DB", "telemetry.db", environ)

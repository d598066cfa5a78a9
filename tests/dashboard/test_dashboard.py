"""`flywheel dashboard` in headless Chromium: the page loads with no console
errors and every panel shows data from a fixture database written by the real Recorder; an empty
database and a missing one show a clear empty state. Screenshots are kept in the folder the test
prints.

Needs Node, Debian's chromium and playwright-core (it downloads no browser); skips cleanly
without them. Install:  sudo apt-get install -y chromium  and
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix ~/.cache/flywheel/playwright \
        playwright-core@1
(or point FLYWHEEL_PLAYWRIGHT_CORE at a playwright-core folder; the vscode tier's works too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.dashboard.fixture_db import build
from tests.flywheel_server import free_port, stop, wait_for_health

HERE = Path(__file__).parent
PANELS = [
    "sessions",
    "suggestions",
    "rewards",
    "agent",
    "speculative",
    "training",
    "models",
    "repos",  # from the registry only (tests/dashboard/test_panels.py); here its empty sentence
]


def _playwright_core() -> Path | None:
    cache = Path.home() / ".cache/flywheel"
    candidates = [
        os.environ.get("FLYWHEEL_PLAYWRIGHT_CORE", ""),
        cache / "playwright/node_modules/playwright-core",
        cache / "vscode/playwright/node_modules/playwright-core",
    ]
    return next((Path(c) for c in candidates if c and Path(c, "package.json").is_file()), None)


@pytest.fixture(scope="module")
def browser_tools() -> tuple[str, Path]:
    node, core = shutil.which("node"), _playwright_core()
    if node is None:
        pytest.skip("node is missing: sudo apt-get install -y nodejs npm")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("chromium is missing: sudo apt-get install -y chromium")
    if core is None:
        pytest.skip(
            "playwright-core is missing: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install "
            "--prefix ~/.cache/flywheel/playwright playwright-core@1"
        )
    return node, core


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dashboard-screenshots")
    print(f"\ndashboard screenshots: {folder}")
    return folder


@contextmanager
def dashboard(db: Path, *flags: str) -> Iterator[str]:
    """`flywheel dashboard` as a subprocess on a free port; yields its URL once /health answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "training.dashboard",
        "--db",
        str(db),
        "--port",
        str(port),
        *flags,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_health(
            process, url, "flywheel dashboard", 60, lambda: process.stdout.read().decode()
        )
        yield url
    finally:
        stop(process, 10)


def load(tools: tuple[str, Path], url: str, screenshot: Path) -> dict:
    node, core = tools
    proc = subprocess.run(
        [node, str(HERE / "load_page.cjs"), str(core), url, str(screenshot)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_panel_shows_data_from_a_real_database(browser_tools, artifacts, tmp_path):
    db = build(tmp_path / "telemetry.db")
    with dashboard(db, "--registry", str(tmp_path / "no-registry")) as url:
        seen = load(browser_tools, url, artifacts / "dashboard.png")
        api = httpx.get(url + "/api/panels").json()
    assert seen["errors"] == []
    assert seen["emptyState"] is None
    panels = {p["id"].removeprefix("panel-"): p for p in seen["panels"]}
    assert list(panels) == PANELS
    for name, p in panels.items():
        if name == "repos":
            assert not p["hasData"] and "flywheel train repo" in p["text"]
            continue
        assert p["hasData"], f"{name}: {p['text']}"
        assert p["svgs"] >= 1, f"{name} has no chart"
    assert "v2-bbbb" in panels["models"]["text"] and "rejected" in panels["models"]["text"]
    assert "pass@1 0.350" in panels["models"]["text"]
    assert "model_versions table" in panels["models"]["text"]  # says where it read them
    assert "headless, nvim, vscode" in panels["sessions"]["text"]
    assert [p["id"] for p in api["panels"]] == PANELS and api["empty"] is None
    assert (artifacts / "dashboard.png").stat().st_size > 10_000


def test_an_empty_or_missing_database_shows_a_clear_empty_state(browser_tools, artifacts, tmp_path):
    from telemetry import open_db

    empty = tmp_path / "empty.db"
    open_db(empty).conn.close()  # migrated, no rows
    with dashboard(empty, "--registry", str(tmp_path / "none")) as url:
        seen = load(browser_tools, url, artifacts / "empty.png")
    assert seen["errors"] == []
    assert "holds no data yet" in seen["emptyState"] and "flywheel demo" in seen["emptyState"]
    for p in seen["panels"]:
        assert not p["hasData"] and p["svgs"] == 0
        assert len(p["text"].splitlines()) >= 2, p  # a title and a sentence, never blank
    missing = tmp_path / "nowhere" / "telemetry.db"
    with dashboard(missing, "--registry", str(tmp_path / "none")) as url:
        seen = load(browser_tools, url, artifacts / "missing.png")
    assert seen["errors"] == [] and "no telemetry database" in seen["emptyState"]
    assert not missing.exists()  # read-only: the dashboard never creates it

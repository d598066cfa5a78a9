"""The dashboard's web app (FastAPI) and its command line.

    flywheel dashboard --db ~/.local/share/flywheel/telemetry.db --port 8765

Routes: `/` the page (rebuilt on every load), `/api/panels` the same data as JSON, `/health`.
It binds 127.0.0.1 unless told otherwise; the database is only read.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import jinja2

from training.dashboard import charts, data

TEMPLATE = "page.html.jinja"


def render_page(db: Path, registry: Path | None) -> str:
    panels, empty = data.collect(db, registry)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True)
    views = [{**asdict(p), "svg": charts.render(p.series)} for p in panels]
    return env.get_template(TEMPLATE).render(
        panels=views,
        empty=empty,
        db=str(db),
        registry=str(registry) if registry else "",
        now=time.strftime("%Y-%m-%d %H:%M:%S"),
    )


def make_app(db: Path, registry: Path | None = None):
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    app = FastAPI(title="flywheel dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return render_page(db, registry)

    @app.get("/api/panels")
    def panels() -> dict:
        found, empty = data.collect(db, registry)
        return {"empty": empty, "panels": [asdict(p) for p in found]}

    @app.get("/health")
    def health() -> dict:
        return {"ok": True, "db": str(db), "exists": db.is_file()}

    return app


def main(argv: list[str]) -> int:
    from telemetry.folders import db_path

    p = argparse.ArgumentParser(
        prog="flywheel dashboard",
        description="A local web page: sessions, suggestion acceptance and kept code, rewards, "
        "agent success, speculative acceptance, training curves, model versions.",
    )
    p.add_argument(
        "--db",
        default=None,
        help="telemetry database (default: $FLYWHEEL_DB, else "
        "$XDG_DATA_HOME/flywheel/telemetry.db)",
    )
    p.add_argument(
        "--registry",
        default=None,
        help="model registry folder (default: "
        "$FLYWHEEL_REGISTRY, else $XDG_DATA_HOME/flywheel/models)",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface (default: %(default)s)")
    p.add_argument("--port", type=int, default=8765, help="TCP port (default: %(default)s)")
    args = p.parse_args(argv)
    db = db_path(args.db)
    registry = _registry_path(args.registry)
    import uvicorn

    print(f"flywheel dashboard: http://{args.host}:{args.port}/  (telemetry {db})", flush=True)
    try:
        uvicorn.run(make_app(db, registry), host=args.host, port=args.port, log_level="warning")
    except OSError as exc:
        print(
            f"flywheel dashboard: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    return 0


def _registry_path(flag: str | None) -> Path | None:
    try:
        from agent.registry import path_from_cli
    except ImportError:
        return Path(flag) if flag else None
    return path_from_cli(flag)

"""`flywheel dashboard`: a local web page showing that the flywheel turns.

    flywheel dashboard [--db PATH] [--registry DIR] [--port 8765]   # then open http://127.0.0.1:8765

One page, served on 127.0.0.1 only, read-only on the telemetry database, with panels for sessions
over time, suggestion acceptance and kept-code rates, reward trends, agent success and tool
errors, speculative acceptance, training curves, and the model versions with their benchmark
scores and gate decisions. Charts are drawn on the server (matplotlib, inline SVG): the page
needs no scripts and nothing from the network.

Files, one role each:
  data.py          telemetry's reads (telemetry/queries.py) and the model registry -> plain
                   series per panel, each with the reason when it has nothing to show
  charts.py        series -> inline SVG
  server.py        the FastAPI app and the command line (uvicorn)
  page.html.jinja  the page

It lives in training/ because it reads both telemetry and the model registry (agent/registry.py),
and imports go one way (telemetry <- agent <- training).

What it does not do: write anything, authenticate (it binds 127.0.0.1), or refresh by itself
(reload the page).
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    from training.dashboard.server import main as serve

    return serve(argv)

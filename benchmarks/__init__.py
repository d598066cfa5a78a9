"""Measurement code, in one place: every `flywheel bench` command but `agent` and every benchmark
script.

    flywheel bench engine     engine/decoding.py   decoding speed: plain and speculative vs peers
    flywheel bench lsp        lsp_latency.py       inline-completion latency through the server
    flywheel bench infill     infill.py            single-line infilling on HumanEval
    flywheel bench passkey    passkey.py           passkey retrieval in long prompts
    python benchmarks/X.py    the other modules    one question each; results/ holds their JSON

It is a package beside agent/, lsp/, training/ and telemetry/ rather than a module inside one of
them, so that measurement code sits above everything it measures: it may import any of them, and
none of them imports it (tests/test_layers.py fails if one does). `flywheel bench` reaches it
through the command table in agent/cli.py, which names modules as strings. `flywheel bench
agent` stays in training/benchmark/, because the promotion gate runs it.

Each script runs both ways: `python benchmarks/X.py` and `python -m benchmarks.X`.
"""

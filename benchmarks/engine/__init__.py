"""`flywheel bench engine`: the local engine's decoding speed, against peers on the same prompts.

decoding.py     the command: run every method on the workloads, then the step and serving
                figures; the table and the JSON
workloads.py    the prompts (from agent/bench_prompts.py's files) and the random models
report.py       one row per (workload, method), and the printed table
steps.py        step-level figures: a decode step, a verify step, an MTP head's step
serving.py      what a server does besides one request: RL groups, agent turns, concurrency
peers.py        external peers (vLLM, llama.cpp), each in a subprocess of its environment
peer_runner.py  what runs in that subprocess (imports nothing from Flywheel)
"""

"""Benchmark: what torch's CPU products cost on a thread other than the first one that used them.

torch's CPU backend here is OpenMP (libgomp). Each thread that runs a parallel torch operation
gets its own team of worker threads, and the main thread's team stays for the process's life.
libgomp's manual (GOMP_SPINCOUNT) says that when there are more OpenMP threads than CPUs, idle
workers spin only briefly, so each parallel region has to wake its workers: small products, the
bulk of a decode step, get slower. The engine's requests run on their callers' threads, so this
is what requests from a second thread pay.

Each case runs in a fresh subprocess (the teams cannot be undone in a process), timing a
decode-sized product (1536x576 weights, 2 rows) on:

- `one-thread`: the main thread only;
- `main-then-thread`: a second thread, after the main thread ran the same product;
- `thread-then-thread`: a second thread, after another thread (now ended) ran it and the main
  thread never did;
- `main-one-thread-then-thread`: a second thread, after the main thread ran it with
  `torch.set_num_threads(1)` (no team of its own).

    .venv/bin/python benchmarks/omp_threads.py --json benchmarks/results/omp-threads.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too

from benchmarks.record import machine, write_json  # noqa: E402

CASE = r"""
import json, sys, threading, time
import torch
case, repeats = sys.argv[1], int(sys.argv[2])
weight, x = torch.randn(1536, 576), torch.randn(2, 576)

def timed(out):
    for _ in range(50):
        torch.mm(weight, x.T)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(weight, x.T)
    out.append((time.perf_counter() - start) / repeats * 1e6)

def on_thread(threads=None):
    out = []
    def run():
        if threads:
            torch.set_num_threads(threads)
        timed(out)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[-1]

torch.set_num_threads(2)
if case == "one-thread":
    out = []; timed(out); us = out[-1]
elif case == "main-then-thread":
    timed([]); us = on_thread()
elif case == "thread-then-thread":
    on_thread(); us = on_thread()
elif case == "main-one-thread-then-thread":
    torch.set_num_threads(1); timed([]); us = on_thread(threads=2)
print(json.dumps({"case": case, "product_us": us}))
"""

CASES = ("one-thread", "main-then-thread", "thread-then-thread", "main-one-thread-then-thread")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="subprocesses per case (median kept)")
    p.add_argument("--repeats", type=int, default=500, help="products timed per subprocess")
    p.add_argument("--json", help="where to write the results")
    args = p.parse_args()
    samples: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:  # interleaved, so machine noise spreads over every case
            out = subprocess.run(
                [sys.executable, "-c", CASE, case, str(args.repeats)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            samples[case].append(json.loads(out.splitlines()[-1])["product_us"])
    median = {case: sorted(xs)[len(xs) // 2] for case, xs in samples.items()}
    base = median["one-thread"]
    print(f"{'case':<30}{'µs per product':>16}{'× one-thread':>14}")
    for case in CASES:
        print(f"{case:<30}{median[case]:>16.0f}{median[case] / base:>14.2f}")
    if args.json:
        report = dict(
            benchmark="omp_threads",
            command="python " + " ".join(sys.argv),
            date=datetime.datetime.now().isoformat(timespec="seconds"),
            machine=machine(),
            product="torch.mm(weight[1536, 576], x[2, 576].T), float32, 2 torch threads",
            median_us=median,
            ratio_to_one_thread={case: median[case] / base for case in CASES},
            samples_us=samples,
        )
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: one linear layer's decode-sized product in each precision, on the 0.5B's shapes.

Qwen2.5-Coder-0.5B (hidden 896, intermediate 4864, 2 KV heads of 64, vocabulary 151,936) has
five matrix shapes, in -> out: 896->896 (q_proj, o_proj), 896->128 (k_proj, v_proj),
896->4864 (gate_proj, up_proj), 4864->896 (down_proj) and 896->151936 (lm_head). Each is timed
at 1 row (a decode step) and 5 rows (a verify step over 4 drafts) through the layer the engine
runs, so conversions, padding and the bias-free call overhead count:

- `float32`: `FewRowsLinear` (the engine's float32 product);
- `bfloat16`: `FewRowsLinear` on bfloat16 weights and inputs (dtype bfloat16);
- `int8`: `Int8Linear` (Flywheel's kernel where it builds, else torch's `_weight_int8pack_mm`);
- `int4-gG`: `Int4Linear` with group size G (torch's `_weight_int4pack_mm_for_cpu`);
- `int4-dyn-g32`: torch's other CPU int4 product, `_dyn_quant_matmul_4bit` (int8 activations
  per row, symmetric int4 weights), called directly; without KleidiAI (Arm) it runs a
  reference loop, so it is timed cache-resident only, on every shape but the lm_head.

Two timings per cell, each the median over `--repeats` of the mean per call:
- `resident`: the same layer called again and again, its weights in the CPU's caches;
- `streamed`: a call on each of several copies of the layer in turn, as many as fill
  `--working-set-mb` of that precision's bytes, so the weights come from memory as in a
  decode step of the whole model (the one to compare; the last level cache holds a resident
  layer, not a model). The JSON also keeps the fastest streamed pass (`streamed_min_ms`), the
  least disturbed on a shared machine.
Ratios are float32's time over the precision's (above 1: faster). A product's error against
float32 (relative Frobenius norm, on Gaussian weights) is reported beside it.

    nice -n 10 .venv/bin/python benchmarks/lowbit_matmul.py --threads 1 \
        --json benchmarks/results/lowbit_matmul.json   # --threads 1 on a shared machine
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import machine, write_json  # noqa: E402

SHAPES = ((896, 896), (896, 128), (896, 4864), (4864, 896), (896, 151936))  # (in, out)
ROWS = (1, 5)  # a decode step, a verify step over 4 drafts (--rows)
GROUP_SIZES = (32, 64)  # the default's candidates
DYN_GROUP = 32
# products per decode step of the 0.5B: per layer q, o; k, v; gate, up; down (24 layers); lm_head
PER_STEP = {(896, 896): 48, (896, 128): 48, (896, 4864): 48, (4864, 896): 24, (896, 151936): 1}


def layer_for(precision: str, in_features: int, out_features: int):
    """The engine's layer for `precision` with Gaussian weights (std 0.02, fixed seed)."""
    import torch
    from torch import nn

    from agent.engine.local.few_rows import FewRowsLinear
    from agent.engine.local.lowbit import use_int4_linear, use_int8_linear

    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=False)
    nn.init.normal_(layer.weight, std=0.02)
    layer.requires_grad_(False)
    if precision in ("float32", "bfloat16"):
        layer.__class__ = FewRowsLinear
        return layer.to(torch.bfloat16) if precision == "bfloat16" else layer
    if precision == "int8":
        use_int8_linear(layer, bf16_prefill=False)
    else:
        group = int(precision.removeprefix("int4-g"))
        use_int4_linear(layer, group, vocab_size=None, bf16_prefill=False)
    return layer


def copies_of(layer, precision: str, count: int) -> list:
    """`count` layers computing what `layer` does, each with weights of its own in memory (the
    float32 weight, unused by the low-bit products, stays shared)."""
    copies = [layer]
    for _ in range(count - 1):
        twin = copy.copy(layer)
        if precision in ("float32", "bfloat16"):
            twin = copy.deepcopy(layer)
        elif precision == "int8":
            twin.int8_weight = layer.int8_weight.clone()
            twin.int8_scales = layer.int8_scales.clone()
            if layer.int8_columns is not None:
                twin.int8_columns = layer.int8_columns.clone()
        else:
            twin.int4_weight = layer.int4_weight.clone()
            twin.int4_scales_zeros = layer.int4_scales_zeros.clone()
        copies.append(twin)
    return copies


def weight_bytes(layer, precision: str) -> int:
    """The bytes a decode-sized product of `layer` reads."""
    if precision in ("float32", "bfloat16"):
        tensors = [layer.weight]
    elif precision == "int8":
        tensors = [layer.int8_weight, layer.int8_scales]
    else:
        tensors = [layer.int4_weight, layer.int4_scales_zeros]
    return sum(t.numel() * t.element_size() for t in tensors)


def timed_ms(calls: list, x, repeats: int) -> list[float]:
    """The mean ms per call of each of `repeats` passes over `calls` (after one pass to warm
    up)."""
    samples = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        for call in calls:
            call(x)
        if i:
            samples.append((time.perf_counter() - start) / len(calls) * 1000)
    return samples


def dyn_quant_call(layer, in_features: int, out_features: int):
    """`_dyn_quant_matmul_4bit` over `layer`'s weight, symmetric int4 per group of DYN_GROUP."""
    import torch

    w = layer.weight.detach().float().reshape(out_features, -1, DYN_GROUP)
    scales = w.abs().amax(-1).clamp(min=1e-12) / 7  # [out, groups]
    q = (torch.round(w / scales[..., None]).clamp(-8, 7) + 8).to(torch.int16)
    q = q.reshape(out_features, in_features)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # low nibble first
    weights = torch.ops.aten._dyn_quant_pack_4bit_weight(
        packed, scales, None, DYN_GROUP, in_features, out_features
    )

    def call(x):
        return torch.ops.aten._dyn_quant_matmul_4bit(
            x, weights, DYN_GROUP, in_features, out_features
        )

    return call


def measure(args) -> list[dict]:
    import torch

    precisions = ["float32", "bfloat16", "int8", *(f"int4-g{g}" for g in GROUP_SIZES)]
    working_set = args.working_set_mb * 2**20
    out = []
    for in_features, out_features in SHAPES:
        torch.manual_seed(1)
        inputs = {rows: torch.randn(rows, in_features) for rows in args.rows}
        reference = layer_for("float32", in_features, out_features)
        want = {rows: reference(x) for rows, x in inputs.items()}
        for precision in precisions:
            layer = layer_for(precision, in_features, out_features)
            size = weight_bytes(layer, precision)
            count = max(1, -(-working_set // size))
            layers = copies_of(layer, precision, count)
            for rows, x in inputs.items():
                x = x.to(torch.bfloat16) if precision == "bfloat16" else x
                got = layer(x).float()
                streamed = timed_ms(layers, x, args.repeats)
                resident = streamed  # one copy fills the working set: it is streamed
                if count > 1:
                    resident = timed_ms([layer] * args.calls, x, args.repeats)
                row = {
                    "in": in_features,
                    "out": out_features,
                    "rows": rows,
                    "precision": precision,
                    "weight_mb": size / 2**20,
                    "copies": count,
                    "resident_ms": statistics.median(resident),
                    "streamed_ms": statistics.median(streamed),
                    "streamed_min_ms": min(streamed),  # the least disturbed pass
                    "error": float((got - want[rows]).norm() / want[rows].norm()),
                }
                out.append(row)
                print(
                    f"{in_features:>5}->{out_features:<7}{rows:>3} {precision:<9}"
                    f"{row['resident_ms']:>9.3f}{row['streamed_ms']:>9.3f}{row['error']:>9.4f}",
                    flush=True,
                )
            del layers, layer
        if args.dyn_quant and out_features != SHAPES[-1][1]:  # the lm_head takes seconds
            call = dyn_quant_call(reference, in_features, out_features)
            for rows, x in inputs.items():
                row = {
                    "in": in_features,
                    "out": out_features,
                    "rows": rows,
                    "precision": f"int4-dyn-g{DYN_GROUP}",
                    "resident_ms": statistics.median(timed_ms([call], x, 3)),
                    "streamed_ms": None,
                    "error": float((call(x) - want[rows]).norm() / want[rows].norm()),
                }
                out.append(row)
                print(
                    f"{in_features:>5}->{out_features:<7}{rows:>3} {row['precision']:<9}"
                    f"{row['resident_ms']:>9.3f}{'-':>9}{row['error']:>9.4f}",
                    flush=True,
                )
    for row in out:
        base = next(
            r
            for r in out
            if (r["in"], r["out"], r["rows"], r["precision"])
            == (row["in"], row["out"], row["rows"], "float32")
        )
        row["resident_x_float32"] = base["resident_ms"] / row["resident_ms"]
        streamed = row["streamed_ms"]
        row["streamed_x_float32"] = base["streamed_ms"] / streamed if streamed else None
    return out


def print_table(rows: list[dict]) -> None:
    """One line per shape and row count: streamed ms per precision and its ratio to float32."""
    precisions = list(dict.fromkeys(r["precision"] for r in rows if r["streamed_ms"]))
    print("\nstreamed ms per call (x float32: float32's time over this one's)")
    print(f"{'in->out':<13}{'rows':>5}" + "".join(f"{p:>19}" for p in precisions))
    cells = {(r["in"], r["out"], r["rows"], r["precision"]): r for r in rows}
    for key in dict.fromkeys((r["in"], r["out"], r["rows"]) for r in rows):
        line = f"{f'{key[0]}->{key[1]}':<13}{key[2]:>5}"
        for p in precisions:
            r = cells[(*key, p)]
            line += f"{r['streamed_ms']:>11.3f} ({r['streamed_x_float32']:>4.2f}x)"
        print(line)


def step_estimates(rows: list[dict]) -> list[dict]:
    """The linear products of one 0.5B decode (or verify) step, from the streamed times: each
    shape's time times its count (PER_STEP). The int4 precisions also with the lm_head in int8,
    what dtype int4 runs (lowbit.py)."""
    cells = {(r["in"], r["out"], r["rows"], r["precision"]): r["streamed_ms"] for r in rows}
    precisions = [p for p in dict.fromkeys(r["precision"] for r in rows) if "dyn" not in p]
    head = SHAPES[-1]
    out = []
    for n in dict.fromkeys(r["rows"] for r in rows):
        options = [(p, p) for p in precisions]
        options += [(p, "int8") for p in precisions if p.startswith("int4")]
        for body, head_precision in options:
            ms = sum(
                count * cells[(*shape, n, head_precision if shape == head else body)]
                for shape, count in PER_STEP.items()
            )
            name = body if body == head_precision else f"{body}, lm_head {head_precision}"
            out.append({"rows": n, "precision": name, "ms": ms})
    for row in out:
        base = next(
            r["ms"] for r in out if r["rows"] == row["rows"] and r["precision"] == "float32"
        )
        row["x_float32"] = base / row["ms"]
    print("\nthe linear products of one 0.5B step (24 layers + lm_head), streamed ms")
    for row in out:
        print(
            f"{row['rows']:>3} rows  {row['precision']:<24}{row['ms']:>9.2f} ({row['x_float32']:.2f}x)"
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument(
        "--rows", type=int, nargs="+", default=ROWS, help="input rows per product (default: 1 5)"
    )
    p.add_argument("--repeats", type=int, default=5, help="timed passes per cell (median)")
    p.add_argument("--calls", type=int, default=20, help="calls per resident pass")
    p.add_argument(
        "--working-set-mb", type=int, default=256, help="weights per streamed pass, per precision"
    )
    p.add_argument(
        "--no-dyn-quant",
        dest="dyn_quant",
        action="store_false",
        help="skip _dyn_quant_matmul_4bit",
    )
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    import torch

    from agent.engine.local import cpu_kernels
    from agent.engine.local.lowbit import bf16_matmul_is_fast, int4_unavailable, int8_unavailable

    for why in (int8_unavailable(), int4_unavailable()):
        if why:
            print(f"cannot run the low-bit layers here: {why}")
            return 1
    torch.set_num_threads(args.threads)
    print(f"{'in->out':<13}{'rows':>3} {'precision':<9}{'resident':>9}{'streamed':>9}{'error':>9}")
    with torch.inference_mode():
        rows = measure(args)
    print_table(rows)
    estimates = step_estimates(rows)
    if args.json:
        report = {
            "benchmark": "lowbit_matmul",
            "command": "python benchmarks/lowbit_matmul.py " + " ".join(sys.argv[1:]),
            "date": datetime.date.today().isoformat(),
            "machine": machine(
                cpu_capability=torch.backends.cpu.get_cpu_capability(),
                bf16_matmul_is_fast=bf16_matmul_is_fast(),
                flywheel_int8_kernel=cpu_kernels.unavailable() or "built",
                torch_threads=torch.get_num_threads(),
                torch=torch.__version__,
            ),
            "settings": vars(args),
            "results": rows,
            "step_estimates": estimates,
        }
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

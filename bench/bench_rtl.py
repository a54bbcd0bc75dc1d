"""Benchmark: the analytical MLP model against the RTL tier (da4ml Verilog, Verilator cycles, Yosys LUTs).

For each model (random float weights, ``precision="auto"`` on a normal calibration set, so every
accumulator is exact and the latency and distributed-arithmetic datapaths agree):

- predicted: :func:`offload.advisor.model.predict_mlp` (hls4ml *latency* strategy: DSP multipliers,
  adder tree) - pipeline cycles at 300 MHz, LUTs, DSPs;
- measured: ``mlp.to_rtl(dir, clock_mhz=300)`` - Verilator build time, cycles from input valid to
  output valid, RTL simulation rows/s, Yosys ``synth_xilinx -family xcup`` LUT/FF/CARRY/DSP, and
  da4ml's own LUT estimate. Every simulated row is checked bit for bit against ``mlp.simulate``.

Yosys's mapping is not Vivado's: its LUT counts are a reproducible vendor-free proxy, usually
above what Vivado reports for adder-heavy logic. hls4ml C-simulation rows/s is measured on the
risk MLP (16-32-16-1) for comparison with the RTL simulation.

The stream section (``--stream``, or ``--stream-only`` for it alone) takes the risk example's own
MLP (offload.examples.risk: the trained 16-32-16-1 ReLU + sigmoid at ``precision="auto"``) through
the AXI4-Stream top ``offload_stream``: latency from request word taken to response word taken,
initiation interval under full load, a backpressure run (sink ready 30 % of cycles) checked bit
for bit against ``mlp.simulate`` with every tag in order, the pipeline stages each layer takes
(da4ml's adder levels at 5 levels a stage for 300 MHz), and Yosys LUT/FF of the network alone and
of the stream top.

Run (builds are cached in $OFFLOAD_CACHE_DIR/rtl; clear it to time cold builds)::

    .venv/bin/python bench/bench_rtl.py [--rows 20000] [--no-yosys] [--json out.json]
    .venv/bin/python bench/bench_rtl.py --stream-only [--no-yosys]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from offload.advisor.model import mlp_layer_cycles, predict_mlp
from offload.hls.cards import get_card
from offload.nn import MLP

# (name, layer widths, hidden activation, output activation)
MODELS = [
    ("4-8-1", [4, 8, 1], "relu", None),
    ("8-8-1", [8, 8, 1], "relu", "sigmoid"),
    ("8-16-4", [8, 16, 4], "leaky_relu", None),
    ("12-8-2", [12, 8, 2], "tanh", None),
    ("16-8-1", [16, 8, 1], "relu", None),
    ("16-16-4", [16, 16, 4], "relu", None),
    ("16-32-1", [16, 32, 1], "relu", "sigmoid"),
    ("32-16-8-1", [32, 16, 8, 1], "relu", None),
    ("risk 16-32-16-1", [16, 32, 16, 1], "relu", "sigmoid"),
]
_ACT = {"relu": torch.nn.ReLU, "leaky_relu": lambda: torch.nn.LeakyReLU(0.1), "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid}


def _seq(sizes, hidden, out, seed):
    torch.manual_seed(seed)
    mods = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        mods.append(torch.nn.Linear(a, b))
        if k < len(sizes) - 2:
            mods.append(_ACT[hidden]())
    if out:
        mods.append(_ACT[out]())
    return torch.nn.Sequential(*mods).eval()


def _hls4ml_rate(mlp, x, workdir: Path) -> float:
    hm = mlp.to_hls4ml(str(workdir / "hls4ml"))
    hm.compile()
    t = time.perf_counter()
    y = hm.predict(np.ascontiguousarray(x.astype(np.float64)))
    dt = time.perf_counter() - t
    assert np.array_equal(np.asarray(y, dtype=np.float64).reshape(x.shape[0], -1), mlp.simulate(x)), "hls4ml != simulate"
    return x.shape[0] / dt


def run(rows: int, yosys: bool, hls4ml: bool) -> list[dict]:
    card = get_card("u55c")
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-rtl-") as tmp:
        for i, (name, sizes, hidden, act) in enumerate(MODELS):
            rng = np.random.default_rng(i)
            calib = rng.normal(size=(1024, sizes[0]))
            mlp = MLP.from_float(_seq(sizes, hidden, act, i), calib=calib, precision="auto", device="sim")
            pred = predict_mlp(card, sizes, 1)
            pred_cycles = sum(mlp_layer_cycles(a, 1) for a in sizes[:-1])
            t = time.perf_counter()
            rtl = mlp.to_rtl(Path(tmp) / f"m{i}", clock_mhz=300)
            t_gen = time.perf_counter() - t
            t = time.perf_counter()
            rtl.compile()
            t_build = time.perf_counter() - t
            x = rng.normal(size=(rows, sizes[0])) * 3
            t = time.perf_counter()
            y = rtl.predict(x)
            rate = rows / (time.perf_counter() - t)
            exact = bool(np.array_equal(y, mlp.simulate(x)))
            row = {"model": name, "pred_cycles": pred_cycles, "pred_lut": pred.resources["LUT"], "pred_dsp": pred.resources["DSP"],
                   "rtl_cycles": rtl.latency_cycles, "rtl_ns": rtl.latency_ns, "stages": rtl.stages, "bit_exact": exact,
                   "gen_s": t_gen, "build_s": t_build, "rtl_rows_s": rate, "da4ml_lut": float(rtl.meta["da4ml_cost_lut"])}
            if yosys:
                t = time.perf_counter()
                row.update({f"yosys_{k}": v for k, v in rtl.resources().items()})
                row["yosys_s"] = time.perf_counter() - t
            if hls4ml and name.startswith("risk"):
                row["hls4ml_rows_s"] = _hls4ml_rate(mlp, x, Path(tmp) / f"m{i}")
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def table(rows: list[dict]) -> str:
    head = ("| model | predicted cycles (latency) | RTL cycles (DA) | RTL ns @300 MHz | predicted LUT | Yosys LUT | da4ml LUT est. "
            "| predicted DSP | Yosys DSP | Yosys FF | Yosys CARRY | Verilator build s | RTL sim rows/s | bit-exact |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['pred_cycles']} | {r['rtl_cycles']} | {r['rtl_ns']:.1f} | {r['pred_lut']:.0f} | "
            f"{r.get('yosys_LUT', '-')} | {r['da4ml_lut']:.0f} | {r['pred_dsp']:.0f} | {r.get('yosys_DSP', '-')} | "
            f"{r.get('yosys_FF', '-')} | {r.get('yosys_CARRY', '-')} | {r['build_s']:.1f} | {r['rtl_rows_s']:,.0f} | {r['bit_exact']} |"
        )
    return "\n".join(lines)


def _risk_mlp() -> tuple[MLP, np.ndarray]:
    """The risk example's MLP, trained and quantized as ``build_risk_bundle`` does (seed 0), and its held-out rows."""
    from offload.examples.risk import make_transactions, train_float_model

    n_train, n_test = 20000, 5000
    x, y = make_transactions(n_train + n_test, 0)
    model = train_float_model(x[:n_train], y[:n_train], seed=0)
    return MLP.from_float(model, calib=x[:n_train][:2000], precision="auto", device="sim"), x[n_train:].astype(np.float64)


def run_stream(yosys: bool) -> dict:
    mlp, x = _risk_mlp()
    with tempfile.TemporaryDirectory(prefix="bench-rtl-stream-") as tmp:
        rtl = mlp.to_rtl(Path(tmp) / "risk", clock_mhz=300)
        t = time.perf_counter()
        sc = rtl.stream_cycles  # builds the stream testbench, runs one at a time and back to back
        t_stream = time.perf_counter() - t
        want = mlp.simulate(x)
        t = time.perf_counter()
        full = rtl.stream_predict(x)
        rate = len(x) / (time.perf_counter() - t)
        pushed = rtl.stream_predict(x, valid_pct=100, ready_pct=30, tb_seed=1)
        row = {"model": "risk 16-32-16-1 (offload.examples.risk)", "clock_mhz": 300.0, "stages": rtl.stages,
               "pipeline_depth": rtl.pipeline_depth, "layer_stages": rtl.meta["layer_stages"],
               "layer_levels": rtl.meta["layer_levels"], "latency_cutoff_levels": rtl.meta["latency_cutoff"],
               "stream_latency_cycles": sc.latency_cycles, "stream_latency_ns": sc.latency_ns, "stream_ii_cycles": sc.ii_cycles,
               "claimed_latency": rtl.meta["stream_latency"], "claimed_ii": rtl.meta["stream_ii"], "fifo_depth": sc.fifo_depth,
               "tag_bits": sc.tag_bits, "rows": len(x), "bit_exact_back_to_back": bool(np.array_equal(full, want)),
               "bit_exact_backpressure_30pct": bool(np.array_equal(pushed, want)), "stream_build_and_measure_s": t_stream,
               "stream_sim_rows_s": rate}
        if yosys:
            row.update({f"net_{k}": v for k, v in rtl.resources().items()})
            row.update({f"stream_{k}": v for k, v in rtl.resources(top="offload_stream").items()})
    print(json.dumps(row), flush=True)
    return row


def stream_table(r: dict) -> str:
    per_layer = ", ".join(f"{n} {k}" for n, k in r["layer_stages"] if k)
    lines = [
        f"risk MLP stream top @ {r['clock_mhz']:g} MHz: latency {r['stream_latency_cycles']} cycles "
        f"({r['stream_latency_ns']:.1f} ns) request word -> response word, II {r['stream_ii_cycles']} "
        f"(claimed {r['claimed_latency']} / {r['claimed_ii']}); bit-exact back to back {r['bit_exact_back_to_back']}, "
        f"under backpressure {r['bit_exact_backpressure_30pct']} ({r['rows']} rows)",
        f"where the cycles go: 1 input register + {r['stages'] - 1} between da4ml's {r['stages']} stages + 1 output register "
        f"(= pipeline depth {r['pipeline_depth']}) + 1 FIFO write; stages by layer: {per_layer}",
    ]
    if "net_LUT" in r:
        lines.append(f"Yosys xcup: network LUT {r['net_LUT']} FF {r['net_FF']} CARRY {r['net_CARRY']}; "
                     f"stream top LUT {r['stream_LUT']} FF {r['stream_FF']} CARRY {r['stream_CARRY']} DSP {r['stream_DSP']} BRAM {r['stream_BRAM']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--no-yosys", action="store_true")
    ap.add_argument("--no-hls4ml", action="store_true")
    ap.add_argument("--stream", action="store_true", help="also the risk MLP through the AXI4-Stream top")
    ap.add_argument("--stream-only", action="store_true", help="only the risk MLP through the AXI4-Stream top")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    load = os.getloadavg()
    rows = [] if a.stream_only else run(a.rows, not a.no_yosys, not a.no_hls4ml)
    stream = run_stream(not a.no_yosys) if a.stream or a.stream_only else None
    if rows:
        print(table(rows))
    if stream is not None:
        print(stream_table(stream))
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "stream": stream, "load_at_start": load}, indent=1))


if __name__ == "__main__":
    main()

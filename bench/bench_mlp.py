"""Benchmark: the bit-exact MLP simulator against hls4ml's C-simulation (and the float torch model).

One model (32-64-32-1: Linear, ReLU, Linear, ReLU, Linear, Sigmoid), one process, the same rows
for every contender, for each precision: ``auto`` (types calibrated on data), ``ap_fixed<16,6>``
and ``ap_fixed<10,4>`` everywhere (accumulators that round, and wrap, every product). For each
batch size it reports rows per second of ``MLP.simulate`` (the sim device's reference: the fused
compiled program) and of hls4ml's ``predict`` on the compiled project of the same types, measured
interleaved (best of ``--repeats``, so the shared machine's noise hits both alike), and their
ratio. At the largest batch it adds the simulator's general NumPy path (``forward`` layer by layer)
and torch float32. It first checks that the simulator equals hls4ml on every row and equals the
general path (a benchmark of a wrong simulator is worthless), and reports the JIT seconds (numba's
disk cache when warm) and the machine's load before and after.

Run::

    .venv/bin/python bench/bench_mlp.py [--rows 20000] [--batches 1,64] [--precisions 'auto;ap_fixed<16,6>;ap_fixed<10,4>']
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

import offload
from offload.sim.fixed import FixedType
from offload.sim.mlp import forward, fused

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import best_seconds  # noqa: E402


def _model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 1), torch.nn.Sigmoid(),
    ).eval()


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000, help="rows checked, and the largest batch timed")
    ap.add_argument("--batches", default="1,64", help="smaller batch sizes timed (comma-separated)")
    ap.add_argument("--precisions", default="auto;ap_fixed<16,6>;ap_fixed<10,4>", help="';'-separated")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b] + [args.rows]
    rng = np.random.default_rng(0)
    seq = _model()
    calib = rng.normal(size=(4000, 32))
    x = rng.normal(size=(args.rows, 32)) * 1.5
    xt = torch.from_numpy(x).float()
    print(f"# model 32-64-32-1, rows={args.rows}, threads: simulator 1, hls4ml 1; load {_load()}  {time.strftime('%Y-%m-%d %H:%M:%S')}")
    jit = fused.warm_up()
    print(f"# JIT {jit:.2f} s (numba's disk cache when warm)")
    print("| precision | batch | simulate rows/s | hls4ml rows/s | simulate / hls4ml | notes |")
    print("|---|---:|---:|---:|---:|---|")
    for precision in args.precisions.split(";"):
        mlp = offload.nn.MLP.from_float(seq, calib=calib, precision=precision)
        spec, tensors = mlp.spec, mlp._tensors
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            h = mlp.to_hls4ml(d)
            t0 = time.perf_counter()
            h.compile()
            compile_s = time.perf_counter() - t0
            y_hls = np.asarray(h.predict(x)).reshape(args.rows, -1)
            y_sim = mlp.simulate(x)
            mismatches = int((y_hls != y_sim).sum())
            out_t = FixedType.parse(spec.output_type)

            def general(rows):
                return out_t.to_float(forward(spec.input_type, spec.layers, tensors, rows))

            same_general = bool(np.array_equal(general(x), y_sim))
            fused_on = fused.program_for(spec.input_type, spec.layers, tensors) is not None
            for b in batches:
                rows = np.ascontiguousarray(x[:b])
                r_sim = r_hls = 0.0
                for _ in range(args.repeats):  # interleaved
                    r_sim = max(r_sim, b / best_seconds(lambda: mlp.simulate(rows), 0.1, 1))
                    r_hls = max(r_hls, b / best_seconds(lambda: h.predict(rows), 0.1, 1))
                notes = ""
                if b == batches[0]:
                    notes = f"mismatches vs hls4ml: {mismatches}; == general path: {same_general}; fused: {fused_on}; hls4ml compile {compile_s:.0f} s"
                if b == args.rows:
                    r_gen = b / best_seconds(lambda: general(rows), 0.1, 2)
                    with torch.no_grad():
                        r_torch = b / best_seconds(lambda: seq(xt), 0.1, 3)
                    notes = f"general path {r_gen:.3g} rows/s (simulate {r_sim / r_gen:.1f}x that); torch float {r_torch:.3g} rows/s"
                print(f"| {precision} | {b} | {r_sim:.3g} | {r_hls:.3g} | {r_sim / r_hls:.1f}x | {notes} |", flush=True)
    print(f"# load after: {_load()}")


if __name__ == "__main__":
    main()

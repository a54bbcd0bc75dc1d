"""Benchmark: the bit-exact MLP simulator against hls4ml's C-simulation (and the float torch model).

One model (32-64-32-1: Linear, ReLU, Linear, ReLU, Linear, Sigmoid), one process, the same rows
for every contender, for each precision: ``auto`` (types calibrated on data), ``ap_fixed<16,6>``
and ``ap_fixed<10,4>`` everywhere (accumulators that round, and wrap, every product), and
``ap_fixed<16,6,AP_RND_CONV,AP_SAT>`` (round half to even and saturate every product and every sum). For each
batch size it reports rows per second of the mlp kind's fast path ``offload.kernels.mlp.run_rows``
(what the sim device runs, on the device's read-only resident copies; ``MLP.simulate`` adds its
input check) and of
hls4ml's ``predict`` on the compiled project of the same types, measured interleaved, best of
``--repeats``, in process CPU time (both are single-threaded, so on a shared machine CPU time is
what each costs; time-slicing by other processes would otherwise decide the ratio) and in wall
time. At the largest batch it adds the simulator's step-by-step reference
(``offload.sim.mlp.simulate``) and torch float32 (1 thread). It first checks that the fast path
equals hls4ml on every row and the reference (a benchmark of a wrong simulator is worthless), and reports the JIT
seconds (numba's disk cache when warm) and the machine's load before and after.

Run::

    .venv/bin/python bench/bench_mlp.py [--rows 20000] [--batches 1,64] [--precisions 'auto;ap_fixed<16,6>;ap_fixed<10,4>']
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import numpy as np
import torch

import offload
from offload.kernels.mlp import run_rows as simulate
from offload.kernels.registry import Kernel, resident_copy
from offload.sim.mlp import fused
from offload.sim.mlp import simulate as reference


def _model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 1), torch.nn.Sigmoid(),
    ).eval()


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _per_call(fn, min_time: float = 0.05) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call, over enough calls to last ``min_time``."""
    fn()
    t0 = time.perf_counter()
    fn()
    n = max(1, int(min_time / max(time.perf_counter() - t0, 1e-7)))
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - c0) / n, (time.perf_counter() - w0) / n


def _best(fns, repeats: int) -> list[tuple[float, float]]:
    """Best (CPU, wall) per call of each function, the functions measured in turn ``repeats`` times."""
    best = [(float("inf"), float("inf"))] * len(fns)
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            c, w = _per_call(fn)
            best[k] = (min(best[k][0], c), min(best[k][1], w))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000, help="rows checked, and the largest batch timed")
    ap.add_argument("--batches", default="1,64", help="smaller batch sizes timed (comma-separated)")
    ap.add_argument("--precisions", default="auto;ap_fixed<16,6>;ap_fixed<10,4>;ap_fixed<16,6,AP_RND_CONV,AP_SAT>", help="';'-separated")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b] + [args.rows]
    rng = np.random.default_rng(0)
    seq = _model()
    calib = rng.normal(size=(4000, 32))
    x = rng.normal(size=(args.rows, 32)) * 1.5
    xt = torch.from_numpy(x).float()
    torch.set_num_threads(1)
    print(f"# model 32-64-32-1, rows={args.rows}, 1 thread each; load {_load()}  {time.strftime('%Y-%m-%d %H:%M:%S')}")
    jit = fused.warm_up()
    print(f"# JIT {jit:.2f} s (numba's disk cache when warm)")
    print("| precision | batch | simulate rows/s (CPU) | hls4ml rows/s (CPU) | simulate / hls4ml, CPU | same, wall | notes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for precision in args.precisions.split(";"):
        mlp = offload.nn.MLP.from_float(seq, calib=calib, precision=precision)
        spec = mlp.spec
        tensors = resident_copy(Kernel("m", spec, spec.tensors())).tensors  # the sim device's copies
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            h = mlp.to_hls4ml(d)
            t0 = time.perf_counter()
            h.compile()
            compile_s = time.perf_counter() - t0
            y_hls = np.asarray(h.predict(x)).reshape(args.rows, -1)
            y_sim = simulate(spec.input_type, spec.layers, tensors, x)
            mismatches = int((y_hls != y_sim).sum())

            def general(rows):
                return reference(spec.input_type, spec.layers, tensors, rows)

            same_general = bool(np.array_equal(general(x), y_sim)) and np.array_equal(mlp.simulate(x), y_sim)
            fused_on = fused.program_for(spec.input_type, spec.layers, tensors) is not None
            for b in batches:
                rows = np.ascontiguousarray(x[:b])
                contenders = [lambda: simulate(spec.input_type, spec.layers, tensors, rows), lambda: h.predict(rows)]
                (cs, ws), (ch, wh) = _best(contenders, args.repeats)
                notes = ""
                if b == batches[0]:
                    notes = (f"mismatches vs hls4ml: {mismatches}; == reference and MLP.simulate: {same_general}; "
                             f"fused: {fused_on}; hls4ml compile {compile_s:.0f} s")
                if b == args.rows:
                    ((cg, _),) = _best([lambda: general(rows)], 2)
                    with torch.no_grad():
                        ((ct, _),) = _best([lambda: seq(xt)], 3)
                    notes = f"reference {b / cg:.3g} rows/s (simulate {cg / cs:.1f}x that); torch float {b / ct:.3g} rows/s"
                print(f"| {precision} | {b} | {b / cs:.3g} | {b / ch:.3g} | {ch / cs:.1f}x | {wh / ws:.1f}x | {notes} |", flush=True)
    print(f"# load after: {_load()}")


if __name__ == "__main__":
    main()

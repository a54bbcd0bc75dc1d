"""Benchmark: the bit-exact MLP simulator against hls4ml's C-simulation and the float torch model.

One model (32-64-32-1: Linear, ReLU, Linear, ReLU, Linear, Sigmoid), one process, the same rows
for every contender. Reports rows per second of ``MLP.simulate`` (the sim device's reference),
of hls4ml's ``predict`` on the compiled project of the same types, and of the float torch model,
as ratios; plus the simulator's batch-1 and batch-8 latency. "general path" is the simulator
without its compiled per-call plan (``forward`` layer by layer, what ``simulate`` ran before the
plan existed), measured in the same process. Also checks the simulator equals hls4ml on every row
(a benchmark of a wrong simulator is worthless).

Run::

    .venv/bin/python bench/bench_mlp.py [--rows 20000] [--precision auto|'ap_fixed<16,6>']
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

import offload
from offload.sim.fixed import FixedType
from offload.sim.mlp import forward


def _model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 1), torch.nn.Sigmoid(),
    ).eval()


def _rate(fn, rows: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return rows / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    seq = _model()
    calib = rng.normal(size=(4000, 32))
    x = rng.normal(size=(args.rows, 32)) * 1.5
    mlp = offload.nn.MLP.from_float(seq, calib=calib, precision=args.precision)
    with tempfile.TemporaryDirectory() as d:
        h = mlp.to_hls4ml(d)
        t0 = time.perf_counter()
        h.compile()
        compile_s = time.perf_counter() - t0
        y_hls = np.asarray(h.predict(x)).reshape(args.rows, -1)
        y_sim = mlp.simulate(x)
        mismatches = int((y_hls != y_sim).sum())
        r_hls = _rate(lambda: h.predict(x), args.rows, args.repeats)
    spec, tensors = mlp.spec, mlp._tensors
    out_t = FixedType.parse(spec.output_type)

    def general(rows):
        return out_t.to_float(forward(spec.input_type, spec.layers, tensors, rows))

    assert np.array_equal(general(x), y_sim)
    # Interleaved, best of each: the machine is shared and BLAS threads make single passes noisy.
    r_sim, r_gen = 0.0, 0.0
    for _ in range(args.repeats):
        r_sim = max(r_sim, _rate(lambda: mlp.simulate(x), args.rows, 1))
        r_gen = max(r_gen, _rate(lambda: general(x), args.rows, 1))
    xt = torch.from_numpy(x).float()
    with torch.no_grad():
        r_torch = _rate(lambda: seq(xt), args.rows, args.repeats)

    def latency(fn, rows):
        lat = []
        for _ in range(600):
            t0 = time.perf_counter()
            fn(rows)
            lat.append(time.perf_counter() - t0)
        return statistics.median(lat) * 1e6, float(np.percentile(lat, 99)) * 1e6

    print(f"model 32-64-32-1, precision={args.precision}, rows={args.rows}, hls4ml compile {compile_s:.1f} s")
    print(f"mismatches simulate vs hls4ml predict: {mismatches}")
    print(f"simulator       : {r_sim:12.0f} rows/s   (general path {r_gen:.0f} rows/s, {r_sim / r_gen:.2f}x)")
    print(f"hls4ml predict  : {r_hls:12.0f} rows/s   simulator / hls4ml = {r_sim / r_hls:.1f}x")
    print(f"torch float     : {r_torch:12.0f} rows/s   simulator / torch  = {r_sim / r_torch:.3f}x")
    for b in (1, 8):
        rows = x[:b]
        (m, p), (gm, gp) = latency(mlp.simulate, rows), latency(general, rows)
        print(f"simulator batch-{b} latency: median {m:.0f} us, p99 {p:.0f} us;  general path {gm:.0f} / {gp:.0f} us ({gm / m:.1f}x)")


if __name__ == "__main__":
    main()

"""Throughput of FixedType.quantize / cast / accumulate against plain NumPy passes on the same arrays.

The figure is the ratio of values per second to a baseline run in the same process:
``np.round(x * 2**F)`` (a float-only pass that knows nothing of modes, ties or overflow) for
quantize and cast, ``np.sum`` of int64 for accumulate.

    .venv/bin/python bench/bench_fixed.py            # 10M values
    .venv/bin/python bench/bench_fixed.py --n 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from offload.sim import FixedType, accumulate


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="values per pass")
    ap.add_argument("--repeat", type=int, default=3, help="passes per measurement (best is kept)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # values across the range and beyond it (saturation / wrap paths run too)
    x = rng.normal(0.0, 20.0, args.n)

    base = _best(lambda: np.round(x * 1024.0), args.repeat)
    print(f"n={args.n:,}  baseline np.round(x * 2**F): {args.n / base / 1e6:8.1f} M values/s")
    print(f"{'operation':58s} {'M values/s':>10s} {'vs baseline':>12s}")
    for text in ("ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "ap_fixed<16,6>", "ap_ufixed<12,4,AP_RND,AP_SAT_SYM>", "ap_fixed<64,20,AP_RND_INF,AP_WRAP>", "ap_int<8>"):
        t = FixedType.parse(text)
        dt = _best(lambda t=t: t.quantize(x), args.repeat)
        print(f"{'quantize -> ' + text:58s} {args.n / dt / 1e6:10.1f} {base / dt:11.2f}x")

    src = FixedType.parse("ap_fixed<32,12>")
    raw = src.quantize(x)
    for text in ("ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "ap_fixed<8,4,AP_TRN,AP_WRAP>"):
        t = FixedType.parse(text)
        dt = _best(lambda t=t: t.cast(raw, src), args.repeat)
        print(f"{'cast ' + str(src) + ' -> ' + text:58s} {args.n / dt / 1e6:10.1f} {base / dt:11.2f}x")

    x_t = FixedType.parse("ap_fixed<16,6>")
    xr = x_t.quantize(x).reshape(-1, 64)
    sum_base = _best(lambda: xr.sum(axis=1), args.repeat)
    for text in ("ap_fixed<24,12>", "ap_fixed<24,12,AP_RND_CONV,AP_SAT>"):
        acc = FixedType.parse(text)
        dt = _best(lambda acc=acc: accumulate(xr, x_t, acc, axis=1), args.repeat)
        print(f"{'accumulate 64 terms into ' + text + ' (vs np.sum)':58s} {args.n / dt / 1e6:10.1f} {sum_base / dt:11.2f}x")


if __name__ == "__main__":
    main()

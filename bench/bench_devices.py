"""Per-call cost of the devices on one embedding kernel: sim (NumPy reference) against emu (the
kernel's HLS C++ built with g++, behind card buffer semantics), and what the emu's card semantics
cost over calling the same g++-built top function directly.

For batch sizes 1, 64 and 1024 bags (sum pooling, bags of 20, one table ``--rows`` x ``--dim``,
ap_fixed<16,6>) it times, in one process on the same CPU:

- ``sim``: ``open_device("sim").run`` (validate + reference), the baseline of every ratio;
- ``emu``: ``open_device("emu").run`` (validate + pack + pooled device buffers + copies + C++ + unpack);
- ``ctop``: the same top function called directly on pre-packed buffers (the C++ alone);
- ``emu-4thr``: four threads submitting to one emu device (one compute unit: calls serialise
  on it, as on a card), total time per call.

Usage::

    .venv/bin/python bench/bench_devices.py [--rows 100000] [--dim 64]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from offload.hls.ctop import load_top
from offload.hls.registry import get_hls_kind
from offload.host import open_device
from offload.kernels.embedding import TableSpec, make_kernel, make_spec
from _timing import best_seconds  # noqa: E402  (bench/ is on sys.path when run as a script)


def _best(fn, min_time=0.3, repeats=3) -> float:
    return best_seconds(fn, min_time=min_time, repeats=repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    spec = make_spec([TableSpec("t0", args.rows, args.dim, "ap_fixed<16,6>")], mode="sum", max_bag_size=20)
    kernel = make_kernel("emb", spec, [rng.standard_normal((args.rows, args.dim)).astype(np.float32)])
    sim, emu = open_device("sim"), open_device("emu")
    hs, he = sim.load(kernel), emu.load(kernel)
    hk = get_hls_kind("embedding")
    top = load_top(spec)
    resident = hk.pack_resident(spec, kernel.tensors)
    print(f"embedding sum, 1 table {args.rows} x {args.dim} ap_fixed<16,6>, bags of 20")
    print(f"{'batch':>6} {'sim ms':>9} {'emu ms':>9} {'emu/sim':>8} {'ctop ms':>9} {'emu-ctop ms':>12} {'emu-4thr ms':>12}")
    for batch in (1, 64, 1024):
        idx = rng.integers(0, args.rows, size=batch * 20).astype(np.int64)
        off = np.arange(0, batch * 20 + 1, 20, dtype=np.int64)
        inputs = {"indices": idx, "offsets": off}
        a, b = emu.run(he, inputs), sim.run(hs, inputs)
        assert all(np.array_equal(a[k], b[k]) for k in b)
        packed = hk.pack_inputs(spec, inputs)
        vals = []
        for arg in top.args:
            if arg.role == "resident":
                vals.append(np.ascontiguousarray(resident[arg.name]))
            elif arg.role == "scalar":
                vals.append(packed[arg.name])
            else:
                vals.append(np.ascontiguousarray(packed[arg.name], dtype=arg.dtype))
        t_sim = _best(lambda: sim.run(hs, inputs))
        t_emu = _best(lambda: emu.run(he, inputs))
        t_top = _best(lambda: top(vals))
        with ThreadPoolExecutor(4) as ex:
            def burst():
                list(ex.map(lambda _: emu.run(he, inputs), range(16)))

            t_thr = _best(burst) / 16
        print(f"{batch:>6} {t_sim * 1e3:>9.3f} {t_emu * 1e3:>9.3f} {t_emu / t_sim:>8.2f} {t_top * 1e3:>9.3f} {(t_emu - t_top) * 1e3:>12.3f} {t_thr * 1e3:>12.3f}")
    emu.close()


if __name__ == "__main__":
    main()

"""Embedding lookup throughput of the bit-exact simulator against torch and a NumPy gather.

For batch sizes 1, 64, 4096 and bag sizes 1, 20, 100 (sum pooling, fixed-length bags, one table
of ``--rows`` x ``--dim``) it times, in one process on the same CPU:

- ``torch``: ``torch.nn.EmbeddingBag`` in float32 (the baseline of every ratio);
- ``sim-op``: ``offload.nn.EmbeddingBag`` on the sim device (torch op -> device -> reference);
- ``sim-ref``: the raw reference function ``get_kind("embedding").reference`` on NumPy arrays;
- ``gather``: ``np.take(table_raw, indices, axis=0)``, the same bytes the format stores, into a fresh
  array as the reference's own gather does (page faults included: the ceiling for the reference);
- ``gather-buf``: the same ``np.take`` into a reused buffer (no allocation: the memory ceiling of any
  NumPy code that materialises the gathered rows);

and prints lookups/s, effective bytes/s (lookups x dim x stored bytes per element) and the
ratio to torch. Then the per-call dispatch overhead of the op registration: ``torch.library``
Library+impl (what offload uses) against ``torch.library.custom_op`` and a direct Python call.

Usage (OPENBLAS_NUM_THREADS=1: the simulator's float BLAS sums on one thread, like torch's)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_embedding.py --threads 1 [--rows 100000] [--dim 64] [--fmt ...]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import offload
from offload.kernels import get_kind
from offload.kernels.embedding import ROWWISE
from _timing import best_seconds  # noqa: E402  (bench/ is on sys.path when run as a script)


_best = best_seconds


def bench_throughput(rows: int, dim: int, fmt: str, batches, bags, seed: int = 0, ragged: bool = False) -> list[dict]:
    torch.manual_seed(seed)
    tbag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(tbag, fmt=fmt, max_bag_size=2 * max(bags), device="sim")
    kernel = m.offload_kernels()[0]
    kind = get_kind("embedding")
    table = kernel.tensors["table0"]
    elem_bytes = table.dtype.itemsize + (2 * kernel.tensors["params0"].dtype.itemsize / dim if fmt == ROWWISE else 0)
    rng = np.random.default_rng(seed)
    out = []
    for B in batches:
        for L in bags:
            if ragged:  # bag lengths uniform in [0, 2L]: every length group, empty bags included
                lens = rng.integers(0, 2 * L + 1, B)
                off_np = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
            else:
                off_np = np.arange(B + 1, dtype=np.int64) * L
            idx_np = rng.integers(0, rows, int(off_np[-1])).astype(np.int64)
            idx, off = torch.from_numpy(idx_np), torch.from_numpy(off_np[:-1])
            inputs = {"indices": idx_np, "offsets": off_np}
            with torch.no_grad():
                t_torch = _best(lambda: tbag(idx, off))
            t_op = _best(lambda: m(idx, off))
            t_ref = _best(lambda: kind.reference(kernel.spec, kernel.tensors, inputs))
            t_gather = _best(lambda: np.take(table, idx_np, axis=0))
            buf = np.empty((idx_np.shape[0], dim), dtype=table.dtype)
            # mode="clip": with the default "raise" np.take copies into a temporary before `out`.
            t_gbuf = _best(lambda: np.take(table, idx_np, axis=0, out=buf, mode="clip"))
            n = int(off_np[-1])
            for name, t, eb in (("torch", t_torch, 4), ("sim-op", t_op, elem_bytes), ("sim-ref", t_ref, elem_bytes),
                                ("gather", t_gather, elem_bytes), ("gather-buf", t_gbuf, elem_bytes)):
                out.append({"batch": B, "bag": f"0..{2 * L}" if ragged else L, "impl": name, "lookups_s": n / t,
                            "bytes_s": n * dim * eb / t, "vs_torch": t_torch / t, "vs_gather": t_gather / t})
    return out


def bench_dispatch() -> dict[str, float]:
    """Seconds per call of an op whose body does nothing, per registration route."""
    out0 = torch.empty(0)

    def body(rid: int, indices: torch.Tensor, offsets: torch.Tensor, w, dtype) -> torch.Tensor:
        return out0.new_empty(0)

    lib = torch.library.Library("offload_bench", "DEF")
    lib.define("lib_op(int rid, Tensor indices, Tensor offsets, Tensor? w, ScalarType dtype) -> Tensor")
    lib.impl("lib_op", body, "CompositeExplicitAutograd")

    @torch.library.custom_op("offload_bench::custom_op", mutates_args=())
    def custom(rid: int, indices: torch.Tensor, offsets: torch.Tensor, w: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        return out0.new_empty(0)

    i, o = torch.zeros(4, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    return {
        "direct": _best(lambda: body(1, i, o, None, torch.float32)),
        "library_impl": _best(lambda: torch.ops.offload_bench.lib_op(1, i, o, None, torch.float32)),
        "custom_op": _best(lambda: torch.ops.offload_bench.custom_op(1, i, o, None, torch.float32)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--fmt", default="ap_fixed<16,6,AP_RND_CONV,AP_SAT>")
    ap.add_argument("--batches", default="1,64,4096")
    ap.add_argument("--bags", default="1,20,100")
    ap.add_argument("--ragged-batch", type=int, default=4096, help="also time ragged bags (lengths 0..2L) at this batch; 0: skip")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    batches = [int(x) for x in a.batches.split(",")]
    bags = [int(x) for x in a.bags.split(",")]
    print(f"# rows={a.rows} dim={a.dim} fmt={a.fmt} torch threads={torch.get_num_threads()}")
    print("| batch | bag | impl | lookups/s | bytes/s | x torch f32 | x gather |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    rows = bench_throughput(a.rows, a.dim, a.fmt, batches, bags)
    if a.ragged_batch:
        rows += bench_throughput(a.rows, a.dim, a.fmt, [a.ragged_batch], bags, seed=1, ragged=True)
    for r in rows:
        print(f"| {r['batch']} | {r['bag']} | {r['impl']} | {r['lookups_s']:.3g} | {r['bytes_s'] / 1e9:.3g} GB/s | {r['vs_torch']:.2f} | {r['vs_gather']:.2f} |")
    d = bench_dispatch()
    print("\n| registration | us per call (empty body) | overhead vs direct |")
    print("|---|---:|---:|")
    for k, v in d.items():
        print(f"| {k} | {v * 1e6:.2f} | {(v - d['direct']) * 1e6:+.2f} us |")


if __name__ == "__main__":
    main()

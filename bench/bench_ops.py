"""The op shim's per-call cost: ``torch.ops.offload.*`` and the ``offload.nn`` modules against torch's own.

One process, one thread (``torch.set_num_threads(1)``, the fused kernels follow it), the same data
for every contender, timed round-robin: each round runs every contender for a short window, and
each figure is the median over ``--rounds`` rounds. Ratios are taken within a round (a contender
against torch in the same round) and their median reported, so a busy spell on the shared
machine hits both sides of a ratio alike. Time is the calling thread's CPU time by default
(``--clock wall`` for wall time): on a loaded box a window's wall time is mostly other processes.

Embedding (one table ``--rows`` x ``--dim`` in ``ap_fixed<16,6,AP_RND_CONV,AP_SAT>``, sum,
fixed-length bags; batch x bag 1x1, 1x20, 64x20, 4096x20, 4096x100):

- ``F``: ``torch.nn.functional.embedding_bag`` on the float32 table (the op's baseline);
- ``torch``: ``torch.nn.EmbeddingBag`` (the module's baseline);
- ``op``: ``torch.ops.offload.embedding_lookup`` (offsets with the end, as the op takes them): its
  C++ kernel where it is built (:mod:`offload.ops.native`), which serves these calls;
- ``py``: ``torch.ops.offload._embedding_lookup_py``, the same op's Python implementation (what
  ``op`` runs where the C++ kernel is not built);
- ``module``: ``offload.nn.EmbeddingBag`` on the sim device;
- ``kernel``: the fused kernels alone (:func:`offload.sim.embedding.fused.run`, validated inputs,
  the raw int64 result) on the device's aligned resident tables.

MLP (32-64-32-1, ``ap_fixed<16,6>``; batch 1, 64, 4096, float32 rows):

- ``torch``: the float ``nn.Sequential``; ``op``: ``torch.ops.offload.mlp_score``; ``module``:
  ``offload.nn.MLP``; ``kernel``: the sim device's compiled FP32 pass (``bind_rows(fp32=True)``,
  unguarded, checked rows).

Everything runs under ``torch.inference_mode()`` and again under ``torch.no_grad()``.
``--profile CASE`` (``emb:1x20``, ``mlp:64``...) prints a cProfile of the module's calls instead.

Run::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_ops.py [--rounds 21] [--only emb|mlp]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

import offload
from offload.kernels import get_kind
from offload.kernels.embedding import fused_plan, lookup_of
from offload.sim.embedding import fused
from offload.sim.layout import aligned_copy

EMB_CASES = ((1, 1), (1, 20), (64, 20), (4096, 20), (4096, 100))
MLP_BATCHES = (1, 64, 4096)
FMT = "ap_fixed<16,6,AP_RND_CONV,AP_SAT>"
MODES = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}


def _window(fn, n: int, clock) -> float:
    t0 = clock()
    for _ in range(n):
        fn()
    return (clock() - t0) / n


def paired(fns: dict, rounds: int, clock, target_s: float = 0.004) -> dict[str, list[float]]:
    """Seconds per call of each contender in each round (windows of about ``target_s``, round-robin)."""
    calls = {}
    for k, fn in fns.items():  # warm up, then size each window
        fn()
        one = max(_window(fn, 3, time.perf_counter), 1e-7)
        calls[k] = max(3, int(target_s / one))
    per: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            per[k].append(_window(fn, calls[k], clock))
    return per


def us(per: dict, k: str) -> float:
    """Median microseconds per call of contender ``k``."""
    return statistics.median(per[k]) * 1e6


def ratio(per: dict, k: str, base: str) -> float:
    """Median over rounds of ``k``'s time over ``base``'s in the same round."""
    return statistics.median(a / b for a, b in zip(per[k], per[base]))


def emb_contenders(rows: int, dim: int, B: int, L: int, state: dict) -> dict:
    if "m" not in state:
        torch.manual_seed(0)
        state["bag"] = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        state["m"] = offload.nn.EmbeddingBag.from_float(state["bag"], fmt=FMT, max_bag_size=200, device="sim")
        k = state["m"].offload_kernels()[0]
        aligned = {n: aligned_copy(v) for n, v in k.tensors.items()}
        state["plan"] = fused_plan(k.spec)
        state["arrays"] = lookup_of(k.spec).arrays(aligned)
    bag, m, plan = state["bag"], state["m"], state["plan"]
    tables, params = state["arrays"]
    weight = bag.weight.detach()
    rng = np.random.default_rng(B * 1000 + L)
    idx_np = rng.integers(0, rows, B * L).astype(np.int64)
    off_np = np.arange(B + 1, dtype=np.int64) * L
    idx, off, off_end = torch.from_numpy(idx_np), torch.from_numpy(off_np[:-1].copy()), torch.from_numpy(off_np)
    op, py, rid = torch.ops.offload.embedding_lookup, torch.ops.offload._embedding_lookup_py, m.rid
    return {
        "F": lambda: F.embedding_bag(idx, weight, off, mode="sum"),
        "torch": lambda: bag(idx, off),
        "op": lambda: op(rid, idx, off_end, None, torch.float32),
        "py": lambda: py(rid, idx, off_end, None, torch.float32),
        "module": lambda: m(idx, off),
        "kernel": lambda: fused.run(plan, tables, params, idx_np, off_np),
    }


def mlp_contenders(B: int, state: dict) -> dict:
    if "m" not in state:
        torch.manual_seed(0)
        state["seq"] = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
            torch.nn.Linear(32, 1), torch.nn.Sigmoid()).eval()
        m = state["m"] = offload.nn.MLP.from_float(state["seq"], precision="ap_fixed<16,6>", device="sim")
        k = m._res.kernel  # the kernel alone: the kind's prepared call, without the device's closed check
        state["rows"] = get_kind(k.kind).bind_rows(k.spec, k.tensors, fp32=True)
    seq, m, rows = state["seq"], state["m"], state["rows"]
    x = torch.from_numpy(np.random.default_rng(B).normal(size=(B, 32)).astype(np.float32))
    xn = x.numpy()
    op, rid = torch.ops.offload.mlp_score, m.rid
    return {"torch": lambda: seq(x), "op": lambda: op(rid, x), "module": lambda: m(x), "kernel": lambda: rows(xn)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--only", choices=("emb", "mlp"), default=None)
    ap.add_argument("--modes", default="inference_mode,no_grad")
    ap.add_argument("--profile", default=None, help="emb:BxL or mlp:B: cProfile the module's calls and stop")
    a = ap.parse_args()
    torch.set_num_threads(1)
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    emb_state: dict = {}
    mlp_state: dict = {}
    if a.profile:
        kind, case = a.profile.split(":")
        if kind == "emb":
            B, L = (int(v) for v in case.split("x"))
            fn = emb_contenders(a.rows, a.dim, B, L, emb_state)["module"]
        else:
            fn = mlp_contenders(int(case), mlp_state)["module"]
        with torch.inference_mode():
            fn()
            n = max(20, int(2.0 / max(_window(fn, 5, time.perf_counter), 1e-7)))
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(n):
                fn()
            pr.disable()
        print(f"# {n} calls of the module, {a.profile}")
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        return
    print(f"# 1 thread, clock={a.clock}, rounds={a.rounds}, medians; torch {torch.__version__}; "
          f"load {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M:%S')}")
    for mode in a.modes.split(","):
        ctx = MODES[mode]
        if a.only in (None, "emb"):
            print(f"\n## embedding, {mode}, table {a.rows} x {a.dim} {FMT}, sum\n")
            print("| batch x bag | F us | op us | op / F | py us | py / F | torch us | module us | module / torch | kernel us | op / kernel | module / kernel |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for B, L in EMB_CASES:
                with ctx():
                    p = paired(emb_contenders(a.rows, a.dim, B, L, emb_state), a.rounds, clock)
                print(f"| {B} x {L} | {us(p, 'F'):.1f} | {us(p, 'op'):.1f} | {ratio(p, 'op', 'F'):.2f} | {us(p, 'py'):.1f} | "
                      f"{ratio(p, 'py', 'F'):.2f} | {us(p, 'torch'):.1f} | "
                      f"{us(p, 'module'):.1f} | {ratio(p, 'module', 'torch'):.2f} | {us(p, 'kernel'):.1f} | "
                      f"{ratio(p, 'op', 'kernel'):.2f} | {ratio(p, 'module', 'kernel'):.2f} |", flush=True)
        if a.only in (None, "mlp"):
            print(f"\n## mlp 32-64-32-1 ap_fixed<16,6>, {mode}, float32 rows\n")
            print("| batch | torch us | op us | op / torch | module us | module / torch | kernel us | op / kernel | module / kernel |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for B in MLP_BATCHES:
                with ctx():
                    p = paired(mlp_contenders(B, mlp_state), a.rounds, clock)
                print(f"| {B} | {us(p, 'torch'):.1f} | {us(p, 'op'):.1f} | {ratio(p, 'op', 'torch'):.2f} | {us(p, 'module'):.1f} | "
                      f"{ratio(p, 'module', 'torch'):.2f} | {us(p, 'kernel'):.1f} | {ratio(p, 'op', 'kernel'):.2f} | "
                      f"{ratio(p, 'module', 'kernel'):.2f} |", flush=True)
    print(f"\n# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()

"""DLRM example: accuracy of the offloaded model per table format (sim device, bit-exact to the kernel).

Trains the DLRM once, then offloads its 8 tables with each storage format and reports the card
memory the tables take, the output cosine / max error against float and the AUC before and after.

    .venv/bin/python bench/bench_dlrm.py [--full] [--steps N] [--n-eval N]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

FORMATS = ("ap_fixed<16,6>", "ap_fixed<16,2>", "ap_fixed<12,2>", "ap_fixed<8,2>", "int8_rowwise")


def main(argv: list[str] | None = None) -> None:
    import offload
    from offload.examples import dlrm
    from offload.partition.budget import table_bytes
    from offload.quant.metrics import auc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="10^4..10^6-row tables at dim 32")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--n-eval", type=int, default=8192)
    a = ap.parse_args(argv)
    print(f"command: .venv/bin/python bench/bench_dlrm.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    t0 = time.perf_counter()
    model, make = dlrm.build(small=not a.full, steps=a.steps)
    test = make(a.n_eval, 7)
    with torch.no_grad():
        p_float = model(*test.inputs)
    auc_f = auc(test.labels, p_float)
    cfg = model.cfg
    f32 = sum(table_bytes(n, cfg.dim, "ap_fixed<32,16>") for n in cfg.table_rows)
    print(f"DLRM {'full' if a.full else 'small'}: tables {cfg.table_rows} x dim {cfg.dim}, float32 {f32 / 2**20:.1f} MiB; "
          f"trained in {time.perf_counter() - t0:.0f} s; AUC float {auc_f:.4f} on {a.n_eval} impressions\n")
    print("| table format | card memory | output cosine | output max abs err | worst table max abs err | AUC float | AUC offloaded |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for fmt in FORMATS:
        gm = offload.offload(model, test.batches(256)[0].inputs, ops=("embedding_bag",), fmt=fmt, device="sim")
        cmp = offload.compare(model, gm, test.inputs)
        with torch.no_grad():
            p_off = gm(*test.inputs)
        mem = sum(table_bytes(n, cfg.dim, fmt) for n in cfg.table_rows)
        worst = max(d.max_abs_err for d in cmp.local)
        print(f"| {fmt} | {mem / 2**20:.1f} MiB | {cmp.min_cosine:.6f} | {cmp.max_abs_err:.2e} | {worst:.2e} | {auc_f:.4f} | {auc(test.labels, p_off):.4f} |")


if __name__ == "__main__":
    main()

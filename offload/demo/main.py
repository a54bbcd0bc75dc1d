"""The main demo (``offload demo``, README's first command): short sections, each checked for real.

Each section is a function ``(console) -> bool`` (False: the section found a mismatch) listed in
:data:`SECTIONS`; add a section by writing one and appending it there. :func:`run_demo` runs them
all in order and exits non-zero when any fails.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from typing import Callable

import numpy as np
import torch
from rich import box
from rich.console import Console
from rich.table import Table

import offload
from offload.demo.partition import partition_demo_section
from offload.demo.serve import serve_demo_section
from offload.examples.risk import make_transactions, train_float_model
from offload.hls import csim
from offload.hls.fixed_proof import Case, run_cases
from offload.host import open_device
from offload.quant.metrics import auc
from offload.sim import FixedType

__all__ = ["SECTIONS", "run_demo", "section_fixed_point", "section_mlp", "section_partition", "section_serve"]


def section_fixed_point(console: Console) -> bool:
    """Quantize a few values into ap_fixed formats with offload.sim, then re-check them in C++ ap_types."""

    console.rule("[bold]Fixed-point: offload.sim.FixedType vs ap_types")
    formats = [
        FixedType.parse("ap_fixed<16,6,AP_RND_CONV,AP_SAT>"),
        FixedType.parse("ap_fixed<8,3,AP_RND,AP_SAT_SYM>"),
        FixedType.parse("ap_ufixed<8,4>"),
    ]
    # ties of ap_fixed<8,3> (81.5 and -1.5 LSBs), a value past saturation (wraps in ap_ufixed), tiny, far out
    values = np.array([0.1, -3.14159, 2.546875, -0.046875, 17.75, 1e-9, -1e3])
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("value", "format", "raw", "back", "error"):
        table.add_column(name, justify="left" if name == "format" else "right", no_wrap=True)
    raws = [t.quantize(values) for t in formats]
    for i, v in enumerate(values):
        for k, t in enumerate(formats):
            back = t.to_float(raws[k][i])
            table.add_row(f"{v:.7g}" if k == 0 else "", str(t), str(raws[k][i]), f"{back:.6g}", f"{back - v:+.2g}", end_section=k == len(formats) - 1)
    console.print(table)

    try:
        ref = run_cases([Case("quantize", (t,)) for t in formats], [values] * len(formats))
    except csim.ToolchainMissing as e:
        console.print(f"[yellow]C-simulation skipped: {e}")
        return True
    total = sum(r.size for r in raws)
    exact = sum(int(np.sum(r == ref_raw)) for r, (ref_raw, _) in zip(raws, ref))
    colour = "green" if exact == total else "red"
    console.print(f"[{colour}]C-simulation: {exact}/{total} bit-exact[/] (same values through ap_types, g++)")
    return exact == total


def section_mlp(console: Console) -> bool:
    """Quantize the risk-scoring MLP with calibration, then check it bit for bit against hls4ml and the emu device."""

    console.rule("[bold]Scoring MLP: calibrated quantization, bit-exact to hls4ml's C-simulation")
    x, y = make_transactions(14000, seed=0)
    xtr, ytr, xte, yte = x[:10000], y[:10000], x[10000:], y[10000:]
    model = train_float_model(xtr, ytr, epochs=10)
    mlp = offload.nn.MLP.from_float(model, calib=xtr[:2000], precision="auto")
    mlp.report.print(console)
    with torch.no_grad():
        s_float = model(torch.from_numpy(xte)).numpy().ravel()
    s_sim = mlp.simulate(xte.astype(np.float64))
    console.print(f"AUC float {auc(yte, s_float):.4f}  ->  quantized {auc(yte, s_sim.ravel()):.4f} on {len(yte)} held-out rows")

    ok = True
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):  # hls4ml prints per layer
        graph = mlp.to_hls4ml(d)
        graph.compile()
        ref = np.asarray(graph.predict(np.ascontiguousarray(xte.astype(np.float64)))).reshape(s_sim.shape)
    same = int(np.sum(ref == s_sim))
    ok &= same == s_sim.size
    console.print(f"[{'green' if same == s_sim.size else 'red'}]hls4ml compile()+predict(): {same}/{s_sim.size} bit-exact[/]")

    # The kernel's generated C++ (hls4ml firmware in a Vitis top), built with g++, behind card buffer semantics.
    emu = open_device("emu")
    (kernel,) = mlp.offload_kernels()
    h = emu.load(kernel)
    out = emu.run(h, {"x": xte[:512].astype(np.float64)})["y"]
    same_emu = int(np.sum(out == s_sim[:512]))
    ok &= same_emu == out.size
    console.print(f"[{'green' if same_emu == out.size else 'red'}]emu device (kernel C++ via g++): {same_emu}/{out.size} bit-exact[/]")
    emu.close()
    return ok


def section_partition(console: Console) -> bool:
    return partition_demo_section(console)


def section_serve(console: Console) -> bool:
    return serve_demo_section(console)


SECTIONS: list[Callable[[Console], bool]] = [section_fixed_point, section_mlp, section_partition, section_serve]


def run_demo(console: Console | None = None) -> None:
    """Run every section; exit with status 1 if any reports a mismatch."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: rich would fold the report tables at 80 columns
            console = Console(width=140)
    failed = []
    for section in SECTIONS:
        t0 = time.perf_counter()
        ok = section(console)
        console.print(f"[dim]{section.__name__}: {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s[/]")
        if not ok:
            failed.append(section.__name__)
    if failed:
        console.print(f"[bold red]demo failed: {', '.join(failed)}")
        sys.exit(1)

"""Validate the offload advisor's analytical model and show its advice on the DLRM example.

1. Against a real Vivado HLS 2019.2 csynth report (hls4ml autoencoder fixture): predicted vs
   reported worst-case latency and DSPs of every convolution, and of the whole dataflow design.
2. ``offload.advise`` on the DLRM example (small tables by default, ``--full`` for 10^4..10^6 rows):
   measured host latency vs predicted card latency at batch 1, 64, 4096.
3. ``offload.advise(..., launch="auto")`` on the risk MLP (16-32-16-1, the ``offload advise risk``
   model): host vs card per call and persistent (MODELLED, not measured on a card) at batch 1, 64,
   4096; ``--rtl`` takes the kernel time from the cycles its da4ml Verilog measures under Verilator.

    .venv/bin/python bench/bench_advisor.py [--full] [--card u55c] [--threads 1] [--report RPT] [--rtl]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import offload
from offload.advisor.validate import check_autoencoder
from offload.examples import dlrm
from offload.examples.risk import make_transactions
from offload.hls.cards import CARDS
from offload.hls.reports import parse_report

# The report committed with the tests (tests/fixtures/hls-reports/README.md says where it comes from).
REPORT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hls-reports" / "vivado-2019.2-hls4ml-autoencoder" / "myproject_csynth.rpt"


def validate(rpt: Path) -> None:
    checks = check_autoencoder(rpt)
    top = parse_report(rpt)
    print(f"## Model vs {rpt.parent.name} ({top.tool_version}, {top.part}, {top.target_clock_ns} ns)\n")
    print("| layer | predicted cycles | reported max cycles | ratio | predicted DSP | reported DSP | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in checks:
        print(f"| {c.name} | {c.predicted_cycles} | {c.reported_cycles} | {c.cycles_ratio:.2f} | {c.predicted_dsp} | {c.reported_dsp} | {c.dsp_ratio:.2f} |")
    # Dataflow design: latency of the slowest stage (stages overlap); DSPs add up. The report's
    # total DSP also counts non-conv instances (none use DSPs here).
    pred_lat = max(c.predicted_cycles for c in checks)
    pred_dsp = sum(c.predicted_dsp for c in checks)
    print(f"| whole design (dataflow: slowest stage) | {pred_lat} | {top.latency_max} | {pred_lat / top.latency_max:.2f} "
          f"| {pred_dsp} | {top.resources['DSP']} | {pred_dsp / top.resources['DSP']:.2f} |\n")


def advise_dlrm(full: bool, card: str) -> None:
    cfg = dlrm.DLRMConfig() if full else dlrm.DLRMConfig.small()
    torch.manual_seed(0)
    model = dlrm.DLRM(cfg).eval()  # timing does not depend on training
    data = dlrm.make_clicks(cfg, 512, seed=1)
    adv = offload.advise(model, data.inputs, batch_sizes=(1, 64, 4096), card=card, ops=("embedding_bag", "mlp"), repeats=25, budget_s=1.0)
    print(f"## offload.advise, DLRM ({'full' if full else 'small'}), card {card}, torch threads {torch.get_num_threads()}\n")
    print("| candidate | batch | host (median) | card predicted (xfer + launch + kernel) | verdict |")
    print("|---|---:|---:|---:|---|")
    for r in adv.rows:
        print(f"| {r.name} | {r.batch} | {r.host_s * 1e6:.0f} us | {r.card_s * 1e6:.0f} us ({r.transfer_s * 1e6:.0f} + "
              f"{r.launch_s * 1e6:.0f} + {r.kernel_s * 1e6:.0f}) | {r.verdict} |")


def advise_risk(card: str, rtl: bool) -> None:
    torch.manual_seed(0)  # the `offload advise risk` model: timing does not need training
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid()).eval()
    x, _ = make_transactions(256)
    inputs = (torch.from_numpy(x),)
    with tempfile.TemporaryDirectory(prefix="bench-advisor-rtl-") as tmp:
        summaries = {}
        if rtl:  # needs the rtl extra (da4ml, verilator)
            from offload.nn import MLP

            mlp = MLP.from_float(model, calib=x, precision="auto", device="sim")
            r = mlp.to_rtl(str(Path(tmp) / "risk"), clock_mhz=300)
            r.predict(x[:64])
            summaries = {"_0.._5": r.summary()}
        adv = offload.advise(model, inputs, batch_sizes=(1, 64, 4096), card=card, ops=("mlp",), repeats=25, budget_s=1.0,
                             launch="auto", rtl=summaries)
    kernel = f"RTL, {summaries['_0.._5'].latency_cycles} cycles under Verilator" if summaries else "the analytical HLS model"
    print(f"\n## offload.advise, risk MLP 16-32-16-1, card {card}, launch auto, torch threads {torch.get_num_threads()}, "
          f"kernel time from {kernel}\n")
    print("| batch | host (median) | card per-call (xfer + launch + kernel) | card persistent, MODELLED (xfer + poll + kernel) "
          "| auto picks | verdict |")
    print("|---:|---:|---:|---:|---|---|")
    for r in adv.rows:
        pc, ps = (_parts(r.modes[m]) for m in ("per_call", "persistent"))
        print(f"| {r.batch} | {_us(r.host_s)} | {pc} | {ps} | {r.launch} | {r.verdict} |")
    print()
    for n in adv.notes:
        print(f"- {n}")


def _parts(m: dict[str, float]) -> str:
    return f"{_us(m['card_s'])} ({_us(m['transfer_s'])} + {_us(m['launch_s'])} + {_us(m['kernel_s'])})"


def _us(s: float) -> str:
    return f"{s * 1e6:.3g} us" if s < 1e-3 else f"{s * 1e3:.3g} ms"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--card", default="u55c", choices=sorted(CARDS))
    ap.add_argument("--report", type=Path, default=REPORT, help="classic csynth .rpt of the hls4ml autoencoder")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave torch's default)")
    ap.add_argument("--rtl", action="store_true", help="risk MLP: kernel time from its da4ml RTL under Verilator (rtl extra)")
    ap.add_argument("--only-risk", action="store_true", help="skip the report check and the DLRM advice")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"command: {' '.join(['.venv/bin/python', 'bench/bench_advisor.py', *(argv if argv is not None else sys.argv[1:])])}\n")
    if not a.only_risk:
        validate(a.report)
        advise_dlrm(a.full, a.card)
    advise_risk(a.card, a.rtl)


if __name__ == "__main__":
    main()

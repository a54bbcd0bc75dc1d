"""The risk-scoring MLP on real tabular data (UCI Adult, income > 50K): PTQ against QAT with Brevitas.

Data: :func:`offload.data.load_adult` (50 scaled features, 23.9 % positives), split 60/20/20 into
train, calibration-and-validation, and test. Three kernels of one float network (the risk
example's 32-16-1 ReLU MLP, trained on logits: a final sigmoid changes no AUC and would cost every
variant a lookup table):

- ``ptq16``: post-training quantization to ``ap_fixed<16,6>`` everywhere;
- ``ptq_auto``: the calibrated PTQ search (``precision="auto"``, AUC budget on validation labels);
- ``qat<b>``: the float network fine-tuned with Brevitas at ``b``-bit weights and activations
  (power-of-two scales, Brevitas's default rounding: half to even, a 6-bit input quantizer, an
  8-bit output), then ``MLP.from_brevitas``.

For each: test AUC, and with ``rtl=True`` the da4ml Verilog's measured Verilator latency and its
Yosys LUTs (``synth_xilinx -family xcup``), the RTL checked against ``simulate``; for the QAT
kernel also the check that ``simulate`` equals Brevitas's forward bit for bit on the test rows
and (with ``rtl=True``) that hls4ml's C-simulation equals both on the RTL's rows.

Example::

    from offload.examples.adult import run
    res = run(rtl=True); print(res.table())
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import offload
from offload.data.adult import load_adult
from offload.examples.risk import train_float_model
from offload.quant.metrics import auc

__all__ = ["Variant", "AdultResult", "splits", "brevitas_model", "fine_tune", "run"]

HIDDEN = (32, 16)


def splits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Train (60 %), validation (20 %: calibration and the PTQ search's labels) and test (20 %)."""
    a = load_adult()
    idx = np.random.default_rng(seed).permutation(len(a.y))
    n = len(idx) // 5
    parts = {"test": idx[:n], "val": idx[n:2 * n], "train": idx[2 * n:]}
    return {k: (a.x[v], a.y[v]) for k, v in parts.items()}


def brevitas_model(float_model: nn.Sequential, bits: int = 4, input_bits: int = 6, output_bits: int = 8,
                   rounding: str = "round") -> nn.Sequential:
    """A Brevitas copy of the float MLP (weights copied): power-of-two-scale quantizers throughout,
    ``bits``-bit weights and ReLU outputs, a ``input_bits``-bit signed input, an ``output_bits`` output.

    ``rounding`` of the activation quantizers: ``"round"`` (Brevitas's default, ``torch.round``:
    half to even, ``AP_RND_CONV``) or ``"floor"`` (``AP_TRN``: no rounding adder)."""
    import brevitas.nn as qnn
    from brevitas.quant import Int8ActPerTensorFixedPoint, Int8WeightPerTensorFixedPoint, Int32Bias, Uint8ActPerTensorFixedPoint

    lin = [m for m in float_model if isinstance(m, nn.Linear)]
    r = {"float_to_int_impl_type": rounding}
    layers: list[nn.Module] = [qnn.QuantIdentity(bit_width=input_bits, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True, **r)]
    for i, m in enumerate(lin):
        q = qnn.QuantLinear(m.in_features, m.out_features, bias=True, weight_bit_width=bits, weight_quant=Int8WeightPerTensorFixedPoint,
                            bias_quant=Int32Bias, return_quant_tensor=True)
        with torch.no_grad():
            q.weight.copy_(m.weight)
            q.bias.copy_(m.bias)
        layers.append(q)
        if i < len(lin) - 1:
            layers.append(qnn.QuantReLU(bit_width=bits, act_quant=Uint8ActPerTensorFixedPoint, return_quant_tensor=True, **r))
    layers.append(qnn.QuantIdentity(bit_width=output_bits, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True, **r))
    return nn.Sequential(*layers)


def _logits(qm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    y = qm(x)
    return (y.value if hasattr(y, "value") else y).reshape(-1)


def fine_tune(qm: nn.Sequential, x: np.ndarray, y: np.ndarray, epochs: int = 6, lr: float = 1e-3, seed: int = 0) -> nn.Sequential:
    """Quantization-aware training: Adam on BCE through Brevitas's straight-through estimators."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(qm.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    g = torch.Generator().manual_seed(seed)
    qm.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=g).split(256):
            opt.zero_grad()
            loss_fn(_logits(qm, xt[idx]), yt[idx]).backward()
            opt.step()
    return qm.eval()


@dataclass
class Variant:
    name: str
    mlp: Any = field(repr=False)
    auc: float
    cycles: int | None = None
    luts: float | None = None
    ffs: float | None = None
    da4ml_luts: float | None = None  # da4ml's own LUT estimate of the same design (no synthesis)
    rtl_matches_simulate: bool | None = None
    csim_matches_simulate: bool | None = None  # hls4ml's C-simulation, QAT kernels with rtl=True


@dataclass
class AdultResult:
    """Test AUCs of the float model and every kernel; per QAT width whether ``simulate`` equals
    Brevitas's forward on every test row (and the largest difference)."""

    auc_float: float
    variants: list[Variant]
    qat_bit_exact_vs_brevitas: dict[int, bool]
    qat_max_deviation: dict[int, float]
    n_test: int
    brevitas_models: dict[int, Any] = field(repr=False, default_factory=dict)

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def table(self) -> str:
        """The Markdown table BENCHMARKS.md shows."""
        base, est = self.variant("ptq16").luts, self.variant("ptq16").da4ml_luts
        lines = [f"| kernel | test AUC (float {self.auc_float:.4f}) | Verilator cycles | Yosys LUTs | LUTs vs PTQ <16,6> | FFs "
                 "| da4ml LUT estimate (vs PTQ) |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for v in self.variants:
            ratio = f"{v.luts / base:.2f}x" if v.luts and base else ""
            e = "" if v.da4ml_luts is None else f"{v.da4ml_luts:.0f}" + (f" ({v.da4ml_luts / est:.2f}x)" if est else "")
            lines.append(f"| {v.name} | {v.auc:.4f} | {v.cycles if v.cycles is not None else ''} | "
                         f"{'' if v.luts is None else f'{v.luts:.0f}'} | {ratio} | {'' if v.ffs is None else f'{v.ffs:.0f}'} | {e} |")
        return "\n".join(lines)


def _rtl(v: Variant, x: np.ndarray, out: Path, build: bool = True) -> None:
    """da4ml's design and its LUT estimate (seconds); ``build``: Verilator and Yosys too (a 16-bit
    design takes Yosys about 20 minutes)."""
    rtl = v.mlp.to_rtl(str(out / v.name), clock_mhz=300.0)
    v.da4ml_luts = float(rtl.meta["da4ml_cost_lut"])
    if not build:
        return
    rtl.compile()
    v.cycles = int(rtl.latency_cycles)
    v.rtl_matches_simulate = bool(np.array_equal(rtl.predict(x), v.mlp.simulate(x)))
    res = rtl.resources()
    v.luts, v.ffs = float(res["LUT"]), float(res["FF"])


def _csim(v: Variant, x: np.ndarray, out: Path) -> None:
    import warnings

    model = v.mlp.to_hls4ml(str(out / f"{v.name}_hls4ml"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.compile()
        got = np.asarray(model.predict(np.ascontiguousarray(x))).reshape(v.mlp.simulate(x).shape)
    v.csim_matches_simulate = bool(np.array_equal(got, v.mlp.simulate(x)))


def run(bits: int | tuple[int, ...] = (4, 5, 6), seed: int = 0, epochs: int = 20, qat_epochs: int = 6, rtl: bool = False,
        rtl_rows: int = 256, out_dir: str | None = None, rounding: str = "round", rtl_variants: tuple[str, ...] | None = None
        ) -> AdultResult:
    """Train, quantize (PTQ twice, QAT at each of ``bits``), score on the test split; ``rtl``: Verilator
    cycles and Yosys LUTs too (``rtl_rows`` test rows checked against ``simulate`` on the RTL, and
    on the QAT kernels against hls4ml's C-simulation). ``rounding``: the Brevitas activation
    quantizers' (``"round"`` or ``"floor"``); ``rtl_variants``: the names built under
    Verilator and Yosys (default all; the others get da4ml's LUT estimate only).

    Example::

        res = run(bits=4); res.variant("qat4").auc, res.qat_bit_exact_vs_brevitas[4]
    """
    s = splits(seed)
    (xtr, ytr), (xva, yva), (xte, yte) = s["train"], s["val"], s["test"]
    model = train_float_model(xtr, ytr, hidden=HIDDEN, sigmoid=False, epochs=epochs, seed=seed)
    with torch.no_grad():
        auc_float = auc(yte, model(torch.from_numpy(xte)).numpy())
    calib = xva[:2000]
    x64 = xte.astype(np.float64)
    ptq16 = offload.nn.MLP.from_float(model, calib=calib, precision="ap_fixed<16,6>")
    ptq_auto = offload.nn.MLP.from_float(model, calib=calib, labels=yva[:2000], precision="auto")
    variants = [Variant("ptq16", ptq16, auc(yte, ptq16.simulate(x64))), Variant("ptq_auto", ptq_auto, auc(yte, ptq_auto.simulate(x64)))]
    exact, dev, qms = {}, {}, {}
    for b in (bits,) if isinstance(bits, int) else tuple(bits):
        qm = fine_tune(brevitas_model(model, b, rounding=rounding), xtr, ytr, epochs=qat_epochs, seed=seed)
        qmlp = offload.nn.MLP.from_brevitas(qm, calib=calib)
        q_sim = qmlp.simulate(x64).reshape(-1)
        with torch.no_grad():
            q_ref = _logits(qm, torch.from_numpy(xte)).double().numpy()
        exact[b], dev[b], qms[b] = bool(np.array_equal(q_sim, q_ref)), float(np.abs(q_sim - q_ref).max()), qm
        variants.append(Variant(f"qat{b}", qmlp, auc(yte, q_sim)))
    if rtl:
        with tempfile.TemporaryDirectory(prefix="adult-rtl-") as tmp:
            for v in variants:
                build = rtl_variants is None or v.name in rtl_variants
                _rtl(v, x64[:rtl_rows], Path(out_dir or tmp), build)
                if build and v.name.startswith("qat"):
                    _csim(v, x64[:rtl_rows], Path(out_dir or tmp))
    return AdultResult(float(auc_float), variants, exact, dev, len(yte), qms)


def main() -> None:  # pragma: no cover - a command-line wrapper around run()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", default="4,5,6", help="QAT widths, comma-separated")
    ap.add_argument("--qat-epochs", type=int, default=6)
    ap.add_argument("--rtl", action="store_true", help="Verilator cycles and Yosys LUTs, hls4ml C-sim of the QAT kernels (minutes)")
    ap.add_argument("--rounding", default="round", choices=("round", "floor"), help="Brevitas activation rounding")
    ap.add_argument("--rtl-variants", default=None,
                    help="variants built under Verilator and Yosys (default all; the others: da4ml's estimate)")
    a = ap.parse_args()
    res = run(bits=tuple(int(b) for b in a.bits.split(",")), qat_epochs=a.qat_epochs, rtl=a.rtl, rounding=a.rounding,
              rtl_variants=tuple(a.rtl_variants.split(",")) if a.rtl_variants else None)
    print(res.table())
    for b, ok in res.qat_bit_exact_vs_brevitas.items():
        print(f"QAT {b}-bit: simulate == Brevitas on all {res.n_test} test rows: {ok} (max |diff| {res.qat_max_deviation[b]:g})")
    for v in res.variants:
        if v.rtl_matches_simulate is not None:
            print(f"{v.name}: Verilator RTL == simulate on the checked rows: {v.rtl_matches_simulate}")
        if v.csim_matches_simulate is not None:
            print(f"{v.name}: hls4ml C-sim == simulate on the checked rows: {v.csim_matches_simulate}")


if __name__ == "__main__":  # pragma: no cover
    main()

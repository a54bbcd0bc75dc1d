"""The quantization report: per-layer ranges, chosen types, fidelity; the end-to-end metric.

Printed as a rich table (``print(report)`` or ``report.print()``), saved as JSON
(``report.save_json(path)``) and as a PNG chart (``report.save_png(path)``, matplotlib).

Example::

    mlp.report.save_json("quant.json"); mlp.report.save_png("quant.png")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rich.table import Table

from offload.render import RichReport
from offload.sim.fixed import FixedType

__all__ = ["LayerRow", "QuantReport"]


@dataclass
class LayerRow:
    """One layer: observed float range on the calibration set, types, cosine vs float, saturated share."""

    name: str
    op: str
    observed_min: float
    observed_max: float
    types: dict[str, str]
    cosine: float
    saturated: float


@dataclass
class QuantReport(RichReport):
    """Per-layer rows plus the end-to-end metric of the float model (before) and fixed-point (after)."""

    text_width: ClassVar[int] = 200
    layers: list[LayerRow]
    metric: str
    before: float
    after: float
    budget: float | None = None
    cos_threshold: float | None = None
    rows: int = 0
    search: dict[str, Any] = field(default_factory=dict)
    # RtlSummary of the last MLP.to_rtl() result (measured cycles, Yosys counts), once there is one.
    rtl: Any = None

    def set_rtl(self, summary: Any) -> None:
        self.rtl = summary

    def to_json(self) -> dict:
        d = asdict(self)
        d["rtl"] = None if self.rtl is None else self.rtl.to_json()
        return d

    def save_json(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_json(), indent=2))
        return p

    def table(self):
        t = Table(title=f"offload quantization report ({self.rows} calibration rows)")
        for col in ("layer", "op", "observed min", "observed max", "weight|scale|param|table", "bias", "accum", "result", "cosine", "saturated"):
            t.add_column(col, justify="right" if col in ("observed min", "observed max", "cosine", "saturated") else "left")
        for r in self.layers:
            ty = r.types
            extra = ty.get("weight") or ty.get("scale") or ty.get("param") or ty.get("table") or ""
            t.add_row(
                r.name, r.op, f"{r.observed_min:.4g}", f"{r.observed_max:.4g}", extra, ty.get("bias", ""),
                ty.get("accum", ""), ty.get("result", ""), f"{r.cosine:.6f}", f"{r.saturated:.2%}",
            )
        budget = "" if self.budget is None else f" (budget {self.budget:g})"
        t.caption = f"{self.metric}: float {self.before:.6g} -> fixed {self.after:.6g}{budget}"
        if self.rtl is not None:
            t.caption += "\n" + "\n".join(self.rtl.lines())
        return t

    def renderables(self) -> list:
        return [self.table()]

    def save_png(self, path: str | Path) -> Path:
        """Bar chart of every layer's cosine similarity and result width (needs matplotlib)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:  # pragma: no cover - matplotlib is in the dev extra
            raise ImportError("saving the report as PNG needs matplotlib (pip install 'offload[dev]')") from e

        names = [r.name for r in self.layers]
        widths = [FixedType.parse(r.types["result"]).width for r in self.layers]
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(max(6, 0.8 * len(names)), 6), sharex=True)
        a1.bar(names, [1.0 - r.cosine for r in self.layers], color="tab:blue")
        a1.set_yscale("symlog", linthresh=1e-6)
        a1.set_ylabel("1 - cosine vs float")
        if self.cos_threshold is not None:
            a1.axhline(1.0 - self.cos_threshold, color="tab:red", linestyle="--", label="threshold")
            a1.legend()
        a2.bar(names, widths, color="tab:green")
        a2.set_ylabel("result width (bits)")
        a1.set_title(f"{self.metric}: float {self.before:.4g} -> fixed {self.after:.4g}")
        fig.tight_layout()
        p = Path(path)
        fig.savefig(p, dpi=100)
        plt.close(fig)
        return p

"""Partition pass: record each MLP chain's input activations on the calibration batches.

Runs on the float graph, before any surgery, so the activations are the float model's own; the
replace pass quantizes each chain on them (``offload.nn.MLP.from_float(calib=...)``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from offload.partition.find import Candidate
from offload.partition.state import State

__all__ = ["apply", "record_mlp_inputs"]


class _Recorder(fx.Interpreter):
    """Runs the traced float graph and keeps the values of the watched nodes."""

    def __init__(self, gm: fx.GraphModule, watch: set[str]):
        super().__init__(gm)
        self.watch = watch
        self.seen: dict[str, list[Any]] = {n: [] for n in watch}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.watch:
            self.seen[n.name].append(out)
        return out


def record_mlp_inputs(gm: fx.GraphModule, cands: list[Candidate], batches: list[tuple]) -> dict[str, torch.Tensor]:
    """Input activations of each MLP chain on the calibration batches, concatenated along dim 0."""
    watch = {c.first.args[0].name: c for c in cands if c.kind == "mlp"}
    if not watch:
        return {}
    rec = _Recorder(gm, set(watch))
    with torch.no_grad():
        for b in batches:
            rec.run(*b)
    out = {}
    for src, c in watch.items():
        vals = [v for v in rec.seen[src] if isinstance(v, torch.Tensor)]
        if vals:
            out[c.name] = torch.cat([v.detach().reshape(-1, v.shape[-1]).float().cpu() for v in vals])
    return out


def apply(st: State) -> None:
    """Pass: ``st.recorded``, each MLP chain's inputs on ``st.calib``."""
    if not st.calib_given and any(c.kind == "mlp" for c in st.candidates):
        st.report.notes.append("no calib given: MLP activations were calibrated on example_inputs only")
    st.recorded = record_mlp_inputs(st.gm, st.candidates, st.calib)

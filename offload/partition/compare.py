"""``offload.compare``: where did quantization move the numbers?

Runs the float model and the offloaded one on the same inputs and reports, for every model output
and every offloaded node, the cosine similarity and the largest absolute error against float:

- *accumulated*: the offloaded graph's value at that node vs the float graph's value at the node it
  replaced (errors of everything upstream included: the end-to-end picture);
- *local*: the offload module's output vs its float module run on the very same inputs (only this
  node's quantization: the per-layer comparison that finds the layer that broke accuracy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from rich.table import Table

from offload.render import RichReport

__all__ = ["Diff", "Comparison", "compare"]


@dataclass(frozen=True)
class Diff:
    """One tensor against its float reference."""

    name: str
    shape: tuple[int, ...]
    cosine: float
    max_abs_err: float
    ref_max_abs: float

    @property
    def rel_err(self) -> float:
        """Largest error relative to the reference's largest magnitude."""
        return self.max_abs_err / self.ref_max_abs if self.ref_max_abs > 0 else float(self.max_abs_err > 0)


@dataclass
class Comparison(RichReport):
    """Per-output and per-offloaded-node errors; ``print(cmp)`` renders a table."""

    outputs: list[Diff] = field(default_factory=list)
    nodes: list[Diff] = field(default_factory=list)
    local: list[Diff] = field(default_factory=list)

    @property
    def min_cosine(self) -> float:
        return min((d.cosine for d in self.outputs), default=1.0)

    @property
    def max_abs_err(self) -> float:
        return max((d.max_abs_err for d in self.outputs), default=0.0)

    def worst_node(self) -> Diff | None:
        """The offloaded node with the lowest local cosine (where to look first)."""
        return min(self.local, key=lambda d: d.cosine, default=None)

    def table(self) -> Table:
        t = Table(title="offload.compare: offloaded vs float")
        for col in ("where", "tensor", "shape", "cosine", "max abs err", "rel err"):
            t.add_column(col, overflow="fold")
        for label, rows in (("output", self.outputs), ("node (accumulated)", self.nodes), ("node (local)", self.local)):
            for d in rows:
                t.add_row(label, d.name, "x".join(map(str, d.shape)), f"{d.cosine:.6f}", f"{d.max_abs_err:.3g}", f"{d.rel_err:.3g}")
        return t

    def renderables(self) -> list:
        return [self.table()]


def _flatten(x: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(x, torch.Tensor):
        return [(prefix, x)]
    if isinstance(x, dict):
        return [p for k in x for p in _flatten(x[k], f"{prefix}.{k}")]
    if isinstance(x, (list, tuple)):
        return [p for i, v in enumerate(x) for p in _flatten(v, f"{prefix}[{i}]")]
    return []


def _diff(name: str, ref: torch.Tensor, got: torch.Tensor) -> Diff:
    if tuple(ref.shape) != tuple(got.shape):
        raise ValueError(f"compare: {name} has shape {tuple(got.shape)} offloaded but {tuple(ref.shape)} in float")
    a = ref.detach().to("cpu", torch.float64).reshape(-1)
    b = got.detach().to("cpu", torch.float64).reshape(-1)
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 and nb == 0.0:
        cos = 1.0
    elif na == 0.0 or nb == 0.0:
        cos = 0.0
    else:
        cos = float(torch.dot(a, b)) / (na * nb)
    err = float((a - b).abs().max()) if a.numel() else 0.0
    ref_max = float(a.abs().max()) if a.numel() else 0.0
    return Diff(name, tuple(ref.shape), max(-1.0, min(1.0, cos)) if math.isfinite(cos) else float("nan"), err, ref_max)


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, watch: set[str], watch_args: set[str] = frozenset()):
        super().__init__(gm)
        self.watch, self.watch_args = watch, watch_args
        self.values: dict[str, Any] = {}
        self.args: dict[str, tuple] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.watch:
            self.values[n.name] = out
        if n.op == "call_module" and n.target in self.watch_args:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.args[n.target] = (args, kwargs, out)
        return out


def _args(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compare(model: nn.Module, gm: nn.Module, inputs: Any) -> Comparison:
    """Compare the offloaded ``gm`` (from ``offload.offload``) with the float ``model`` on ``inputs``.

    ``inputs`` are the forward's positional args (a tuple, or one tensor). Returns a
    :class:`Comparison` with per-output and per-offloaded-node cosine similarity and max error.

    Example::

        cmp = offload.compare(model, gm, (idx, off, dense))
        print(cmp)                     # table; cmp.min_cosine, cmp.worst_node()
    """
    args = _args(inputs)
    result = Comparison()
    node_map: dict[str, str] = getattr(gm, "offload_node_map", {}) or {}
    refs: dict[str, nn.Module] = getattr(gm, "offload_float_refs", {}) or {}
    with torch.no_grad():
        ref_out = model(*args)
        if isinstance(gm, fx.GraphModule) and (node_map or refs):
            rec = _Recorder(gm, set(node_map), set(refs))
            got_out = rec.run(*args)
            try:
                float_gm = fx.symbolic_trace(model)
            except Exception:  # noqa: BLE001 - the offloaded graph came from a trace, so this is rare
                float_gm = None
            if float_gm is not None:
                frec = _Recorder(float_gm, set(node_map.values()))
                frec.run(*args)
                for gname, fname in node_map.items():
                    if fname in frec.values:
                        for (tn, r), (_, g) in zip(_flatten(frec.values[fname], fname), _flatten(rec.values[gname], fname)):
                            result.nodes.append(_diff(tn, r, g))
            for target, (a, kw, out) in rec.args.items():
                ref = refs[target](*a, **kw)
                for (tn, r), (_, g) in zip(_flatten(ref, target), _flatten(out, target)):
                    result.local.append(_diff(tn, r, g))
        else:
            got_out = gm(*args)
    ref_flat, got_flat = _flatten(ref_out, "output"), _flatten(got_out, "output")
    if len(ref_flat) != len(got_flat):
        raise ValueError(f"compare: float model returned {len(ref_flat)} tensors, offloaded {len(got_flat)}")
    result.outputs = [_diff(n, r, g) for (n, r), (_, g) in zip(ref_flat, got_flat)]
    return result

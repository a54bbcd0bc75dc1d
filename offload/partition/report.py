"""What ``offload.offload`` decided: one :class:`Decision` a candidate, gathered in an :class:`OffloadReport`.

The passes fill the report as they go (find: one row a candidate, budget: tables that do not fit,
replace: what was offloaded and why); :func:`untraceable` is the whole report of a model torch.fx
cannot trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn
from rich.table import Table

from offload.hls.cards import Card
from offload.partition import recsys
from offload.render import RichReport

__all__ = ["Decision", "OffloadReport", "untraceable"]


@dataclass
class Decision:
    """What happened to one candidate node (or MLP chain)."""

    node: str
    kind: str
    target: str
    shape: str
    offloaded: bool
    reason: str
    replacement: str | None = None
    batched_with: tuple[str, ...] = ()
    launch: str = ""  # an offloaded unit's launch mode on its device: "per_call" or "persistent"


@dataclass
class OffloadReport(RichReport):
    """Every candidate, offloaded or kept, and why; printed as a table."""

    decisions: list[Decision] = field(default_factory=list)
    traced: bool = True
    device: str = "sim"
    card: str = "u55c"
    fmt: str = ""
    card_bytes_used: int = 0
    notes: list[str] = field(default_factory=list)
    # with a holdout (offload.offload(holdout=..., budget=...)): {"metric", "limit", "measured", "met"}
    # on the final model, and the precision search behind it (offload.partition.accuracy.PrecisionSearch)
    budget: dict[str, Any] | None = None
    search: Any = None

    @property
    def offloaded(self) -> list[Decision]:
        return [d for d in self.decisions if d.offloaded]

    @property
    def kept(self) -> list[Decision]:
        return [d for d in self.decisions if not d.offloaded]

    @property
    def batches(self) -> list[tuple[str, ...]]:
        """Groups of nodes that became one table-batched call."""
        seen: dict[str, tuple[str, ...]] = {}
        for d in self.decisions:
            if d.batched_with and d.replacement not in seen:
                seen[d.replacement or d.node] = d.batched_with
        return list(seen.values())

    def decision(self, node: str) -> Decision:
        for d in self.decisions:
            if d.node == node or node in d.node.split(".."):
                return d
        raise KeyError(f"no decision for node {node!r}; nodes: {[d.node for d in self.decisions]}")

    def table(self) -> Table:
        t = Table(title=f"offload report: device={self.device}, card={self.card}, traced={self.traced}")
        for col in ("node", "op", "module", "shape", "placement", "why"):
            t.add_column(col, overflow="fold")
        for d in self.decisions:
            where = f"offload ({d.replacement}{', ' + d.launch if d.launch else ''})" if d.offloaded else "host"
            why = d.reason + (f" [batched with {', '.join(x for x in d.batched_with if x != d.node)}]" if d.batched_with else "")
            t.add_row(d.node, d.kind, d.target, d.shape, where, why)
        return t

    def renderables(self) -> list:
        return [self.table(), *([self.search.table()] if self.search is not None else []), *(f"note: {n}" for n in self.notes)]


class _Kept(nn.Module):
    """The untouched model, returned when it cannot be traced (carries ``offload_report``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


def untraceable(model: nn.Module, err: Exception, device: Any, card: Card) -> nn.Module:
    """``model`` unchanged, with a report keeping every embedding and Linear on the host because of ``err``."""
    report = OffloadReport(traced=False, device=str(device), card=card.name)
    why = f"model not traceable by torch.fx: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    inside: list[str] = []  # TorchRec/FBGEMM modules get one row each, not one per table inside them
    for qual, m in model.named_modules():
        if any(qual.startswith(p + ".") for p in inside):
            continue
        rk, rwhy = recsys.module_kind(m)
        if rk or rwhy:
            inside.append(qual)
            report.decisions.append(Decision(qual, rk or type(m).__name__, qual, "", False, why + (f"; {rwhy}" if rwhy else "")))
            continue
        kind = "embedding_bag" if isinstance(m, nn.EmbeddingBag) else "embedding" if isinstance(m, nn.Embedding) else "mlp" if isinstance(m, nn.Linear) else None
        if kind:
            report.decisions.append(Decision(qual, kind, qual, "", False, why))
    report.notes.append("torch.fx could not trace the model; it runs unchanged on its own device. Make the forward "
                        "traceable (no data-dependent Python control flow) or offload submodules with offload.nn.*.from_float.")
    out = _Kept(model)
    out.offload_report = report
    return out

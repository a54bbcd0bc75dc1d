"""Partition pass: the model-level accuracy budget, one precision search over the whole offloaded model.

Runs after ``replace``. Every offloaded module (a table, a table-batched call, an EBC, an MLP
chain) is a *unit* with a ladder of precisions, cheapest first: tables ``ap_fixed<8,I>``,
``int8_rowwise``, ``ap_fixed<16,I>``, ``ap_fixed<24,I>`` (``I`` from the table's largest value,
so nothing saturates); ``precision="auto"`` chains the PTQ search at a per-layer cosine of 0.99,
0.999, 0.9999, 0.99999, the last two with 4096- and 16384-entry sigmoid/tanh tables (an explicit
precision is one rung). The budget is on the model's output,
scored on the holdout against the float model:

1. every unit at its widest rung; if that misses the budget, the units that cost the output most
   when offloaded alone go back to the host, one at a time, until it is met (each row says so);
2. sensitivity: each unit narrowed to its cheapest rung with the others at their widest: what
   it costs the output;
3. the least sensitive unit first, each is lowered to the cheapest rung at which the whole model
   still meets the budget (bisection on its ladder, the others as chosen so far): sensitive units
   stay wide.

Every step holds the metric's one-sided 95 % upper bound within the limit (an AUC drop's DeLong
standard error on the holdout; ``max_abs_err`` as measured), so the choice does not merely fit the
holdout's noise; ``met`` is the measured figure against the limit.

The report gets ``budget = {"metric", "limit", "measured", "met"}``, the figure of the final
model on the holdout, and a :class:`PrecisionSearch` with every unit's rung, sensitivity and
local cosine. The holdout also chose the rungs: confirm on a third set before signing off (the
examples do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
from rich.table import Table

from offload.host.bundle import KernelSource
from offload.nn import MLP
from offload.partition import recsys
from offload.partition.budget import table_bytes
from offload.partition.compare import compare
from offload.partition.holdout import Holdout, scores
from offload.partition.replace import BatchedBags, build_bag, build_embedding, build_multi
from offload.partition.state import State
from offload.render import RichReport
from offload.sim.errors import InputError, OffloadError

__all__ = ["apply", "PrecisionSearch", "UnitRow", "TABLE_WIDTHS", "CHAIN_RUNGS"]

TABLE_WIDTHS = (8, 16, 24)  # 24 bits sit in a 32-bit word: float32's significand, the widest worth storing
# (per-layer cosine of the PTQ search, sigmoid/tanh table entries): the wide rungs also refine the
# tables, whose step, not the types, bounds a confident model's scores (a 1024-entry sigmoid ties
# every score past |x| ~ 6 to a handful of values, and ties cost AUC that no cosine sees)
CHAIN_RUNGS = ((0.99, 1024), (0.999, 1024), (0.9999, 4096), (0.99999, 16384))
HOST = -1


@dataclass
class UnitRow:
    """One offloaded unit: its ladder, the rung chosen (or host), and what narrowing it costs."""

    unit: str
    kind: str
    nodes: tuple[str, ...]
    rungs: tuple[str, ...]
    chosen: str
    # the metric's one-sided 95 % upper bound (what the search compares with the limit) with this unit at its
    # cheapest rung and the others at their widest; and with only this unit offloaded, at its widest (when the widest missed)
    sensitivity: float | None = None
    alone_widest: float | None = None
    local_cosine: float | None = None  # its output vs its float module on the same inputs (first holdout batch)
    reason: str = ""


@dataclass
class PrecisionSearch(RichReport):
    """The precision search under a model-level budget: the end-to-end figure and every unit's row."""

    metric: str
    limit: float | None
    measured: float
    upper: float | None = None  # its one-sided 95 % upper bound (what the search holds within the limit)
    widest: float | None = None
    evaluations: int = 0
    holdout_rows: int = 0
    units: list[UnitRow] = field(default_factory=list)

    @property
    def met(self) -> bool | None:
        return None if self.limit is None else bool(self.measured <= self.limit)

    def table(self) -> Table:
        lim = "no limit" if self.limit is None else f"limit {self.limit:g}"
        t = Table(title=f"model-level budget: {self.metric} on {self.holdout_rows} held-out rows ({lim})")
        for col in ("unit", "kind", "rungs (cheapest first)", "chosen", f"{self.metric} narrowed (95 % upper)", "local cosine", "why"):
            t.add_column(col, overflow="fold")
        for u in self.units:
            t.add_row(u.unit, u.kind, " | ".join(u.rungs), u.chosen, "" if u.sensitivity is None else f"{u.sensitivity:.3g}",
                      "" if u.local_cosine is None else f"{u.local_cosine:.6f}", u.reason)
        verdict = "" if self.met is None else (" - met" if self.met else " - NOT met")
        bound = "" if self.upper is None or self.upper == self.measured else f", 95 % upper bound {self.upper:.4g}"
        t.caption = (f"end to end: {self.metric} = {self.measured:.4g}{bound}{verdict}"
                     + ("" if self.widest is None else f" (every unit at its widest, upper bound: {self.widest:.4g})")
                     + f"; {self.evaluations} holdout evaluations")
        return t

    def renderables(self) -> list:
        return [self.table()]


@dataclass
class _Unit:
    name: str  # the offload submodule in st.gm
    kind: str
    nodes: tuple[str, ...]
    float_ref: nn.Module
    labels: list[str]
    builders: list[Callable[[], nn.Module]]
    built: dict[int, nn.Module] = field(default_factory=dict)
    level: int = 0
    row: UnitRow | None = None

    @property
    def top(self) -> int:
        return len(self.builders) - 1

    def module(self, level: int) -> nn.Module:
        if level == HOST:
            return self.float_ref
        if level not in self.built:
            self.built[level] = self.builders[level]()
        return self.built[level]


def _int_bits(m: float) -> int:
    """Signed integer bits holding magnitude ``m``."""
    return 1 if m <= 0 or not math.isfinite(m) else math.floor(math.log2(m)) + 2


def _float_tensors(m: nn.Module) -> list[torch.Tensor]:
    return [t for t in list(m.parameters()) + list(m.buffers()) if t.is_floating_point() and t.numel()]


def _fit_int_bits(m: float, width: int) -> int:
    """Signed integer bits whose ``width``-bit range holds ``m`` after rounding to its step."""
    i = _int_bits(m)
    while m > 0 and math.isfinite(m) and round(m * 2.0 ** (width - i)) > 2 ** (width - 1) - 1:
        i += 1
    return i


def _table_formats(weights: list[torch.Tensor]) -> list[tuple[str, list[str]]]:
    """The ladder of one table-holding unit: (label, one format a table), cheapest first."""
    peaks = [float(w.detach().abs().max()) for w in weights]
    out = []
    for w in TABLE_WIDTHS:
        ints = [_fit_int_bits(m, w) for m in peaks]
        fmts = [f"ap_fixed<{w},{i},AP_RND_CONV,AP_SAT>" for i in ints]
        same = len(set(ints)) == 1
        out.append((f"ap_fixed<{w},{ints[0]}>" if same else f"ap_fixed<{w},I> (I {min(ints)}..{max(ints)} by table)", fmts))
        if w == 8:
            out.append(("int8_rowwise", ["int8_rowwise"] * len(weights)))
    return out


def _mlp_builder(st: State, ref: nn.Module, calib: torch.Tensor, name: str, precision, rung: tuple[float, int] | None
                 ) -> Callable[[], nn.Module]:
    # The chain's own default budget stays: a sigmoid output's cosine barely moves when its scores
    # collapse onto a few values, its max |error| does.
    kw = {} if rung is None else {"cos_threshold": rung[0], "table_size": rung[1]}
    return lambda: MLP.from_float(ref, calib=calib, precision=precision, reuse_factor=st.reuse_factor, device=st.device, name=name, **kw)


def _table_builder(st: State, c, ref: nn.Module, name: str, fmts: list[str]) -> Callable[[], nn.Module]:
    dev, mb = st.device, st.max_bag_size
    if hasattr(ref, "bags"):  # FloatBags: a table-batched call, one format a table
        bags = list(ref.bags)
        return lambda: BatchedBags(build_multi(bags, fmts, dev, name, mb), [b.embedding_dim for b in bags])
    if isinstance(ref, nn.EmbeddingBag):
        return lambda: build_bag(ref, fmts[0], dev, name, mb)
    if isinstance(ref, nn.Embedding):
        return lambda: build_embedding(ref, fmts[0], dev, name)
    return lambda: recsys.build(c.kind, ref, fmts[0], dev, name)  # TorchRec EBC / FBGEMM TBE: one format


def _units(st: State) -> list[_Unit]:
    """One unit per offload submodule, with its ladder of builders."""
    by_name: dict[str, list] = {}
    for c in st.candidates:
        d = st.decisions[c.name]
        if d.offloaded and d.replacement:
            by_name.setdefault(d.replacement, []).append(c)
    out = []
    for name, cands in by_name.items():
        ref = st.float_refs.get(name)
        if ref is None:
            continue
        c = cands[0]
        nodes = tuple(x.name for x in cands)
        if c.kind == "mlp":
            calib = st.recorded[c.name]
            if isinstance(st.precision, str) and st.precision == "auto":
                tables = any(isinstance(m, (nn.Sigmoid, nn.Tanh)) for m in ref)
                labels = [f"auto, cos>={cs:g}" + (f", tables {n}" if tables and n != 1024 else "") for cs, n in CHAIN_RUNGS]
                builders = [_mlp_builder(st, ref, calib, name, "auto", r) for r in CHAIN_RUNGS]
            else:
                labels, builders = [str(st.precision)], [_mlp_builder(st, ref, calib, name, st.precision, None)]
            out.append(_Unit(name, "mlp", nodes, ref, labels, builders))
            continue
        weights = _float_tensors(ref)
        if not weights:  # e.g. FBGEMM's INT8 inference TBE: loaded exactly, nothing to choose
            built = getattr(st.gm, name)
            out.append(_Unit(name, c.kind, nodes, ref, ["as loaded"], [lambda m=built: m]))
            continue
        if hasattr(ref, "bags") or isinstance(ref, (nn.EmbeddingBag, nn.Embedding)):
            ladder = _table_formats([b.weight for b in ref.bags] if hasattr(ref, "bags") else [ref.weight])
        else:
            ladder = _table_formats([torch.stack([w.detach().abs().max() for w in weights])])
        builders = [_table_builder(st, c, ref, name, fmts) for _, fmts in ladder]
        out.append(_Unit(name, c.kind, nodes, ref, [lab for lab, _ in ladder], builders))
    return out


class _Evaluator:
    """Scores a configuration of rungs on the holdout against the float model's outputs."""

    def __init__(self, st: State, ho: Holdout, units: list[_Unit]):
        self.st, self.ho, self.units = st, ho, units
        self.y_float = scores(st.model, ho.batches)
        if ho.labels is not None and ho.labels.size != self.y_float.size:
            raise InputError(f"holdout: {ho.labels.size} labels for {self.y_float.size} scored rows")
        self.count = 0

    def set(self, levels: dict[str, int]) -> None:
        for u in self.units:
            setattr(self.st.gm, u.name, u.module(levels[u.name]))

    def __call__(self, levels: dict[str, int]) -> float:
        """The search's figure of a configuration: the metric's one-sided 95 % upper bound."""
        return self.measure(levels)[1]

    def measure(self, levels: dict[str, int]) -> tuple[float, float]:
        """(the metric, its one-sided 95 % upper bound) of a configuration on the holdout."""
        self.set(levels)
        self.count += 1
        y = scores(self.st.gm, self.ho.batches)
        return self.ho.error(self.y_float, y), self.ho.upper(self.y_float, y)


def _build_ok(u: _Unit, level: int) -> bool:
    """Whether rung ``level`` builds (a factory may refuse a format: that rung is skipped)."""
    try:
        u.module(level)
        return True
    except OffloadError as e:
        u.labels[level] += f" (refused: {type(e).__name__})"
        return False


def _search(ev: _Evaluator, units: list[_Unit], limit: float, search: PrecisionSearch) -> dict[str, int]:
    levels = {u.name: u.top for u in units}
    m = ev(levels)
    search.widest = m
    if m > limit:  # even the widest rungs miss: units back to the host, the costliest alone first
        for u in units:
            u.row.alone_widest = ev({v.name: (v.top if v is u else HOST) for v in units})
        for u in sorted(units, key=lambda u: -u.row.alone_widest):
            levels[u.name] = HOST
            u.row.reason = (f"kept on the host: offloaded alone at its widest rung it costs {search.metric} up to {u.row.alone_widest:.4g}; "
                            f"with it on the card no precision meets the budget {limit:g}")
            if ev(levels) <= limit:
                break
    live = [u for u in units if levels[u.name] != HOST]
    for u in live:
        if u.top == 0:
            continue
        lowest = next((k for k in range(u.top) if _build_ok(u, k)), u.top)
        u.row.sensitivity = ev({**levels, u.name: lowest})
    for u in sorted(live, key=lambda u: (u.row.sensitivity if u.row.sensitivity is not None else math.inf)):
        lo, hi = 0, levels[u.name]
        while lo < hi:  # the cheapest rung at which the whole model meets the budget (assumed monotone)
            mid = (lo + hi) // 2
            if _build_ok(u, mid) and ev({**levels, u.name: mid}) <= limit:
                hi = mid
            else:
                lo = mid + 1
        levels[u.name] = hi
    return levels


def _local_cosines(st: State, batch: tuple) -> dict[str, float]:
    """Each offload submodule's lowest local cosine (its output vs its float module) on ``batch``."""
    out: dict[str, float] = {}
    st.gm.offload_node_map, st.gm.offload_float_refs = st.node_map, st.float_refs  # what compare reads (replace.finish sets them too)
    for d in compare(st.model, st.gm, batch).local:
        unit = d.name.split("[")[0].split(".")[0]
        out[unit] = min(out.get(unit, 1.0), d.cosine)
    return out


def _record(st: State, units: list[_Unit], levels: dict[str, int]) -> None:
    """Decisions, card bytes and graph maps after the search."""
    if st.holdout.limit is None:  # measured only: nothing was chosen
        return
    for u in units:
        lvl = levels[u.name]
        for d in st.report.decisions:
            if d.replacement != u.name:
                continue
            if lvl == HOST:
                d.offloaded, d.replacement, d.batched_with, d.reason = False, None, (), u.row.reason
            else:  # the format the budget chose replaces the starting one in the row
                d.reason = d.reason.replace(st.fmt, u.labels[lvl]) if u.kind != "mlp" else d.reason.replace(
                    f"precision={st.precision}", f"precision={u.labels[lvl]}")
                d.reason += " (chosen by the budget search)"
        if lvl == HOST:
            st.float_refs.pop(u.name, None)
            for g in [k for k, n in st.node_map.items() if any(x.op == "call_module" and x.target == u.name and x.name == k
                                                              for x in st.gm.graph.nodes)]:
                st.node_map.pop(g)
    used = 0
    for u in units:
        if levels[u.name] == HOST or u.kind == "mlp":
            continue
        for m in u.module(levels[u.name]).modules():
            for k in (m.offload_kernels() if isinstance(m, KernelSource) else ()):
                used += sum(table_bytes(t.num_rows, t.dim, str(t.fmt)) for t in getattr(k.spec, "tables", ()))
    if used:
        st.report.card_bytes_used = used
        if used > st.card.memory_bytes:
            st.report.notes.append(f"the chosen table formats need {used / 2**30:.2f} GiB, more than {st.card.name}'s "
                                   f"{st.card.memory_bytes / 2**30:.0f} GiB: pass a narrower budget or fewer tables")


def apply(st: State) -> None:
    """Pass: with a holdout, measure (and with a budget, search) the offloaded model's output error."""
    ho: Holdout | None = st.holdout
    if ho is None:
        return
    units = _units(st)
    ev = _Evaluator(st, ho, units)
    search = PrecisionSearch(ho.metric, ho.limit, 0.0, holdout_rows=int(ev.y_float.size))
    for u in units:
        u.row = UnitRow(u.name, u.kind, u.nodes, tuple(u.labels), "")
    if ho.limit is None:  # measure what replace built, choose nothing
        levels = {u.name: 0 for u in units}
        for u in units:
            u.built[0] = getattr(st.gm, u.name)
            u.labels, u.row.rungs = ["as built"], ("as built",)
    else:
        levels = _search(ev, units, ho.limit, search)
    search.measured, search.upper = ev.measure(levels) if units else (0.0, 0.0)
    search.evaluations = ev.count
    local = _local_cosines(st, ho.batches[0]) if any(v != HOST for v in levels.values()) else {}
    for u in units:
        u.row.rungs = tuple(u.labels)
        u.row.chosen = "host" if levels[u.name] == HOST else u.labels[levels[u.name]]
        u.row.local_cosine = local.get(u.name)
    _record(st, units, levels)
    search.units = [u.row for u in units]
    st.report.search = search
    st.report.budget = {"metric": ho.metric, "limit": ho.limit, "measured": float(search.measured), "met": search.met}
    if search.met is False:
        st.report.notes.append(f"budget {ho.metric} <= {ho.limit:g} NOT met on the holdout: {search.measured:.4g}")
    st.report.notes.append(f"{ho.metric} measured on the {search.holdout_rows}-row holdout, which also chose the precisions; "
                           "confirm on data neither saw before signing off")

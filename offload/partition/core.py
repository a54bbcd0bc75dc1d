"""Partition a PyTorch model: offload embedding lookups and scoring MLPs, keep everything else.

``offload.offload`` traces the model with torch.fx, replaces ``nn.EmbeddingBag`` / ``nn.Embedding``
modules, ``F.embedding_bag`` calls and maximal MLP chains with ``offload.nn`` modules running on
an offload device, and leaves every other node untouched on its original device. Several tables
with the same dim, mode and format whose inputs are ready at the same point become one
table-batched call. Whatever cannot be offloaded (untraceable model, unsupported layer, a table too
large for the card, a factory error) stays on the host and the report says why.

Example::

    gm = offload.offload(model, (indices, offsets, dense), ops=("embedding_bag",), device="sim")
    print(gm.offload_report)                      # every candidate: offloaded or kept, and why
    print(offload.compare(model, gm, (indices, offsets, dense)))
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from offload.hls.cards import Card, get_card
from offload.partition.build import (
    BUILD_ERRORS,
    BatchedBags,
    FloatBags,
    build_bag,
    build_embedding,
    build_mlp,
    build_multi,
    multi_class,
    table_bytes,
)
from offload.partition.compare import Comparison, compare
from offload.partition.find import OPS, Candidate, find_candidates, functional_args, trace
from offload.render import RichReport

__all__ = ["offload", "compare", "OffloadReport", "Decision", "Comparison"]


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

    def table(self):  # rich.table.Table
        from rich.table import Table

        t = Table(title=f"offload report: device={self.device}, card={self.card}, traced={self.traced}")
        for col in ("node", "op", "module", "shape", "placement", "why"):
            t.add_column(col, overflow="fold")
        for d in self.decisions:
            where = f"offload ({d.replacement})" if d.offloaded else "host"
            why = d.reason + (f" [batched with {', '.join(x for x in d.batched_with if x != d.node)}]" if d.batched_with else "")
            t.add_row(d.node, d.kind, d.target, d.shape, where, why)
        return t

    def renderables(self) -> list:
        return [self.table(), *(f"note: {n}" for n in self.notes)]


class _Kept(nn.Module):
    """The untouched model, returned when it cannot be traced (carries ``offload_report``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


def _as_args(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _calib_batches(calib: Any, example: tuple) -> list[tuple]:
    if calib is None:
        return [example]
    if isinstance(calib, torch.Tensor):
        return [(calib,)]
    if hasattr(calib, "__array__") and not isinstance(calib, (list, tuple)):  # one NumPy batch of features
        return [(torch.as_tensor(calib),)]
    if not isinstance(calib, (list, tuple)) or not calib:
        raise TypeError("calib: expected a non-empty list of example input batches (each a tuple of args or a tensor)")
    return [_as_args(b) for b in calib]


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


def _record_mlp_inputs(gm: fx.GraphModule, cands: list[Candidate], batches: list[tuple]) -> dict[str, torch.Tensor]:
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


def _table_key(c: Candidate) -> tuple:
    """Identity of the table a candidate reads (MLP chains are never shared)."""
    if c.kind == "mlp":
        return ("mlp", c.name)
    return (c.kind, c.targets[0], c.bag_mode)


def _pos(gm: fx.GraphModule) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(gm.graph.nodes)}


def _bag_args(c: Candidate) -> tuple[Any, Any]:
    n = c.first
    if c.functional:
        a = functional_args(n)
        return a["input"], a.get("offsets")
    inp = n.args[0] if n.args else n.kwargs["input"]
    off = n.args[1] if len(n.args) > 1 else n.kwargs.get("offsets")
    return inp, off


def _group_tables(gm: fx.GraphModule, bags: list[Candidate], fmt: str) -> list[list[Candidate]]:
    """Greedy table batching: same (dim, mode, fmt), no per-sample weights, and every member's inputs
    defined before any member's output is used (so one call can sit between them)."""
    pos = _pos(gm)
    groups: dict[tuple, list[list[Candidate]]] = {}
    for c in sorted(bags, key=lambda c: pos[c.first]):
        # Only plain bags batch: BatchedBags converts (input, offsets) without a last offset, and
        # renormalising (max_norm) lookups must reach EmbeddingBag.from_float, which refuses them.
        if c.per_sample_weights or c.module.max_norm is not None or c.module.include_last_offset:
            continue
        key = (c.module.embedding_dim, c.bag_mode, fmt)
        placed = False
        for g in groups.setdefault(key, []):
            members = g + [c]
            last_in = max((pos[a] for m in members for a in _bag_args(m) if isinstance(a, fx.Node)), default=-1)
            first_use = min((pos[u] for m in members for u in m.last.users), default=len(pos))
            if last_in < first_use:
                g.append(c)
                placed = True
                break
        if not placed:
            groups[key].append([c])
    return [g for gs in groups.values() for g in gs if len(g) > 1]


def _replace_single(gm: fx.GraphModule, c: Candidate, name: str) -> fx.Node:
    g = gm.graph
    with g.inserting_after(c.last):
        if c.kind == "mlp":
            new = g.call_module(name, (c.first.args[0],))
        elif c.functional:
            inp, off = _bag_args(c)
            psw = functional_args(c.first).get("per_sample_weights")
            new = g.call_module(name, (inp, off), {"per_sample_weights": psw} if psw is not None else {})
        else:
            new = g.call_module(name, c.first.args, dict(c.first.kwargs))
    c.last.replace_all_uses_with(new)
    for n in reversed(c.nodes):
        g.erase_node(n)
    return new


def _replace_batched(gm: fx.GraphModule, group: list[Candidate], name: str) -> list[fx.Node]:
    g = gm.graph
    pos = _pos(gm)
    flat: list[Any] = []
    for c in group:
        flat.extend(_bag_args(c))
    anchors = [a for a in flat if isinstance(a, fx.Node)]
    anchor = max(anchors, key=lambda a: pos[a])
    with g.inserting_after(anchor):
        call = g.call_module(name, tuple(flat))
    outs = []
    prev = call
    for i, c in enumerate(group):
        with g.inserting_after(prev):
            item = g.call_function(operator.getitem, (call, i))
        c.last.replace_all_uses_with(item)
        g.erase_node(c.last)
        outs.append(item)
        prev = item
    return outs


def _kept_model(model: nn.Module, err: Exception, device: str, card: Card) -> nn.Module:
    report = OffloadReport(traced=False, device=str(device), card=card.name)
    for qual, m in model.named_modules():
        kind = "embedding_bag" if isinstance(m, nn.EmbeddingBag) else "embedding" if isinstance(m, nn.Embedding) else "mlp" if isinstance(m, nn.Linear) else None
        if kind:
            report.decisions.append(Decision(qual, kind, qual, "", False, f"model not traceable by torch.fx: {type(err).__name__}: {str(err).splitlines()[0][:160]}"))
    report.notes.append("torch.fx could not trace the model; it runs unchanged on its own device. Make the forward "
                        "traceable (no data-dependent Python control flow) or offload submodules with offload.nn.*.from_float.")
    out = _Kept(model)
    out.offload_report = report
    return out


def _mlp_params() -> set[str]:
    import inspect

    import offload.nn as onn

    return set(inspect.signature(onn.MLP.from_float).parameters)


def offload(
    model: nn.Module,
    example_inputs: Any,
    ops: Sequence[str] = OPS,
    calib: Any = None,
    device: Any = "sim",
    card: str | Card = "u55c",
    fmt: str = "ap_fixed<16,6>",
    precision: Any = "auto",
    reuse_factor: int = 1,
    batch_tables: bool = True,
) -> nn.Module:
    """Return ``model`` with embedding lookups and MLP chains moved to an offload device.

    ``example_inputs``: the forward's positional args (a tuple, or one tensor). ``calib``: a list of
    input batches on which MLP chains record their input activations for quantization (default:
    ``[example_inputs]``). ``fmt``: table storage format. ``card``: whose memory bounds the tables.
    The result is a ``torch.fx.GraphModule`` (the unchanged model wrapped, when it cannot be traced)
    with ``offload_report``.

    Example::

        gm = offload.offload(dlrm, (idx, off, dense), ops=("embedding_bag",))
        print(gm.offload_report)
    """
    ops = tuple(ops)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(reuse_factor, int) or reuse_factor < 1:
        raise ValueError(f"reuse_factor: expected an integer >= 1, got {reuse_factor!r}")
    card_ = get_card(card)
    args = _as_args(example_inputs)
    batches = _calib_batches(calib, args)
    try:
        gm = trace(model)
    except Exception as e:  # noqa: BLE001 - FX raises many types (TraceError, TypeError, RuntimeError...)
        return _kept_model(model, e, device, card_)
    cands, skipped = find_candidates(gm, ops)
    report = OffloadReport(device=str(device if isinstance(device, str) else getattr(device, "name", device)), card=card_.name, fmt=fmt)
    if calib is None and any(c.kind == "mlp" for c in cands):
        report.notes.append("no calib given: MLP activations were calibrated on example_inputs only")
    recorded = _record_mlp_inputs(gm, cands, batches)

    free = card_.memory_bytes
    decided: dict[str, Decision] = {}
    tables_ok: list[Candidate] = []
    # A table called from several places is uploaded once and its offload module shared.
    calls: dict[tuple, int] = {}
    for c in cands:
        calls[_table_key(c)] = calls.get(_table_key(c), 0) + 1
    counted: set[tuple] = set()
    for c in cands:
        d = Decision(c.name, c.kind, ",".join(c.targets), c.describe(), False, "")
        decided[c.name] = d
        report.decisions.append(d)
        if c.kind in ("embedding_bag", "embedding"):
            if _table_key(c) in counted:
                continue
            need = table_bytes(c.module.num_embeddings, c.module.embedding_dim, fmt)
            if need > free:
                d.reason = (f"table needs {need / 2**20:.1f} MiB in {fmt}; {card_.name} has {free / 2**20:.1f} MiB of card "
                            f"memory left ({card_.memory_bytes / 2**30:.0f} GiB total, {card_.datasheet})")
                continue
            free -= need
            counted.add(_table_key(c))
            report.card_bytes_used += need
            if c.kind == "embedding_bag" and calls[_table_key(c)] == 1:
                tables_ok.append(c)
    for s in skipped:
        report.decisions.append(Decision(s.node.name, s.kind, str(s.node.target) if s.node.op == "call_module" else "F." + getattr(s.node.target, "__name__", "?"),
                                         "", False, s.reason))

    # Table batching first: a group that builds replaces its members; else they go one by one.
    done: set[str] = set()
    node_map: dict[str, str] = {}
    float_refs: dict[str, nn.Module] = {}
    if batch_tables and len(tables_ok) > 1:
        groups = _group_tables(gm, tables_ok, fmt)
        if groups and multi_class() is None:
            report.notes.append("tables could be batched but offload.nn has no multi-table module; each table is its own call")
            groups = []
        for gi, group in enumerate(groups):
            name = f"offload_tables_{gi}"
            try:
                impl = build_multi([c.module for c in group], fmt, device, name)
            except BUILD_ERRORS as e:
                report.notes.append(f"batching {[c.name for c in group]} failed ({type(e).__name__}: {e}); offloaded one by one")
                continue
            gm.add_submodule(name, BatchedBags(impl, [c.module.embedding_dim for c in group]))
            items = _replace_batched(gm, group, name)
            node_map.update({it.name: c.last.name for it, c in zip(items, group)})
            float_refs[name] = FloatBags([c.module for c in group])
            members = tuple(c.name for c in group)
            for c in group:
                d = decided[c.name]
                d.offloaded, d.replacement, d.batched_with = True, name, members
                d.reason = f"{len(group)} tables (dim {c.module.embedding_dim}, {c.bag_mode}, {fmt}) in one table-batched call"
                done.add(c.name)

    built: dict[tuple, tuple[str, str]] = {}
    for c in cands:
        d = decided[c.name]
        if c.name in done or d.reason:
            continue
        key = _table_key(c)
        if key in built:  # the same table, already offloaded for another call site
            name, first = built[key]
            last = c.last.name
            node_map[_replace_single(gm, c, name).name] = last
            d.offloaded, d.replacement, d.reason = True, name, f"shares the offloaded table of {first}"
            continue
        name = "offload_" + c.name.replace("..", "_to_")
        try:
            if c.kind == "embedding_bag":
                new = build_bag(c.module, fmt, device, name)
                why = f"{fmt} table on {report.device}"
            elif c.kind == "embedding":
                new = build_embedding(c.module, fmt, device, name)
                why = f"{fmt} table on {report.device}"
            else:
                if c.name not in recorded:
                    d.reason = "MLP input was not a tensor on the calibration batches"
                    continue
                new = build_mlp(c.module, recorded[c.name], precision, reuse_factor, device, name)
                why = f"MLP chain of {len(c.nodes)} layers, precision={precision}, reuse_factor={reuse_factor}"
        except BUILD_ERRORS as e:
            d.reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'factory failed'}"
            if c.kind in ("embedding_bag", "embedding"):
                report.card_bytes_used -= table_bytes(c.module.num_embeddings, c.module.embedding_dim, fmt)
            continue
        gm.add_submodule(name, new)
        last = c.last.name
        node_map[_replace_single(gm, c, name).name] = last
        float_refs[name] = c.module
        d.offloaded, d.replacement, d.reason = True, name, why
        if c.kind != "mlp":
            built[key] = (name, c.name)

    if any(d.offloaded and d.kind == "mlp" for d in report.decisions) and "device" not in _mlp_params():
        report.notes.append("offload.nn.MLP takes no device argument: MLP chains run on the process's default device "
                            "($OFFLOAD_DEVICE, else sim), whatever `device` says")
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    gm.offload_report = report
    # For offload.compare: offloaded graph node -> the float graph node it replaces, and the float
    # module each offload module stands for (plain attributes: not parameters, not in state_dict).
    gm.offload_node_map = node_map
    gm.offload_float_refs = float_refs
    # offload.save(gm, dir) writes every offloaded kernel into one bundle (for `offload build`).
    gm.offload_kernels = functools.partial(_collect_kernels, gm)
    return gm


def _collect_kernels(gm: nn.Module) -> list:
    """The kernels of every offload module in ``gm`` (shared modules once), in graph order."""
    out = []
    for _, m in gm.named_modules():
        f = getattr(m, "offload_kernels", None)
        if m is not gm and callable(f):
            out.extend(f())
    return out

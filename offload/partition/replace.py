"""Partition pass: build the offload modules and splice them into the graph.

Table-batched groups first (a group that fails to build goes table by table), then every other
candidate the budget left on the card. A factory of ``offload.nn`` refuses what its kernel cannot
do with an :class:`~offload.sim.errors.OffloadError`; that candidate stays on the host and its
report row gives the refusal. Any other exception is a bug and propagates.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from offload.host import Device
from offload.host.bundle import KernelSource
from offload.nn import MLP, Embedding, EmbeddingBag, TableBatchedEmbeddingBags
from offload.partition import recsys
from offload.partition.budget import table_bytes
from offload.partition.find import Candidate, bag_inputs, functional_args
from offload.partition.group import graph_positions, hoistable
from offload.partition.state import TABLE_KINDS, State, table_key
from offload.sim.errors import OffloadError

__all__ = ["apply", "finish", "build_bag", "build_embedding", "build_mlp", "build_multi", "BatchedBags", "FloatBags"]


# -- the offload modules ----------------------------------------------------------------------------
def build_bag(bag: nn.EmbeddingBag, fmt: str, device: str | Device | None, name: str, max_bag_size: int | None = None) -> nn.Module:
    return EmbeddingBag.from_float(bag, fmt=fmt, device=device, name=name, max_bag_size=max_bag_size)


def build_embedding(emb: nn.Embedding, fmt: str, device: str | Device | None, name: str) -> nn.Module:
    return Embedding.from_float(emb, fmt=fmt, device=device, name=name)


def build_mlp(seq: nn.Sequential, calib: torch.Tensor, precision: Any, reuse_factor: int, device: str | Device | None, name: str) -> nn.Module:
    return MLP.from_float(seq, calib=calib, precision=precision, reuse_factor=reuse_factor, device=device, name=name)


def build_multi(bags: Sequence[nn.EmbeddingBag], fmt: str, device: str | Device | None, name: str,
                max_bag_size: int | None = None) -> nn.Module:
    return TableBatchedEmbeddingBags.from_float(list(bags), fmt=fmt, device=device, name=name, max_bag_size=max_bag_size)


def _as_bags(indices: torch.Tensor, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``nn.EmbeddingBag`` inputs (2-D fixed bags, or 1-D + offsets) as 1-D indices, B+1 offsets, B."""
    if indices.dim() == 2:
        b, n = indices.shape
        return indices.reshape(-1), torch.arange(0, b * n + 1, n, device=indices.device, dtype=indices.dtype), b
    if offsets is None:
        raise ValueError("embedding_bag: 1-D input needs offsets")
    b = offsets.numel()
    end = torch.tensor([indices.numel()], device=offsets.device, dtype=offsets.dtype)
    return indices, torch.cat([offsets, end]), b


class BatchedBags(nn.Module):
    """Several tables' bag lookups as one table-batched call (FBGEMM TBE layout).

    ``forward(idx0, off0, idx1, off1, ...)`` with each pair as ``nn.EmbeddingBag`` takes them
    returns one pooled tensor per table. ``impl`` is the multi-table module
    (``forward(indices, offsets) -> B x sum(dims)`` with offsets of length ``T*B + 1``).
    """

    def __init__(self, impl: nn.Module, dims: Sequence[int]):
        super().__init__()
        self.impl = impl
        self.dims = [int(d) for d in dims]

    def forward(self, *pairs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        if len(pairs) != 2 * len(self.dims):
            raise ValueError(f"BatchedBags: expected {2 * len(self.dims)} arguments (indices, offsets per table), got {len(pairs)}")
        idx, offs, batch = [], [], None
        base = 0
        for t in range(len(self.dims)):
            i, o, b = _as_bags(pairs[2 * t], pairs[2 * t + 1])
            if batch is None:
                batch = b
            elif b != batch:
                raise ValueError(f"BatchedBags: table {t} has {b} bags, table 0 has {batch}; a table-batched call needs one batch size")
            idx.append(i.to(torch.int64))
            o = o.to(torch.int64) + base
            offs.append(o if t == len(self.dims) - 1 else o[:-1])
            base += i.numel()
        out = self.impl(torch.cat(idx), torch.cat(offs))
        return tuple(torch.split(out, self.dims, dim=1))


class FloatBags(nn.Module):
    """The float counterpart of :class:`BatchedBags`: each table's own ``nn.EmbeddingBag``."""

    def __init__(self, bags: Sequence[nn.EmbeddingBag]):
        super().__init__()
        self.bags = nn.ModuleList(bags)

    def forward(self, *pairs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        return tuple(bag(pairs[2 * t], pairs[2 * t + 1]) for t, bag in enumerate(self.bags))


# -- graph surgery ----------------------------------------------------------------------------------
def _replace_single(gm: fx.GraphModule, c: Candidate, name: str) -> fx.Node:
    g = gm.graph
    with g.inserting_after(c.last):
        if c.kind == "mlp":
            new = g.call_module(name, (c.first.args[0],))
        elif c.functional:
            inp, off = bag_inputs(c)
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
    pos = graph_positions(gm)
    flat: list[Any] = []
    for c in group:
        flat.extend(bag_inputs(c))
    # Items of forward arguments move up to just after the arguments (see group.hoistable).
    last_arg = [n for n in g.nodes if n.op == "placeholder"][-1]
    for a in flat:
        if hoistable(a) and pos[a] > pos[last_arg]:
            last_arg.append(a)
            last_arg = a
    pos = graph_positions(gm)
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


def _refusal(e: OffloadError) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'factory failed'}"


# -- the pass ---------------------------------------------------------------------------------------
def _replace_groups(st: State) -> set[str]:
    """Build and splice every table-batched group; the names of the candidates they replaced."""
    done: set[str] = set()
    for gi, group in enumerate(st.groups):
        name = f"offload_tables_{gi}"
        try:
            impl = build_multi([c.module for c in group], st.fmt, st.device, name, st.max_bag_size)
        except OffloadError as e:
            st.report.notes.append(f"batching {[c.name for c in group]} failed ({type(e).__name__}: {e}); offloaded one by one")
            continue
        st.gm.add_submodule(name, BatchedBags(impl, [c.module.embedding_dim for c in group]))
        items = _replace_batched(st.gm, group, name)
        st.node_map.update({it.name: c.last.name for it, c in zip(items, group)})
        st.float_refs[name] = FloatBags([c.module for c in group])
        members = tuple(c.name for c in group)
        for c in group:
            d = st.decisions[c.name]
            d.offloaded, d.replacement, d.batched_with = True, name, members
            d.reason = f"{len(group)} tables (dim {c.module.embedding_dim}, {c.bag_mode}, {st.fmt}) in one table-batched call"
            done.add(c.name)
    return done


def _build(st: State, c: Candidate, name: str) -> tuple[nn.Module | None, str]:
    """The offload module for ``c`` and why it was offloaded, or ``(None, why not)``."""
    if c.kind == "embedding_bag":
        return build_bag(c.module, st.fmt, st.device, name, st.max_bag_size), f"{st.fmt} table on {st.report.device}"
    if c.kind == "embedding":
        return build_embedding(c.module, st.fmt, st.device, name), f"{st.fmt} table on {st.report.device}"
    if c.kind in ("ebc", "tbe"):
        new = recsys.build(c.kind, c.module, st.fmt, st.device, name, st.plan)
        if st.plan is not None and c.kind == "ebc":
            return new, f"tables sharded over {len(st.plan.cards)} card(s) of the plan"
        calls = len(new.tbes) if c.kind == "ebc" else 1
        return new, f"all tables in {calls} table-batched call(s) on {st.report.device}"
    if c.name not in st.recorded:
        return None, "MLP input was not a tensor on the calibration batches"
    new = build_mlp(c.module, st.recorded[c.name], st.precision, st.reuse_factor, st.device, name)
    return new, f"MLP chain of {len(c.nodes)} layers, precision={st.precision}, reuse_factor={st.reuse_factor}"


def _replace_singles(st: State, done: set[str]) -> None:
    built: dict[tuple, tuple[str, str]] = {}  # table -> (its offload module, the candidate that built it)
    for c in st.candidates:
        d = st.decisions[c.name]
        if c.name in done or d.reason:
            continue
        key = table_key(c)
        if key in built:  # the same table, already offloaded for another call site
            name, first = built[key]
            last = c.last.name
            st.node_map[_replace_single(st.gm, c, name).name] = last
            d.offloaded, d.replacement, d.reason = True, name, f"shares the offloaded table of {first}"
            continue
        name = "offload_" + c.name.replace("..", "_to_")
        try:
            new, why = _build(st, c, name)
        except OffloadError as e:
            d.reason = _refusal(e)
            if c.kind in TABLE_KINDS:
                st.report.card_bytes_used -= table_bytes(c.module.num_embeddings, c.module.embedding_dim, st.fmt)
            continue
        if new is None:
            d.reason = why
            continue
        st.gm.add_submodule(name, new)
        last = c.last.name
        st.node_map[_replace_single(st.gm, c, name).name] = last
        st.float_refs[name] = c.module
        d.offloaded, d.replacement, d.reason = True, name, why
        if c.kind != "mlp":
            built[key] = (name, c.name)


def apply(st: State) -> None:
    """Pass: offload modules in ``st.gm`` for the groups, then the single candidates still undecided."""
    _replace_singles(st, _replace_groups(st))
    st.gm.graph.eliminate_dead_code()
    st.gm.delete_all_unused_submodules()
    st.gm.graph.lint()
    st.gm.recompile()


def _collect_kernels(gm: nn.Module) -> list:
    """The kernels of every offload module in ``gm`` (shared modules once), in graph order."""
    out = []
    for _, m in gm.named_modules():
        if m is not gm and isinstance(m, KernelSource):
            out.extend(m.offload_kernels())
    return out


def finish(st: State) -> fx.GraphModule:
    """``st.gm`` carrying what callers read: the report, and what compare and save need."""
    gm = st.gm
    gm.offload_report = st.report
    # For offload.compare: offloaded graph node -> the float graph node it replaces, and the float
    # module each offload module stands for (plain attributes: not parameters, not in state_dict).
    gm.offload_node_map = st.node_map
    gm.offload_float_refs = st.float_refs
    # offload.save(gm, dir) writes every offloaded kernel into one bundle (for `offload build`).
    gm.offload_kernels = functools.partial(_collect_kernels, gm)
    return gm

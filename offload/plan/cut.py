"""Embedding kernels cut into a plan's shards, one kernel a card and pooling group: what the
sharded collection loads on its engine and what ``offload build --plan`` writes a project for.

Each card kernel is *partial* (:attr:`EmbeddingSpec.partial`): its table ``i`` is slot ``i``, a
shard's rows ``[r0, r1)`` and columns ``[c0, c1)`` of one lookup's table, and it returns the raw
accumulator and bag counts, which :func:`offload.kernels.embedding.combine_partials` combines
over a table's row shards. A Cartesian merge of one-hot tables is one product table looked up at
``i * rows_b + j``. Torch-free: kernels and NumPy arrays in, kernels out.

Example::

    groups = [lookups(k, plan) for k in kernels]
    for card, by_group in assign(groups, plan).items():
        ks = [card_kernel(card, g, kernels[g].spec, groups[g], slots) for g, slots in by_group]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from offload.kernels import Kernel
from offload.kernels.embedding import EmbeddingSpec, TableSpec
from offload.plan.plan import Plan, Shard
from offload.sim.errors import InputError, UnsupportedError

__all__ = ["Lookup", "Slot", "lookups", "assign", "card_kernel", "card_kernels"]

Card = tuple[int, int]


@dataclass(frozen=True)
class Lookup:
    """One lookup stream of a group: a feature on its table, or a merge's pair of one-hot features."""

    features: tuple[int, ...]  # group feature positions (two for a merge)
    table: TableSpec  # the whole (or merged) table
    tensors: dict  # its raw resident arrays
    part_rows: tuple[int, ...]  # a merge's part rows (i * rows_b + j), () otherwise
    part_dims: tuple[int, ...]
    plan_name: str


@dataclass(frozen=True)
class Slot:
    """One shard of a lookup on one card: rows [r0, r1), columns [c0, c1), and the plan's shard."""

    group: int
    lookup: int
    r0: int
    r1: int
    c0: int
    c1: int
    shard: Shard


def lookups(kernel: Kernel, plan: Plan, *, weighted: bool = False) -> list[Lookup]:
    """The lookup streams of an embedding ``kernel`` as ``plan`` has them: one per feature, and one
    per Cartesian merge (refused for a ``weighted`` collection: its bags carry weights a product
    table cannot)."""
    spec = kernel.spec
    ftm = spec.feature_table_map or tuple(range(spec.num_tables))
    out: list[Lookup] = []
    merged: dict[str, list[int]] = {}
    for f, t in enumerate(ftm):
        ts = spec.tables[t]
        tp = plan.table(ts.name)
        if tp.parts:
            merged.setdefault(tp.name, []).append(f)
            continue
        if (tp.rows, tp.dim) != (ts.num_rows, ts.dim):
            raise InputError(f"plan: table {ts.name!r} is planned {tp.rows} x {tp.dim}, the collection's is {ts.num_rows} x {ts.dim}")
        tens = {"table": kernel.tensors[f"table{t}"]}
        if ts.rowwise:
            tens["params"] = kernel.tensors[f"params{t}"]
        out.append(Lookup((f,), ts, tens, (), (), tp.name))
    for name, fs in merged.items():
        tp = plan.table(name)
        if weighted:
            raise UnsupportedError(f"plan: merged table {name!r}: a weighted collection's one-hot features cannot share a product table")
        if len(tp.parts) != 2:  # only parts[0] and parts[1] are read below: a third part's feature would go unlooked-up
            raise UnsupportedError(f"plan: merged table {name!r} has {len(tp.parts)} parts; a Cartesian merge is of two one-hot tables")
        by_name = {spec.tables[ftm[f]].name: f for f in fs}
        if sorted(by_name) != sorted(tp.parts) or len(fs) != len(tp.parts):
            raise InputError(f"plan: merged table {name!r} needs features of {list(tp.parts)} in one pooling group, got {sorted(by_name)}")
        fa, fb = by_name[tp.parts[0]], by_name[tp.parts[1]]
        ta, tb = spec.tables[ftm[fa]], spec.tables[ftm[fb]]
        if ta.fmt != tb.fmt or ta.rowwise or ta.padding_idx is not None or tb.padding_idx is not None:
            raise UnsupportedError(f"plan: merged table {name!r}: parts must share one fixed-point format and have no padding row")
        A, Bt = kernel.tensors[f"table{ftm[fa]}"], kernel.tensors[f"table{ftm[fb]}"]
        prod = np.hstack([np.repeat(A, tb.num_rows, axis=0), np.tile(Bt, (ta.num_rows, 1))])
        ts = TableSpec(name, ta.num_rows * tb.num_rows, ta.dim + tb.dim, ta.fmt)
        if (tp.rows, tp.dim) != (ts.num_rows, ts.dim):
            raise InputError(f"plan: merged table {name!r} is planned {tp.rows} x {tp.dim}, its parts' product is {ts.num_rows} x {ts.dim}")
        out.append(Lookup((fa, fb), ts, {"table": prod}, (ta.num_rows, tb.num_rows), (ta.dim, tb.dim), name))
    return out


def assign(groups: Sequence[Sequence[Lookup]], plan: Plan) -> dict[Card, list[tuple[int, list[Slot]]]]:
    """Per card (in order): per group holding a shard there, that group's slots."""
    cards: dict[Card, dict[int, list[Slot]]] = {}
    for g, lks in enumerate(groups):
        for li, lk in enumerate(lks):
            for s in plan.table(lk.plan_name).shards:
                cards.setdefault(s.where, {}).setdefault(g, []).append(Slot(g, li, s.row0, s.row1, s.col0, s.col1, s))
    return {card: sorted(by.items()) for card, by in sorted(cards.items())}


def card_kernel(card: Card, g: int, spec: EmbeddingSpec, lks: Sequence[Lookup], slots: Sequence[Slot]) -> Kernel:
    """The partial kernel of group ``g`` (spec ``spec``, lookups ``lks``) on ``card``: table ``i`` is ``slots[i]``."""
    tables, tensors = [], {}
    for i, sl in enumerate(slots):
        lk = lks[sl.lookup]
        ts = lk.table
        pad = ts.padding_idx - sl.r0 if ts.padding_idx is not None and sl.r0 <= ts.padding_idx < sl.r1 else None
        tables.append(replace(ts, name=f"{ts.name}@r{sl.r0}c{sl.c0}", num_rows=sl.r1 - sl.r0, dim=sl.c1 - sl.c0,
                              padding_idx=pad, bundle=None, onchip=None))  # the plan, not the bundle, says what is on chip
        tensors[f"table{i}"] = np.ascontiguousarray(lk.tensors["table"][sl.r0:sl.r1, sl.c0:sl.c1])
        if ts.rowwise:
            tensors[f"params{i}"] = np.ascontiguousarray(lk.tensors["params"][sl.r0:sl.r1])
    kspec = replace(spec, tables=tuple(tables), feature_table_map=None, partial=True)
    return Kernel(f"shard_h{card[0]}c{card[1]}_g{g}", kspec, tensors)


def card_kernels(kernels: Sequence[Kernel], plan: Plan, *, weighted: bool = False) -> dict[Card, list[tuple[Kernel, list[Slot]]]]:
    """Every card's partial kernels (one per group with a shard there) and their slots, for
    embedding ``kernels`` (the groups, in order) cut as ``plan`` says.

    Example::

        for card, ks in card_kernels([tbe.offload_kernels()[0]], plan).items(): ...
    """
    groups = [lookups(k, plan, weighted=weighted) for k in kernels]
    return {card: [(card_kernel(card, g, kernels[g].spec, groups[g], slots), slots) for g, slots in by_group]
            for card, by_group in assign(groups, plan).items()}

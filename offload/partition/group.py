"""Partition pass: which tables share one table-batched call (FBGEMM's TBE layout, one device round trip).

Greedy, in graph order: same (dim, mode, fmt), plain bags only, and every member's inputs defined
before any member's output is used, so one call can sit between them. An input that is only an item
of a forward argument (``indices[i]``) counts as defined with the arguments: the replace pass moves it
up (:func:`hoistable`), so ``[t(idx[i], off[i]).float() for i, t in ...]`` still batches.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from offload.partition.find import Candidate, bag_inputs
from offload.partition.state import State

__all__ = ["apply", "group_tables", "graph_positions", "hoistable"]


def graph_positions(gm: fx.GraphModule) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(gm.graph.nodes)}


def hoistable(n: object) -> bool:
    """``n`` is ``arg[k]`` of a forward argument with a constant ``k``: pure, so it can move up to the arguments."""
    return (isinstance(n, fx.Node) and n.op == "call_function" and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder" and not isinstance(n.args[1], fx.Node))


def group_tables(gm: fx.GraphModule, bags: list[Candidate], fmt: str) -> list[list[Candidate]]:
    """Groups of two or more ``bags`` that can become one table-batched call."""
    pos = graph_positions(gm)
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
            last_in = max((pos[a] for m in members for a in bag_inputs(m) if isinstance(a, fx.Node) and not hoistable(a)), default=-1)
            first_use = min((pos[u] for m in members for u in m.last.users), default=len(pos))
            if last_in < first_use:
                g.append(c)
                placed = True
                break
        if not placed:
            groups[key].append([c])
    return [g for gs in groups.values() for g in gs if len(g) > 1]


def apply(st: State) -> None:
    """Pass: ``st.groups``, the table-batched calls to build (none unless ``st.batch_tables``)."""
    if st.batch_tables and len(st.batchable) > 1:
        st.groups = group_tables(st.gm, st.batchable, st.fmt)

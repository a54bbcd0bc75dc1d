"""Connectivity config (``v++ --config``) that spreads embedding tables over HBM/DDR banks.

Each table is its own m_axi port (see :func:`offload.hls.embedding.table_bundle`), so each can sit
in its own memory bank and the lookups of different tables proceed in parallel. Placement:

1. Tables larger than one bank (HBM only: a pseudo-channel holds ``capacity / 32``) take a run of
   whole, still-empty neighbouring pseudo-channels ``HBM[a:b]``, largest first, at the lowest run
   with the least traffic. DDR banks are not contiguous address ranges for one port, so a table
   larger than a DDR bank is an error.
2. The rest go greedily, largest expected traffic first (ties: larger, then name), onto the bank
   with the least traffic so far that still has room (ties: lowest bank number).
3. The per-call buffers (indices, offsets, weights, out) share one small port on the bank with
   the least traffic left.

Deterministic: the same tables give the same file. :class:`~offload.sim.errors.InputError` (a
``ValueError``) if the tables do not fit. Bank counts, sizes and SLRs come from
:data:`offload.hls.cards.CARDS`.

Example::

    from offload.hls.connectivity import embedding_connectivity
    text = embedding_connectivity(spec, "u55c")           # write as link.cfg, pass to v++ --config
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from offload.hls.cards import Card, get_card
from offload.hls.embedding import IO_BUNDLE, table_bundle, top_name
from offload.kernels.embedding import EmbeddingSpec
from offload.sim.errors import InputError

__all__ = ["Item", "Placement", "place", "embedding_connectivity"]


@dataclass(frozen=True)
class Item:
    """One thing to place: a name (the port), its bytes and its expected traffic (any unit)."""

    name: str
    bytes: int
    traffic: float


@dataclass(frozen=True)
class Placement:
    """Where an item went: banks ``first..last`` (one bank when equal)."""

    first: int
    last: int

    def spelling(self, kind: str) -> str:
        return f"{kind}[{self.first}]" if self.first == self.last else f"{kind}[{self.first}:{self.last}]"


def place(items: Sequence[Item], card: str | Card) -> dict[str, Placement]:
    """Assign each item to a bank (or a run of HBM banks) of ``card.memory``; see the module doc for the rules."""
    card = get_card(card)
    p = card.memory
    used = [0] * p.banks
    load = [0.0] * p.banks
    out: dict[str, Placement] = {}
    total = sum(it.bytes for it in items)
    if total > p.bytes:
        raise InputError(f"tables need {total} bytes, more than {card.name}'s {p.bytes} bytes of {p.kind}")
    big = sorted((it for it in items if it.bytes > p.bank_bytes), key=lambda it: (-it.bytes, it.name))
    small = sorted((it for it in items if it.bytes <= p.bank_bytes), key=lambda it: (-it.traffic, -it.bytes, it.name))
    for it in big:
        if p.kind != "HBM":
            raise InputError(f"table {it.name!r}: {it.bytes} bytes exceed one {p.kind} bank ({p.bank_bytes} bytes) on {card.name}")
        k = math.ceil(it.bytes / p.bank_bytes)
        runs = [a for a in range(p.banks - k + 1) if all(used[b] == 0 for b in range(a, a + k))]
        if not runs:
            raise InputError(f"table {it.name!r}: no run of {k} free {p.kind} pseudo-channels left on {card.name}")
        a = min(runs, key=lambda a: (sum(load[a:a + k]), a))
        left = it.bytes
        for b in range(a, a + k):
            take = min(left, p.bank_bytes)
            used[b] += take
            load[b] += it.traffic * take / it.bytes
            left -= take
        out[it.name] = Placement(a, a + k - 1)
    for it in small:
        fits = [b for b in range(p.banks) if used[b] + it.bytes <= p.bank_bytes]
        if not fits:
            raise InputError(f"table {it.name!r}: {it.bytes} bytes fit in no {p.kind} bank of {card.name} (fragmented)")
        b = min(fits, key=lambda b: (load[b], b))
        used[b] += it.bytes
        load[b] += it.traffic
        out[it.name] = Placement(b, b)
    return out


def embedding_connectivity(
    spec: EmbeddingSpec,
    card: str | Card,
    *,
    traffic: Mapping[str, float] | None = None,
    compute_units: int = 1,
) -> str:
    """The ``[connectivity]`` section for one embedding kernel on ``card``'s memory.

    ``traffic`` maps a table name to its expected lookups per sample (default 1); a table's traffic
    is that times its row bytes. Each compute unit gets its own copy of the tables' ports mapped
    identically (they share the resident tables).
    """
    card = get_card(card)
    p = card.memory
    traffic = dict(traffic or {})
    unknown = set(traffic) - {t.name for t in spec.tables}
    if unknown:
        raise InputError(f"traffic: unknown tables {sorted(unknown)}")
    # Tables sharing a bundle share a port, hence a bank: place bundles, not tables.
    groups: dict[str, list[int]] = {}
    for t in range(spec.num_tables):
        groups.setdefault(table_bundle(spec, t), []).append(t)
    items = []
    for bundle, ts in groups.items():
        nbytes = sum(spec.tables[t].bytes() for t in ts)
        tr = sum(traffic.get(spec.tables[t].name, 1.0) * spec.tables[t].bytes() / spec.tables[t].num_rows for t in ts)
        items.append(Item(bundle, nbytes, tr))
    placed = place(items, card)
    load = [0.0] * p.banks
    for it in items:
        pl = placed[it.name]
        for b in range(pl.first, pl.last + 1):
            load[b] += it.traffic / (pl.last - pl.first + 1)
    io_bank = min(range(p.banks), key=lambda b: (load[b], b))

    top = top_name(spec)
    lines = ["# Generated by offload.hls.connectivity; do not edit.", f"# platform {card.name}: {p.banks} x {p.kind}", "[connectivity]"]
    cus = [f"{top}_{i + 1}" for i in range(compute_units)]
    lines.append(f"nk={top}:{compute_units}")  # v++ names them top_1..top_N, as cus above (UG1702)
    for cu in cus:
        for t, ts in enumerate(spec.tables):
            bank = placed[table_bundle(spec, t)].spelling(p.kind)
            lines.append(f"sp={cu}.table{t}:{bank}")
            if ts.rowwise:
                lines.append(f"sp={cu}.params{t}:{bank}")
        for arg in ("indices", "offsets", "per_sample_weights", "out"):
            lines.append(f"sp={cu}.{arg}:{p.kind}[{io_bank}]")
        # Next to the bank it reads most (on U250 each DDR bank hangs off its own SLR).
        busiest = max(range(p.banks), key=lambda b: (load[b], -b))
        lines.append(f"slr={cu}:SLR{p.slr_of_bank[busiest]}")
    lines.append(f"# io bundle {IO_BUNDLE} -> {p.kind}[{io_bank}]")
    return "\n".join(lines) + "\n"

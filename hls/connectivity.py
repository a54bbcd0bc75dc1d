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

Deterministic: the same tables give the same file. ``ValueError`` if the tables do not fit.

Example::

    from offload.hls.connectivity import embedding_connectivity
    text = embedding_connectivity(spec, "u55c")           # write as link.cfg, pass to v++ --config
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from offload.kernels.embedding import EmbeddingSpec

__all__ = ["Platform", "PLATFORMS", "Item", "Placement", "place", "embedding_connectivity"]

_GiB = 1 << 30


@dataclass(frozen=True)
class Platform:
    """A card's memory: ``banks`` banks named ``{kind}[i]``, each ``bank_bytes`` and ``bank_gbps``."""

    name: str
    kind: str  # "HBM" or "DDR"
    banks: int
    bank_bytes: int
    bank_gbps: float
    slr_of_bank: tuple[int, ...]  # the SLR a kernel reading bank i is best placed in

    @property
    def capacity(self) -> int:
        return self.banks * self.bank_bytes


PLATFORMS: dict[str, Platform] = {
    # U55C: 16 GB HBM2 in 32 pseudo-channels (512 MB each), 460 GB/s total (~14.4 GB/s per PC);
    # HBM sits below SLR0. AMD DS978 "Alveo U55C Data Center Accelerator Card Data Sheet".
    "u55c": Platform("u55c", "HBM", 32, 16 * _GiB // 32, 460 / 32, (0,) * 32),
    # U280: 8 GB HBM2, 32 PCs of 256 MB, 460 GB/s total; HBM attached to SLR0.
    # AMD DS963 "Alveo U280 Data Center Accelerator Card Data Sheet"; UG1120 (platform memory map).
    "u280": Platform("u280", "HBM", 32, 8 * _GiB // 32, 460 / 32, (0,) * 32),
    # U50: 8 GB HBM2, 32 PCs of 256 MB, 316 GB/s total (~9.9 GB/s per PC); HBM on SLR0.
    # AMD DS965 "Alveo U50 Data Center Accelerator Card Data Sheet".
    "u50": Platform("u50", "HBM", 32, 8 * _GiB // 32, 316 / 32, (0,) * 32),
    # U250: 64 GB DDR4 as 4 banks DDR[0..3] of 16 GB, DDR4-2400 x72 (19.2 GB/s each);
    # DDR[i] is attached to SLR i. AMD DS962 "Alveo U200 and U250 Data Sheet"; UG1120.
    "u250": Platform("u250", "DDR", 4, 16 * _GiB, 19.2, (0, 1, 2, 3)),
}


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


def place(items: Sequence[Item], platform: str | Platform) -> dict[str, Placement]:
    """Assign each item to a bank (or a run of HBM banks); see the module doc for the rules."""
    p = PLATFORMS[platform.lower()] if isinstance(platform, str) else platform
    used = [0] * p.banks
    load = [0.0] * p.banks
    out: dict[str, Placement] = {}
    total = sum(it.bytes for it in items)
    if total > p.capacity:
        raise ValueError(f"tables need {total} bytes, more than {p.name}'s {p.capacity} bytes of {p.kind}")
    big = sorted((it for it in items if it.bytes > p.bank_bytes), key=lambda it: (-it.bytes, it.name))
    small = sorted((it for it in items if it.bytes <= p.bank_bytes), key=lambda it: (-it.traffic, -it.bytes, it.name))
    for it in big:
        if p.kind != "HBM":
            raise ValueError(f"table {it.name!r}: {it.bytes} bytes exceed one {p.kind} bank ({p.bank_bytes} bytes) on {p.name}")
        k = math.ceil(it.bytes / p.bank_bytes)
        runs = [a for a in range(p.banks - k + 1) if all(used[b] == 0 for b in range(a, a + k))]
        if not runs:
            raise ValueError(f"table {it.name!r}: no run of {k} free {p.kind} pseudo-channels left on {p.name}")
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
            raise ValueError(f"table {it.name!r}: {it.bytes} bytes fit in no {p.kind} bank of {p.name} (fragmented)")
        b = min(fits, key=lambda b: (load[b], b))
        used[b] += it.bytes
        load[b] += it.traffic
        out[it.name] = Placement(b, b)
    return out


def embedding_connectivity(
    spec: EmbeddingSpec,
    platform: str,
    *,
    traffic: Mapping[str, float] | None = None,
    compute_units: int = 1,
) -> str:
    """The ``[connectivity]`` section for one embedding kernel on ``platform``.

    ``traffic`` maps a table name to its expected lookups per sample (default 1); a table's traffic
    is that times its row bytes. Each compute unit gets its own copy of the tables' ports mapped
    identically (they share the resident tables).
    """
    from offload.hls.embedding import IO_BUNDLE, table_bundle, top_name

    p = PLATFORMS[platform.lower()]
    traffic = dict(traffic or {})
    unknown = set(traffic) - {t.name for t in spec.tables}
    if unknown:
        raise ValueError(f"traffic: unknown tables {sorted(unknown)}")
    # Tables sharing a bundle share a port, hence a bank: place bundles, not tables.
    groups: dict[str, list[int]] = {}
    for t in range(spec.num_tables):
        groups.setdefault(table_bundle(spec, t), []).append(t)
    items = []
    for bundle, ts in groups.items():
        nbytes = sum(spec.tables[t].bytes() for t in ts)
        tr = sum(traffic.get(spec.tables[t].name, 1.0) * spec.tables[t].bytes() / spec.tables[t].num_rows for t in ts)
        items.append(Item(bundle, nbytes, tr))
    placed = place(items, p)
    load = [0.0] * p.banks
    for it in items:
        pl = placed[it.name]
        for b in range(pl.first, pl.last + 1):
            load[b] += it.traffic / (pl.last - pl.first + 1)
    io_bank = min(range(p.banks), key=lambda b: (load[b], b))

    top = top_name(spec)
    lines = ["# Generated by offload.hls.connectivity; do not edit.", f"# platform {p.name}: {p.banks} x {p.kind}", "[connectivity]"]
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

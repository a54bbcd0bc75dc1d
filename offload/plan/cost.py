"""The planner's cost model: time per batch of a shard on its memory bank, and of a card.

A bank serves its shards' random row reads one after another (:meth:`Unit.lookup_s`: the row's
transfer at the bank's rate, or its read latency over the m_axi master's outstanding reads); a card
runs its banks in parallel, so its time is its busiest bank plus the host link: indices and offsets
in, partial sums (accumulator width, 8 bytes) and counts out over PCIe, one per table and column
range a card (the card sums its own row shards; the sim engine returns them per shard, which
changes no result), one buffer sync each way
and a kernel launch; a card on another host than the caller's (host 0) adds the network both ways.
All constants come from :mod:`offload.hls.cards` and the :class:`~offload.plan.topology.Topology`.
"""

from __future__ import annotations

from offload.hls.cards import KERNEL_LAUNCH_S, PCIE_TRANSFER_LATENCY_S
from offload.plan.topology import Unit

__all__ = ["shard_time", "card_io_bytes", "card_time"]

_INDEX_BYTES = 8  # int64 indices and offsets, as the kernel's ABI takes them
_PARTIAL_BYTES = 8  # raw accumulator (<= 62 bits) and count, int64 each


def shard_time(unit: Unit, lookups: float, row_bytes: int) -> float:
    """Busy time per batch of ``lookups`` random reads of ``row_bytes`` on ``unit``."""
    return lookups * unit.lookup_s(row_bytes)


def card_io_bytes(plan, where: tuple[int, int]) -> tuple[float, float]:
    """(bytes in, bytes out) of one batch on card ``where``."""
    B = plan.batch_size
    lookups = cols = groups = 0.0
    for t in plan.tables:
        mine = [s for s in t.shards if s.where == where]
        if not mine:
            continue
        nfeat = 1 if t.parts else len(t.features)
        lookups += sum(s.lookups for s in mine)
        for c0, c1 in {(s.col0, s.col1) for s in mine}:
            cols += (c1 - c0) * nfeat
            groups += nfeat
    return _INDEX_BYTES * (lookups + groups * B + 1), _PARTIAL_BYTES * B * (cols + groups)


def card_time(plan, where: tuple[int, int]) -> float:
    """Predicted time per batch of card ``where`` (see the module docstring)."""
    card = plan.topology.card(*where)
    busiest = max((v for k, v in plan.unit_times().items() if k[:2] == where), default=0.0)
    bin_, bout = card_io_bytes(plan, where)
    t = busiest + (bin_ + bout) / card.pcie_bps + 2 * PCIE_TRANSFER_LATENCY_S + KERNEL_LAUNCH_S
    if where[0] != 0:
        topo = plan.topology
        t += (bin_ + bout) / topo.network_bps + 2 * topo.network_latency_s
    return t

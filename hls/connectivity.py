"""Bank placement and the connectivity config (``v++ --config``) that records it.

A kernel kind that knows where its buffers belong says so through ``HlsKind.placement`` (the
embedding kind: :func:`offload.hls.embedding.placement`, which spreads tables over HBM/DDR banks
with :func:`place`); any other kind is spread evenly by :func:`spread`. :func:`kernel_connectivity`
and the Vitis project writer (:mod:`offload.hls.build`) both ask the kind, and :func:`render`
writes the ``[connectivity]`` section from the answers.

:func:`place` rules (each item is one m_axi port, so each can sit in its own bank and the ports
proceed in parallel):

1. Items larger than one bank (HBM only: a pseudo-channel holds ``capacity / 32``) take a run of
   whole, still-empty neighbouring pseudo-channels ``HBM[a:b]``, largest first, at the lowest run
   with the least traffic. DDR banks are not contiguous address ranges for one port, so an item
   larger than a DDR bank is an error.
2. The rest go greedily, largest expected traffic first (ties: larger, then name), onto the bank
   with the least traffic so far that still has room (ties: lowest bank number).

Deterministic: the same items give the same banks. :class:`~offload.sim.errors.InputError` (a
``ValueError``) if they do not fit. Bank counts, sizes and SLRs come from
:data:`offload.hls.cards.CARDS`.

Example::

    from offload.hls.connectivity import kernel_connectivity
    text = kernel_connectivity(spec, "u55c", compute_units=2)   # write as link.cfg, pass to v++ --config
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from offload.hls.cards import Card, RingMemory, get_card, ring_memory
from offload.hls.registry import KernelArg, KernelPlacement, get_hls_kind
from offload.sim.errors import InputError

__all__ = ["Item", "Placement", "place", "spread", "render", "kernel_connectivity", "ring_placement"]


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


def spread(card: str | Card, top: str, args: Sequence[KernelArg], compute_units: int, *, index: int = 0, first_bank: int = 0) -> tuple[KernelPlacement, int]:
    """The even placement of a kernel without one of its own: ``(placement, next free HBM bank)``.

    Every m_axi bundle of every CU gets its own HBM bank from ``first_bank`` on while banks last
    (bandwidth: one pseudo-channel per port), then banks are reused round-robin; CUs alternate
    over SLR0/SLR1, the SLRs nearest the HBM. On DDR cards each CU takes one bank, starting at
    ``index`` (the kernel's position among the spread ones), and the SLR that bank hangs off.
    """
    card = get_card(card)
    mem = card.memory
    cus = tuple(f"{top}_{i + 1}" for i in range(compute_units))
    ports = [a for a in args if a.role != "scalar"]
    slr: dict[str, str] = {}
    banks: dict[str, dict[str, str]] = {}
    next_bank = first_bank
    for ci, cu in enumerate(cus):
        if mem.kind == "DDR":
            b = (index + ci) % mem.banks
            slr[cu] = f"SLR{mem.slr_of_bank[b]}"
            banks[cu] = {a.name: f"DDR[{b}]" for a in ports}
        else:
            slr[cu] = f"SLR{(index + ci) % min(2, card.slrs)}"
            by_bundle: dict[str, str] = {}
            for a in ports:
                key = a.bundle or a.name
                if key not in by_bundle:
                    by_bundle[key] = f"HBM[{next_bank % mem.banks}]"
                    next_bank += 1
            banks[cu] = {a.name: by_bundle[a.bundle or a.name] for a in ports}
    return KernelPlacement(cus, slr, banks), next_bank


def ring_placement(card: str | Card, ring_top: str, ring_arg: str, resident: Sequence[KernelArg], compute_units: int, *,
                   mirror: KernelPlacement | None = None, platform: str | None = None, index: int = 0,
                   first_bank: int = 0) -> tuple[KernelPlacement, RingMemory, int]:
    """Where a persistent top's compute units go: ``(placement, ring memory, next free HBM bank)``.

    The ring port goes to ``HOST[0]`` where :func:`offload.hls.cards.ring_memory` says the
    platform reaches host memory (the host polls its own memory, the kernel reaches it over PCIe),
    else into card memory. Each CU mirrors per-call CU ``i % len`` of ``mirror`` (the same top's
    per-call placement): its SLR and its resident banks, so both tops share one copy of each
    table, and a card-memory ring sits in the bank of that CU's first per-call buffer. Without a
    mirror the ports are spread as :func:`spread` does.

    Example::

        kp, where, _ = ring_placement("u55c", "top_ring", "ring", resident_args, 1, mirror=per_call_kp)
        kp.banks["top_ring_1"]["ring"]    # "HOST[0]"
    """
    card = get_card(card)
    where = ring_memory(card, platform)
    cus = tuple(f"{ring_top}_{i + 1}" for i in range(compute_units))
    own, next_bank = spread(card, ring_top, [KernelArg(ring_arg, "input", "uint64", ring_arg), *resident], compute_units,
                            index=index, first_bank=first_bank)
    slr: dict[str, str] = {}
    banks: dict[str, dict[str, str]] = {}
    for i, (cu, own_cu) in enumerate(zip(cus, own.compute_units)):
        if mirror is not None and mirror.compute_units:
            m = mirror.compute_units[i % len(mirror.compute_units)]
            mb = mirror.banks[m]
            slr[cu] = mirror.slr[m]
            banks[cu] = {a.name: mb[a.name] for a in resident}
            card_bank = next((b for name, b in mb.items() if name not in banks[cu]), next(iter(mb.values()), own.banks[own_cu][ring_arg]))
        else:
            slr[cu] = own.slr[own_cu]
            banks[cu] = {a.name: own.banks[own_cu][a.name] for a in resident}
            card_bank = own.banks[own_cu][ring_arg]
        banks[cu] = {ring_arg: where.bank or card_bank, **banks[cu]}
    return KernelPlacement(cus, slr, banks), where, (next_bank if mirror is None else first_bank)


def render(placements: Mapping[str, KernelPlacement]) -> list[str]:
    """The ``[connectivity]`` lines for top function -> placement: every ``nk``, then ``sp``, then ``slr``."""
    # nk=<kernel>:<count> names the CUs <kernel>_1..<kernel>_<count>, the names used here;
    # the period-separated name list is not in the v++ 2024.2+ documentation (UG1702).
    lines = ["[connectivity]"]
    lines += [f"nk={top}:{len(kp.compute_units)}" for top, kp in placements.items()]
    lines += [f"sp={cu}.{arg}:{bank}" for kp in placements.values() for cu in kp.compute_units for arg, bank in kp.banks[cu].items()]
    lines += [f"slr={cu}:{kp.slr[cu]}" for kp in placements.values() for cu in kp.compute_units]
    return lines


def kernel_connectivity(spec, card: str | Card, *, traffic: Mapping[str, float] | None = None, compute_units: int = 1) -> str:
    """The ``[connectivity]`` section for one kernel on ``card``: where its kind places it.

    ``traffic`` is the kind's placement hint (embedding: expected lookups per sample by table
    name, default 1 each); a kind without a placement of its own takes none.
    """
    card = get_card(card)
    hk = get_hls_kind(spec.kind)
    if hk.placement is not None:
        kp = hk.placement(spec, card, compute_units, traffic)
    elif traffic:
        raise InputError(f"traffic: the {spec.kind} kind takes no placement hint")
    else:
        kp, _ = spread(card, hk.top_name(spec), hk.top_args(spec), compute_units)
    head = ["# Generated by offload.hls.connectivity; do not edit.", f"# platform {card.name}: {card.memory.banks} x {card.memory.kind}"]
    return "\n".join(head + render({hk.top_name(spec): kp})) + "\n"

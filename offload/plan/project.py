"""One Vitis project per card of a plan: ``offload build BUNDLE --plan plan.json --out DIR``.

A plan records shapes, formats and places, not weights, so the projects are built from the
bundle the plan was made for (its embedding kernels, the pooling groups, hold the tables by the
plan's names) and the plan: each card gets the partial kernels :mod:`offload.plan.cut` cuts for it
(its row shards return the raw accumulator and bag counts, its column shards their columns), and
a connectivity file that puts every shard's port in the HBM pseudo-channel or DDR bank the plan
chose. The per-call buffers (indices, offsets, weights, outputs) share the card's least busy bank
and the compute unit sits on the SLR of its busiest one. Kernels of other kinds in the bundle (an
MLP) go to card ``(0, 0)``, the caller's, placed as ``offload build`` places them.

A shard the plan puts on chip has no port and no connectivity line: it is held in the card
kernel (:func:`offload.kernels.embedding.hold_on_chip`), a ROM compiled from its contents, in block
RAM while the card's BRAM36 blocks last, then in UltraRAM (noted in the project: UltraScale+
UltraRAM has no bitstream contents, see :mod:`offload.hls.embedding`). A card whose on-chip
shards need more blocks than it has is refused (:class:`offload.hls.embedding.OnChipBudgetError`).

Example::

    projects = write_card_projects(offload.load("dlrm.offload"), Plan.from_json("plan.json"), "build/plan")
    projects[(0, 1)].project.root    # build/plan/h0c1
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offload.hls.build import Project, write_project
from offload.hls.cards import Card as CardType
from offload.hls.embedding import check_onchip, onchip_blocks
from offload.hls.registry import KernelPlacement, get_hls_kind
from offload.kernels import Kernel
from offload.kernels.embedding import EmbeddingSpec, hold_on_chip
from offload.plan.cut import Slot, card_kernels
from offload.plan.plan import Plan
from offload.plan.topology import ONCHIP
from offload.sim.errors import InputError

__all__ = ["write_card_projects", "card_dir", "CardProject"]

Card = tuple[int, int]


@dataclass(frozen=True)
class CardProject:
    """One card's written project and the kernels it was written for (``golden_check`` takes it as a bundle)."""

    project: Project
    kernels: dict[str, Kernel]


class _CardBundle:
    """What :func:`offload.hls.build.write_project` reads of a bundle: a name and its kernels."""

    def __init__(self, name: str, kernels: dict[str, Kernel]) -> None:
        self.name = name
        self.kernels = kernels


def card_dir(out: str | os.PathLike, card: Card) -> Path:
    """The project directory of ``card`` under ``out``: ``h<host>c<card>``."""
    return Path(out) / f"h{card[0]}c{card[1]}"


def write_card_projects(bundle: Any, plan: Plan, out: str | os.PathLike, *, launch: str = "per_call") -> dict[Card, CardProject]:
    """Write one Vitis project per card of ``plan`` under ``out`` (:func:`card_dir`) from
    ``bundle``'s kernels (see the module doc); ``plan.json`` is written next to them.

    Raises :class:`~offload.sim.errors.InputError` when the bundle has no embedding kernel or its
    tables are not the plan's.
    """
    emb = [k for k in bundle.kernels.values() if isinstance(k.spec, EmbeddingSpec)]
    other = {n: k for n, k in bundle.kernels.items() if not isinstance(k.spec, EmbeddingSpec)}
    if not emb:
        raise InputError(f"bundle {getattr(bundle, 'name', '?')!r}: no embedding kernel to cut into the plan's shards")
    per_card = card_kernels(emb, plan)
    cards = sorted(set(per_card) | ({(0, 0)} if other else set()))
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    plan.to_json(root / "plan.json")
    name = getattr(bundle, "name", "bundle")
    out_projects: dict[Card, CardProject] = {}
    for card in cards:
        kernels: dict[str, Kernel] = {}
        placements: dict[str, KernelPlacement] = {}
        notes: list[str] = []
        ctype = plan.topology.card(*card)
        blocks: dict[str, int] = {}
        for k, slots in per_card.get(card, []):
            k, blocks, left = _on_chip(k, slots, ctype, blocks)
            kernels[k.name] = k
            placements[get_hls_kind(k.kind).top_name(k.spec)] = _placement(plan, card, k, slots)
            notes += left
        if card == (0, 0):
            kernels.update(other)
        project = write_project(_CardBundle(f"{name}@h{card[0]}c{card[1]}", kernels), ctype.name, card_dir(root, card),
                                launch=launch, placements=placements, notes=tuple(notes))
        out_projects[card] = CardProject(project, kernels)
    return out_projects


def _on_chip(kernel: Kernel, slots: list[Slot], ctype: CardType, used: dict[str, int]) -> tuple[Kernel, dict[str, int], list[str]]:
    """``kernel`` with its on-chip slots held in the kernel: block RAM while the card's BRAM36
    blocks (after ``used``, the card's earlier kernels') last, then UltraRAM; the blocks used
    after it, and a note for each UltraRAM table. Raises OnChipBudgetError past the card's blocks."""
    names = [kernel.spec.tables[i].name for i, sl in enumerate(slots) if sl.shard.kind == ONCHIP]
    if not names:
        return kernel, used, []
    memories, left = {}, dict(used)
    tables = {ts.name: ts for ts in kernel.spec.tables}
    for name in names:
        bram = onchip_blocks(tables[name], "bram")
        fits = left.get("bram", 0) + bram <= ctype.bram36
        memories[name] = "bram" if fits else "uram"
        if fits:
            left["bram"] = left.get("bram", 0) + bram
    held = hold_on_chip(kernel, memories)
    notes = [f"table {n!r} is on chip in UltraRAM (the card's BRAM36 blocks are taken): UltraScale+ UltraRAM has no "
             f"bitstream contents, so check how Vitis HLS builds its ROM for {ctype.part}" for n, m in memories.items() if m == "uram"]
    return held, check_onchip(held.spec, ctype, used), notes


def _placement(plan: Plan, card: Card, kernel: Kernel, slots: list[Slot]) -> KernelPlacement:
    """The connectivity of one card kernel: slot ``i``'s ports (``table{i}``, ``params{i}``) in its
    shard's bank, the per-call buffers in the card's least busy bank of its main memory, the CU on
    the SLR of the busiest. An on-chip slot has no port."""
    ctype = plan.topology.card(*card)
    mem = ctype.memory
    times = {k[2:]: v for k, v in plan.unit_times().items() if k[:2] == card}
    load = [times.get((mem.kind, b), 0.0) for b in range(mem.banks)]
    quiet = f"{mem.kind}[{min(range(mem.banks), key=lambda b: (load[b], b))}]"
    busiest = max(range(mem.banks), key=lambda b: (load[b], -b))
    hk = get_hls_kind(kernel.kind)
    bank_of: dict[str, str] = {}
    for i, sl in enumerate(slots):
        s = sl.shard
        if s.kind != ONCHIP:
            bank_of[f"table{i}"] = bank_of[f"params{i}"] = f"{s.kind}[{s.bank}]"
    ports = {a.name: bank_of.get(a.name, quiet) for a in hk.top_args(kernel.spec) if a.role != "scalar"}
    top = hk.top_name(kernel.spec)
    cu = f"{top}_1"
    return KernelPlacement((cu,), {cu: f"SLR{mem.slr_of_bank[busiest]}"}, {cu: ports})

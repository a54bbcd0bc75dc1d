"""Where tables can live: hosts of Alveo cards, each card's memories as placement units (HBM
pseudo-channels, DDR banks, on-chip URAM/BRAM), and the network between hosts.

Card facts come from :mod:`offload.hls.cards`; what is not there (the network, the on-chip share
left to tables, the on-chip read width) is a field of :class:`Topology` with its assumption stated.

Example::

    topo = Topology.uniform("u55c", hosts=2, cards_per_host=2)
    topo = Topology(hosts=[["u55c", "u55c"], ["u280"]], network_bps=12.5e9)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from offload.hls.cards import M_AXI_OUTSTANDING_READS, Card, get_card
from offload.sim.errors import InputError, InputTypeError

__all__ = ["Topology", "Unit", "ONCHIP", "URAM_BYTES", "BRAM36_BYTES"]

ONCHIP = "onchip"
# UltraRAM blocks are 288 Kb (4K x 72 bit), BRAM36 blocks 36 Kb (UG573, "UltraRAM" and "Block RAM").
URAM_BYTES = 288 * 1024 // 8
BRAM36_BYTES = 36 * 1024 // 8
# 100 GbE between hosts (a common Alveo cluster NIC; the U55C's own QSFP28 ports are 100 Gb/s too,
# DS978) at 12.5 GB/s, and 10 us per message (kernel TCP round trip order): assumptions, override them.
NETWORK_BPS = 12.5e9
NETWORK_LATENCY_S = 10e-6


@dataclass(frozen=True)
class Unit:
    """One place a shard can live: ``(host, card)`` and memory ``kind`` (``"HBM"``, ``"DDR"``,
    ``"onchip"``) bank ``bank``; ``bytes`` free for tables, ``bps`` and ``latency_s`` of a random row read."""

    host: int
    card: int
    kind: str
    bank: int
    bytes: int
    bps: float
    latency_s: float

    @property
    def key(self) -> tuple[int, int, str, int]:
        return (self.host, self.card, self.kind, self.bank)

    @property
    def label(self) -> str:
        return f"h{self.host}c{self.card}:{self.kind}[{self.bank}]"

    def lookup_s(self, row_bytes: int) -> float:
        """Time one random row read occupies this unit: the row's transfer, or the latency divided
        over the m_axi master's outstanding reads (Little's law), whichever is longer."""
        return max(row_bytes / self.bps, self.latency_s / M_AXI_OUTSTANDING_READS)


@dataclass(frozen=True)
class Topology:
    """Hosts, each a list of cards (names from ``offload.hls.cards`` or ``Card``), and the network.

    ``onchip_share``: the part of each card's URAM + BRAM36 left to tables (the kernel's own buffers
    take the rest; 0 disables on-chip tables). ``onchip_bytes_per_cycle``: on-chip read width (64 B,
    a 512-bit row port over parallel URAMs: an assumption) at the card's kernel clock.

    Example::

        topo = Topology(hosts=[["u55c", "u55c"], ["u280"]])     # or Topology.uniform("u55c", 2, 2)
    """

    hosts: tuple[tuple[Card, ...], ...]
    network_bps: float = NETWORK_BPS
    network_latency_s: float = NETWORK_LATENCY_S
    onchip_share: float = 0.5
    onchip_bytes_per_cycle: int = 64
    _units: tuple = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.hosts, (str, Card)) or not isinstance(self.hosts, Sequence) or not self.hosts:
            raise InputTypeError("hosts: a non-empty list of hosts, each a list of cards")
        hosts = []
        for h, cards in enumerate(self.hosts):
            if isinstance(cards, (str, Card)) or not isinstance(cards, Sequence) or not cards:
                raise InputError(f"hosts[{h}]: a non-empty list of cards")
            hosts.append(tuple(get_card(c) for c in cards))
        object.__setattr__(self, "hosts", tuple(hosts))
        if not self.network_bps > 0 or not self.network_latency_s >= 0:
            raise InputError(f"network_bps must be > 0 and network_latency_s >= 0, got {self.network_bps}, {self.network_latency_s}")
        if not 0 <= self.onchip_share <= 1:
            raise InputError(f"onchip_share: must be in [0, 1], got {self.onchip_share}")
        object.__setattr__(self, "_units", tuple(self._make_units()))

    @classmethod
    def uniform(cls, card: str | Card, hosts: int = 1, cards_per_host: int = 1, **kw) -> "Topology":
        """``hosts`` hosts of ``cards_per_host`` identical cards each."""
        if hosts < 1 or cards_per_host < 1:
            raise InputError(f"hosts and cards_per_host must be >= 1, got {hosts}, {cards_per_host}")
        return cls(hosts=[[card] * cards_per_host for _ in range(hosts)], **kw)

    @property
    def cards(self) -> list[tuple[int, int, Card]]:
        return [(h, c, card) for h, cards in enumerate(self.hosts) for c, card in enumerate(cards)]

    def card(self, host: int, card: int) -> Card:
        try:
            return self.hosts[host][card]
        except (IndexError, TypeError):
            raise InputError(f"card {(host, card)}: no such card; hosts have {[len(h) for h in self.hosts]} cards") from None

    @property
    def units(self) -> tuple[Unit, ...]:
        return self._units

    def onchip_bytes(self, card: Card) -> int:
        return int((card.uram * URAM_BYTES + card.bram36 * BRAM36_BYTES) * self.onchip_share)

    def _make_units(self):
        for h, c, card in self.cards:
            for mem in (card.hbm, card.ddr):
                if mem is None:
                    continue
                for b in range(mem.banks):
                    yield Unit(h, c, mem.kind, b, mem.bank_bytes, mem.bank_bps, mem.random_read_latency_s)
            nb = self.onchip_bytes(card)
            if nb:
                # One row per cycle through a onchip_bytes_per_cycle port: bps at the kernel clock, no latency term.
                yield Unit(h, c, ONCHIP, 0, nb, self.onchip_bytes_per_cycle * card.kernel_clock_hz, 0.0)

    def to_json(self) -> dict:
        return {"hosts": [[card.name for card in cards] for cards in self.hosts], "network_bps": self.network_bps,
                "network_latency_s": self.network_latency_s, "onchip_share": self.onchip_share,
                "onchip_bytes_per_cycle": self.onchip_bytes_per_cycle}

    @classmethod
    def from_json(cls, d: dict) -> "Topology":
        known = {"hosts", "network_bps", "network_latency_s", "onchip_share", "onchip_bytes_per_cycle"}
        extra = sorted(set(d) - known)
        if extra:
            raise InputError(f"topology: unknown fields {extra}")
        return cls(**d)

"""The placement plan: per table its sharding and shards (rows, columns, card, memory bank,
bytes, predicted time per batch), its Cartesian merge if any, and the predicted totals. Plain data:
written and read as JSON (never pickle), byte-identical for the same inputs.

Example::

    plan.to_json("plan.json"); plan = Plan.from_json("plan.json")
    print(plan.explain())
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from offload.plan.topology import ONCHIP, Topology
from offload.sim.errors import InputError

__all__ = ["Shard", "TablePlan", "Plan", "SHARDING_TYPES", "FORMAT_VERSION"]

SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Shard:
    """Rows ``[row0, row1)`` and columns ``[col0, col1)`` of a table on card ``(host, card)`` in
    memory ``kind`` bank ``bank``; ``bytes`` resident, ``time_s`` its predicted share of a batch on that bank."""

    host: int
    card: int
    kind: str
    bank: int
    row0: int
    row1: int
    col0: int
    col1: int
    bytes: int
    time_s: float
    lookups: float  # expected row reads per batch

    @property
    def where(self) -> tuple[int, int]:
        return (self.host, self.card)

    @property
    def unit(self) -> tuple[int, int, str, int]:
        return (self.host, self.card, self.kind, self.bank)


@dataclass(frozen=True)
class TablePlan:
    """One planned table. A Cartesian merge of one-hot tables lists its ``parts`` (source table
    names, first part slowest: merged row ``i0 * rows1 + i1``) and their ``part_rows``/``part_dims``."""

    name: str
    rows: int
    dim: int
    fmt: str
    sharding: str
    pooling_factor: float
    features: tuple[str, ...]
    shards: tuple[Shard, ...]
    parts: tuple[str, ...] = ()
    part_rows: tuple[int, ...] = ()
    part_dims: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


@dataclass(frozen=True)
class Plan:
    """What :func:`offload.plan.shard` returns: every table's shards, with the modelled time per
    batch; written and read back as JSON.

    Example::

        plan.table("users").shards, plan.batch_s(); print(plan.explain())
        plan.to_json("plan.json"); assert Plan.from_json("plan.json") == plan
    """

    topology: Topology
    batch_size: int
    tables: tuple[TablePlan, ...]
    reserve: float = 0.0
    _by_name: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        by = {}
        for t in self.tables:
            by[t.name] = t
            for p in t.parts:
                by[p] = t
        object.__setattr__(self, "_by_name", by)

    def table(self, name: str) -> TablePlan:
        """The plan of source table ``name`` (a merged table's plan for each of its parts)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise InputError(f"table {name!r}: not in the plan (planned: {sorted(self._by_name)})") from None

    @property
    def cards(self) -> list[tuple[int, int]]:
        """Cards holding at least one shard, in order."""
        return sorted({s.where for t in self.tables for s in t.shards})

    def unit_times(self) -> dict[tuple[int, int, str, int], float]:
        """Predicted busy time per batch of every used memory bank."""
        out: dict = {}
        for t in self.tables:
            for s in t.shards:
                out[s.unit] = out.get(s.unit, 0.0) + s.time_s
        return dict(sorted(out.items()))

    def unit_bytes(self) -> dict[tuple[int, int, str, int], int]:
        out: dict = {}
        for t in self.tables:
            for s in t.shards:
                out[s.unit] = out.get(s.unit, 0) + s.bytes
        return dict(sorted(out.items()))

    def channel_balance(self) -> float:
        """Busiest HBM pseudo-channel's predicted time per batch over the mean of the used ones (1.0: even)."""
        ts = [v for k, v in self.unit_times().items() if k[2] == "HBM"]
        if not ts:
            return 1.0
        return max(ts) / (sum(ts) / len(ts))

    def card_times(self) -> dict[tuple[int, int], float]:
        """Predicted time per batch of each used card: its busiest bank, its PCIe transfers and
        launch, and, off host 0 (the caller's), the network round trip of its inputs and partials."""
        from offload.plan.cost import card_time

        return {w: card_time(self, w) for w in self.cards}

    def batch_s(self) -> float:
        """Predicted time per batch: the slowest card (cards run concurrently)."""
        return max(self.card_times().values(), default=0.0)

    # ------------------------------------------------------------------------------------ text

    def explain(self) -> str:
        """Per table: sharding, cards, memories (HBM PCs, DDR banks, on-chip), bytes and predicted
        time per batch; then per card bytes and time, and the channel balance."""
        lines = [f"plan: {len(self.tables)} tables on {len(self.cards)} card(s) of {sum(len(h) for h in self.topology.hosts)}, "
                 f"batch {self.batch_size}, reserve {self.reserve:.0%}",
                 f"{'table':<24} {'sharding':<15} {'shards':>6} {'bytes':>12} {'time/batch':>11}  where"]
        for t in self.tables:
            name = t.name if not t.parts else f"{t.name} (merge)"
            where = _where(t.shards)
            lines.append(f"{name:<24} {t.sharding:<15} {len(t.shards):>6} {_b(t.bytes):>12} "
                         f"{_us(max((s.time_s for s in t.shards), default=0.0)):>11}  {where}")
        lines.append("")
        lines.append(f"{'card':<8} {'type':<6} {'bytes':>12} {'HBM PCs':>8} {'DDR':>4} {'onchip':>7} {'time/batch':>11}")
        ub = self.unit_bytes()
        ct = self.card_times()
        for (h, c) in self.cards:
            used = [k for k in ub if k[:2] == (h, c)]
            lines.append(f"h{h}c{c:<6} {self.topology.card(h, c).name:<6} {_b(sum(ub[k] for k in used)):>12} "
                         f"{sum(k[2] == 'HBM' for k in used):>8} {sum(k[2] == 'DDR' for k in used):>4} "
                         f"{_b(sum(ub[k] for k in used if k[2] == ONCHIP)):>7} {_us(ct[(h, c)]):>11}")
        lines.append(f"predicted time per batch {_us(self.batch_s())}; busiest HBM channel / mean {self.channel_balance():.3f}")
        return "\n".join(lines)

    # ------------------------------------------------------------------------------------ JSON

    def to_dict(self) -> dict:
        return {"format": FORMAT_VERSION, "topology": self.topology.to_json(), "batch_size": self.batch_size,
                "reserve": self.reserve,
                "tables": [{**{k: v for k, v in asdict(t).items() if k != "shards"},
                            "shards": [asdict(s) for s in t.shards]} for t in self.tables]}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The plan as JSON text (sorted keys, so the same plan is the same bytes); written to ``path`` if given."""
        text = json.dumps(self.to_dict(), sort_keys=True, indent=1) + "\n"
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    @classmethod
    def from_dict(cls, d: Any) -> "Plan":
        if not isinstance(d, dict) or d.get("format") != FORMAT_VERSION:
            raise InputError(f"plan: expected a plan object with format {FORMAT_VERSION}")
        try:
            tables = []
            for t in d["tables"]:
                t = dict(t)
                shards = tuple(Shard(**s) for s in t.pop("shards"))
                for k in ("features", "parts", "part_rows", "part_dims"):
                    t[k] = tuple(t.get(k, ()))
                if t["sharding"] not in SHARDING_TYPES:
                    raise InputError(f"plan: table {t['name']!r}: unknown sharding {t['sharding']!r}")
                tables.append(TablePlan(shards=shards, **t))
            plan = cls(Topology.from_json(d["topology"]), int(d["batch_size"]), tuple(tables), float(d.get("reserve", 0.0)))
        except (KeyError, TypeError) as e:
            raise InputError(f"plan: malformed ({type(e).__name__}: {e})") from None
        for t in plan.tables:
            for s in t.shards:
                plan.topology.card(s.host, s.card)
        return plan

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "Plan":
        """Read a plan written by :meth:`to_json`."""
        with open(path, encoding="utf-8") as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise InputError(f"plan {os.fspath(path)!r}: not JSON ({e})") from None
        return cls.from_dict(d)


def _b(n: int) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def _us(s: float) -> str:
    return f"{s * 1e6:.2f} us"


def _where(shards) -> str:
    by: dict = {}
    for s in shards:
        by.setdefault((s.host, s.card), []).append(s)
    parts = []
    for (h, c), ss in sorted(by.items()):
        kinds: dict = {}
        for s in ss:
            kinds.setdefault(s.kind, []).append(s.bank)
        mem = " ".join(f"{k}{_ranges(sorted(v))}" if k != ONCHIP else k for k, v in sorted(kinds.items()))
        parts.append(f"h{h}c{c} {mem}")
    return "; ".join(parts)


def _ranges(banks: list[int]) -> str:
    out, i = [], 0
    while i < len(banks):
        j = i
        while j + 1 < len(banks) and banks[j + 1] == banks[j] + 1:
            j += 1
        out.append(str(banks[i]) if i == j else f"{banks[i]}-{banks[j]}")
        i = j + 1
    return "[" + ",".join(out) + "]"

"""``shard(tables, topology, constraints)``: every table placed, or an error naming it.

The steps, in order (each deterministic: ties broken by name and bank order, so the same inputs
give the same plan, byte for byte):

1. **Cartesian merges** (MicroRec): one-hot tables of one format are paired, smallest first, when
   their product table stays within ``merge_budget`` bytes; each merge saves one lookup a sample.
2. **On-chip**: the smallest tables (up to ``onchip_max_bytes`` each) go table-wise to URAM/BRAM
   while the card's on-chip share has room.
3. **Off-chip**: a table is cut into row pieces of equal lookups, as many as its bytes need (at the
   topology's mean fill) and its traffic needs (the mean bank time if every bank were used evenly),
   times a granule, so the pieces are small. Then every piece of every table, hottest first
   (longest processing time first), goes to the bank it leaves least above the even spread, in time
   or in bytes, whichever is further: hot and cold rows mix and the used banks stay even. A table's
   pieces stay on one host (table-row-wise) where it can hold them, else spread over hosts
   (row-wise); column-wise cuts are used where row-wise ones are forbidden. A table whose pieces do
   not all fit is placed last with pieces cut where banks' free space ends.

Constraints (per table name): ``card`` ``(host, card)``, ``sharding`` (one type or a list of the
allowed ones: ``table_wise``, ``row_wise``, ``column_wise``, ``table_row_wise``), ``fmt`` (storage
format), ``memory`` (``"hbm"``, ``"ddr"`` or ``"onchip"``), ``merge`` (False keeps a one-hot table
out of merges). ``reserve``: the share of every bank kept free.

Example::

    plan = shard(tables, Topology.uniform("u55c", 2, 2), {"t3": {"sharding": "row_wise"}, "t7": {"card": (0, 1)}})
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from offload.kernels.embedding import ROWWISE
from offload.plan.cost import shard_time
from offload.plan.plan import SHARDING_TYPES, Plan, Shard, TablePlan
from offload.plan.tables import Table, row_bytes, tables_of
from offload.plan.topology import ONCHIP, Topology, Unit
from offload.sim.errors import InputError, InputTypeError

__all__ = ["shard", "PlanError", "CONSTRAINT_KEYS"]

CONSTRAINT_KEYS = ("card", "sharding", "fmt", "memory", "merge")
# A table cut at all is cut into this many times the pieces its bytes or traffic need.
_GRANULE = 8
_MEMORY = {"hbm": "HBM", "ddr": "DDR", "onchip": ONCHIP}


class PlanError(InputError):
    """A table fits nowhere (the message names it, its bytes and the largest free space)."""


@dataclass
class _Item:
    table: Table  # the planned table (a merge's product table)
    constraint: Mapping[str, Any]
    parts: tuple[Table, ...] = ()

    @property
    def name(self) -> str:
        return self.table.name


def shard(tables: Any, topology: Topology, constraints: Mapping[str, Mapping[str, Any]] | None = None, *,
          batch_size: int = 512, reserve: float = 0.0, merge_budget: int = 1 << 20, onchip_max_bytes: int = 1 << 20,
          trace: Any = None) -> Plan:
    """Place every table of ``tables`` (:func:`tables_of` input) on ``topology``; see the module docstring.

    ``trace`` (an :class:`offload.plan.trace.IndexTrace`) replaces the tables' pooling factors and
    row-access histograms with the trace's. Raises :class:`PlanError` naming a table that fits nowhere.

    Example::

        plan = shard([Table("users", 10_000_000, 128, pooling_factor=4.0)], Topology.uniform("u55c", 1, 2))
    """
    if not isinstance(topology, Topology):
        raise InputTypeError(f"topology: expected offload.plan.Topology, got {type(topology).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size: an integer >= 1, got {batch_size!r}")
    if not 0 <= reserve < 1:
        raise InputError(f"reserve: a share of each bank in [0, 1), got {reserve!r}")
    tabs = tables_of(tables)
    if trace is not None:
        tabs = trace.apply(tabs)
    names = [t.name for t in tabs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"tables: duplicate names {dup}")
    cons = _check_constraints(constraints or {}, set(names), topology)
    tabs = [replace(t, fmt=cons[t.name]["fmt"]) if "fmt" in cons.get(t.name, {}) else t for t in tabs]
    items = _merge(tabs, cons, merge_budget)
    state = _State(topology, reserve, batch_size)
    placed: dict[str, tuple[str, list[Shard]]] = {}
    # On-chip: forced ones, then the smallest tables while there is room.
    for it in sorted(items, key=lambda i: (i.table.bytes, i.name)):
        mem = it.constraint.get("memory")
        if mem == "onchip" or (mem is None and it.table.bytes <= onchip_max_bytes and _allows(it, "table_wise")):
            got = state.place_whole(it, kinds=(ONCHIP,))
            if got is not None:
                placed[it.name] = ("table_wise", [got])
            elif mem == "onchip":
                raise state.nowhere(it, "on-chip memory", kinds=(ONCHIP,))
    rest = [it for it in items if it.name not in placed]
    total = sum(state.ref_cost(it) for it in rest)
    off = [i for i, u in enumerate(state.units) if u.kind != ONCHIP]
    target = total / max(len(off), 1)
    state.set_goals(target, sum(it.table.bytes for it in rest) / max(1, sum(state.cap[i] for i in off)))
    size = {it.name: max(state.ref_cost(it) / max(target, 1e-15), it.table.bytes / (state.fill * max(state.cap[i] for i in off) if off else 1))
            for it in rest}
    order = sorted(rest, key=lambda i: (-size[i.name], i.name))
    placed.update(_place_all(state, order, target))
    out = []
    for it in items:
        sharding, shards = placed[it.name]
        t = it.table
        shards = sorted(shards, key=lambda s: (s.col0, s.row0))
        out.append(TablePlan(t.name, t.rows, t.dim, t.fmt, sharding, t.pooling_factor, t.features, tuple(shards),
                             tuple(p.name for p in it.parts), tuple(p.rows for p in it.parts), tuple(p.dim for p in it.parts)))
    return Plan(topology, batch_size, tuple(out), reserve)


def _check_constraints(constraints, names: set[str], topo: Topology) -> dict[str, dict]:
    if not isinstance(constraints, Mapping):
        raise InputTypeError(f"constraints: a dict of table name -> dict, got {type(constraints).__name__}")
    out = {}
    for name, c in constraints.items():
        if name not in names:
            raise InputError(f"constraints: unknown table {name!r} (tables: {sorted(names)})")
        if not isinstance(c, Mapping):
            raise InputTypeError(f"constraints[{name!r}]: a dict, got {type(c).__name__}")
        bad = sorted(set(c) - set(CONSTRAINT_KEYS))
        if bad:
            raise InputError(f"constraints[{name!r}]: unknown keys {bad}; known: {list(CONSTRAINT_KEYS)}")
        c = dict(c)
        if "card" in c:
            w = c["card"]
            if not isinstance(w, (tuple, list)) or len(w) != 2:
                raise InputError(f"constraints[{name!r}]['card']: (host, card), got {w!r}")
            topo.card(int(w[0]), int(w[1]))
            c["card"] = (int(w[0]), int(w[1]))
        if "sharding" in c:
            s = c["sharding"]
            s = (s,) if isinstance(s, str) else tuple(s)
            bad = [x for x in s if x not in SHARDING_TYPES]
            if bad or not s:
                raise InputError(f"constraints[{name!r}]['sharding']: one or more of {list(SHARDING_TYPES)}, got {c['sharding']!r}")
            c["sharding"] = s
        if "memory" in c and c["memory"] not in _MEMORY:
            raise InputError(f"constraints[{name!r}]['memory']: one of {sorted(_MEMORY)}, got {c['memory']!r}")
        if "fmt" in c:
            row_bytes(1, c["fmt"])
        out[name] = c
    return out


def _allows(it: _Item, kind: str) -> bool:
    s = it.constraint.get("sharding")
    return s is None or kind in s


def _merge(tabs: Sequence[Table], cons: Mapping[str, Mapping], budget: int) -> list[_Item]:
    """Pair one-hot tables (smallest first) whose product table fits ``budget`` bytes."""
    items = {t.name: _Item(t, cons.get(t.name, {})) for t in tabs}
    cands = [t for t in tabs if t.one_hot and t.fmt != ROWWISE and len(t.features) == 1 and t.pooling_factor == 1
             and cons.get(t.name, {}).get("merge", True) and not (set(cons.get(t.name, {})) - {"merge", "fmt"})]
    by_fmt: dict[str, list[Table]] = {}
    for t in sorted(cands, key=lambda t: (t.rows, t.name)):
        by_fmt.setdefault(t.fmt, []).append(t)
    out_order = [t.name for t in tabs]
    merged: dict[str, _Item] = {}
    for fmt, ts in sorted(by_fmt.items()):
        used: set[str] = set()
        for i, a in enumerate(ts):
            if a.name in used:
                continue
            for b in ts[i + 1:]:
                if b.name in used:
                    continue
                rows, dim = a.rows * b.rows, a.dim + b.dim
                if rows * row_bytes(dim, fmt) <= budget:
                    t = Table(f"{a.name}*{b.name}", rows, dim, fmt, 1.0, one_hot=True, features=(f"{a.name}*{b.name}",))
                    merged[a.name] = _Item(t, {}, (a, b))
                    used |= {a.name, b.name}
                    del items[a.name], items[b.name]
                    break
    res: list[_Item] = []
    for n in out_order:
        if n in items:
            res.append(items[n])
        elif n in merged:
            res.append(merged[n])
    return res


class _State:
    def __init__(self, topo: Topology, reserve: float, batch: int) -> None:
        self.topo = topo
        self.batch = batch
        self.reserve = reserve
        self.units: list[Unit] = list(topo.units)
        self.free = [int(u.bytes * (1 - reserve)) for u in self.units]
        self.cap = list(self.free)
        self.time_goal, self.fill = 1.0, 1.0
        self.load = [0.0] * len(self.units)
        ref = [u for u in self.units if u.kind != ONCHIP] or self.units
        self.ref_unit = ref[0]

    def set_goals(self, time_goal: float, fill: float) -> None:
        """The mean bank time per batch and the mean fill share if every off-chip bank were used evenly."""
        self.time_goal = max(time_goal, 1e-15)
        self.fill = max(fill, 1e-9)

    def score(self, i: int, s: Shard) -> float:
        """How far bank ``i`` would sit above the even spread with ``s`` on it, in time or in
        bytes, whichever is further (two-resource best fit: hot and cold rows mix)."""
        used = self.cap[i] - self.free[i] + s.bytes
        return max((self.load[i] + s.time_s) / self.time_goal, used / (self.fill * self.cap[i]))

    def lookups(self, it: _Item, r0: int, r1: int) -> float:
        return self.batch * it.table.lookups_per_sample * it.table.mass(r0, r1)

    def ref_cost(self, it: _Item) -> float:
        return shard_time(self.ref_unit, self.lookups(it, 0, it.table.rows), it.table.row_bytes)

    def candidates(self, it: _Item, kinds: Sequence[str] | None, host: int | None = None) -> list[int]:
        pin = it.constraint.get("card")
        mem = it.constraint.get("memory")
        allowed = (_MEMORY[mem],) if mem else (kinds or ("HBM", "DDR"))
        return [i for i, u in enumerate(self.units)
                if u.kind in allowed and (pin is None or (u.host, u.card) == pin) and (host is None or u.host == host)]

    def _shard(self, i: int, it: _Item, r0: int, r1: int, c0: int, c1: int) -> Shard:
        u = self.units[i]
        rb = row_bytes(c1 - c0, it.table.fmt)
        lk = self.lookups(it, r0, r1)
        return Shard(u.host, u.card, u.kind, u.bank, r0, r1, c0, c1, (r1 - r0) * rb, shard_time(u, lk, rb), lk)

    def take(self, i: int, s: Shard) -> None:
        """Put ``s`` on bank ``i``: its bytes and its time per batch."""
        self.free[i] -= s.bytes
        self.load[i] += s.time_s

    def give_back(self, done: list[tuple[int, Shard]]) -> None:
        """Undo :meth:`take` for every ``(bank, shard)`` of a placement that did not complete."""
        for i, s in done:
            self.free[i] += s.bytes
            self.load[i] -= s.time_s

    def place_whole(self, it: _Item, kinds=None) -> Shard | None:
        got = self.place_pieces(it, [(0, it.table.rows, 0, it.table.dim)], self.candidates(it, kinds))
        return None if got is None else got[0]

    def best_bank(self, it: _Item, cand: list[int], taken: set[int], r0: int, r1: int, c0: int, c1: int) -> tuple[int, Shard] | None:
        """The bank of ``cand`` outside ``taken`` with room for rows ``[r0, r1)``, columns
        ``[c0, c1)`` of ``it`` that :meth:`score` ranks best (ties: the lowest bank), and its shard."""
        best = None
        for i in cand:
            if i in taken:
                continue
            s = self._shard(i, it, r0, r1, c0, c1)
            if s.bytes > self.free[i]:
                continue
            key = (self.score(i, s), i)
            if best is None or key < best[0]:
                best = (key, i, s)
        return None if best is None else (best[1], best[2])

    def place_pieces(self, it: _Item, pieces, cand: list[int]) -> list[Shard] | None:
        """Each piece (rows, cols) on its own candidate bank that holds it, the one :meth:`score`
        ranks best; all or nothing."""
        done: list[tuple[int, Shard]] = []
        taken: set[int] = set()
        for (r0, r1, c0, c1) in pieces:
            got = self.best_bank(it, cand, taken, r0, r1, c0, c1)
            if got is None:
                self.give_back(done)
                return None
            i, s = got
            self.take(i, s)
            taken.add(i)
            done.append((i, s))
        return [s for _, s in done]

    def place_rows(self, it: _Item, k: int, cand: list[int]) -> list[Shard] | None:
        """Row shards of about ``1/k`` of the table's lookups each, in row order, each on its own
        bank (ranked by :meth:`score`) and cut short where that bank's free space ends, so
        fragmented banks still fill; all or nothing."""
        t = it.table
        rb = t.row_bytes
        if sum(self.free[i] // rb for i in cand) < t.rows:
            return None
        k = min(k, len(cand))  # one shard a bank
        done: list[tuple[int, Shard]] = []
        taken: set[int] = set()
        r0 = 0
        while r0 < t.rows:
            want = _cut(t, r0, 1.0 / k)
            best = None
            for i in cand:
                if i in taken or self.free[i] < rb:
                    continue
                r1 = min(want, r0 + self.free[i] // rb)
                s = self._shard(i, it, r0, r1, 0, t.dim)
                key = (self.score(i, s), -(r1 - r0), i)
                if best is None or key < best[0]:
                    best = (key, i, s)
            if best is None:
                self.give_back(done)
                return None
            _, i, s = best
            self.take(i, s)
            taken.add(i)
            done.append((i, s))
            r0 = s.row1
        return [s for _, s in done]

    def nowhere(self, it: _Item, what: str, kinds=None) -> PlanError:
        cand = self.candidates(it, kinds) or list(range(len(self.units)))
        i = max(cand, key=lambda j: (self.free[j], -j))
        pin = it.constraint.get("card")
        return PlanError(f"table {it.name!r} ({it.table.bytes} bytes) fits nowhere in {what}"
                         f"{'' if pin is None else f' of card {pin}'}: the largest free space is {self.free[i]} bytes "
                         f"({self.units[i].label})")


def _cut(t: Table, r0: int, share: float) -> int:
    """The row ``r1 > r0`` where rows ``[r0, r1)`` hold ``share`` of the lookups (rows without an access histogram)."""
    if t.access is None:
        return min(t.rows, r0 + max(1, math.ceil(share * t.rows - 1e-9)))
    goal = t.mass(0, r0) + share
    lo, hi = r0 + 1, t.rows
    while lo < hi:  # bisection on the cumulative mass: deterministic and exact in rows
        mid = (lo + hi) // 2
        if t.mass(0, mid) < goal - 1e-12:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _count(state: "_State", it: _Item, target: float, cand: list[int]) -> int:
    """How many row pieces: enough for the bytes (at the topology's mean fill) and for the traffic
    (the mean bank time, times a granule so the greedy fill can even banks out)."""
    t = it.table
    cap = max(state.units[i].bytes for i in cand)
    k_bytes = math.ceil(t.bytes / max(1.0, cap * (1 - state.reserve) * state.fill))
    k_load = math.ceil(state.ref_cost(it) / target) * _GRANULE if target > 0 else 1
    return max(1, k_bytes, k_load)


def _opening(state: _State, it: _Item, target: float) -> tuple[list[int], int, bool]:
    """What :func:`_pieces` and :func:`_place` start from: the banks ``it`` may take (a
    :class:`PlanError` when there are none), how many row pieces it needs (:func:`_count`), and
    whether it goes whole (table-wise: one piece is enough, or table-wise is the only type allowed)."""
    cand = state.candidates(it, None)
    if not cand:
        raise state.nowhere(it, "the allowed memories")
    k = _count(state, it, target, cand)
    return cand, k, _allows(it, "table_wise") and (k == 1 or it.constraint.get("sharding") == ("table_wise",))


def _pieces(state: _State, it: _Item, target: float) -> tuple[list[tuple[int, int, int, int]], list[int]]:
    """The row pieces (equal lookups) a table is cut into up front, and the banks they may take:
    one host's where that host can hold the table (table-row-wise), every allowed bank otherwise."""
    t = it.table
    cand, k, whole = _opening(state, it, target)
    if whole:
        return [(0, t.rows, 0, t.dim)], cand
    if t.rows < 2 or not (_allows(it, "row_wise") or _allows(it, "table_row_wise")):
        return [], cand
    requested = it.constraint.get("sharding")
    if _allows(it, "table_row_wise") or requested is None:
        hosts = sorted({state.units[i].host for i in cand})
        room = {h: sum(state.free[i] for i in cand if state.units[i].host == h) for h in hosts}
        banks = {h: sum(state.units[i].host == h for i in cand) for h in hosts}
        # One host holds the table when it has the room and a bank for every piece its traffic needs.
        fits = [h for h in hosts if room[h] >= t.bytes * 1.25 and banks[h] >= k]
        if fits:
            h = max(fits, key=lambda h: (room[h], -h))
            cand = [i for i in cand if state.units[i].host == h]
        elif not _allows(it, "row_wise"):
            return [], cand
    k = min(k, len(cand), t.rows)
    cuts = [0]
    for _ in range(k - 1):
        cuts.append(_cut(t, cuts[-1], 1.0 / k))
        if cuts[-1] >= t.rows:
            break
    if cuts[-1] < t.rows:
        cuts.append(t.rows)
    return [(cuts[j], cuts[j + 1], 0, t.dim) for j in range(len(cuts) - 1) if cuts[j + 1] > cuts[j]], cand


def _place_all(state: _State, items: list[_Item], target: float) -> dict[str, tuple[str, list[Shard]]]:
    """Every piece of every table, hottest first, on the bank it unbalances least (longest
    processing time first over pieces, not tables); a table whose pieces do not all fit is taken
    back and placed on its own afterwards, cut where banks' free space ends (:func:`_place`)."""
    cut = {it.name: _pieces(state, it, target) for it in items}
    pieces = [(it, p) for it in items for p in cut[it.name][0]]
    ref = state.ref_unit
    pieces.sort(key=lambda ip: (-shard_time(ref, state.lookups(ip[0], ip[1][0], ip[1][1]), ip[0].table.row_bytes),
                                -(ip[1][1] - ip[1][0]), ip[0].name, ip[1][0]))
    got: dict[str, list[tuple[int, Shard]]] = {}
    failed: set[str] = {it.name for it in items if not cut[it.name][0]}
    for it, (r0, r1, c0, c1) in pieces:
        if it.name in failed:
            continue
        best = state.best_bank(it, cut[it.name][1], {i for i, _ in got.get(it.name, [])}, r0, r1, c0, c1)
        if best is None:
            failed.add(it.name)
            state.give_back(got.pop(it.name, []))
            continue
        state.take(*best)
        got.setdefault(it.name, []).append(best)
    out = {}
    requested = {it.name: it.constraint.get("sharding") for it in items}
    for name, ss in got.items():
        shards = [s for _, s in ss]
        out[name] = (_row_label(requested[name], shards), shards)
    for it in items:
        if it.name in failed:
            out[it.name] = _place(state, it, target)
    return out


def _place(state: _State, it: _Item, target: float) -> tuple[str, list[Shard]]:
    t = it.table
    cand, k, whole = _opening(state, it, target)
    if whole:
        got = state.place_whole(it)
        if got is not None:
            return "table_wise", [got]
        k = 2
    requested = it.constraint.get("sharding")
    if t.rows >= 2 and (_allows(it, "row_wise") or _allows(it, "table_row_wise")):
        if _allows(it, "table_row_wise") or requested is None:
            hosts = sorted({state.units[i].host for i in cand},
                           key=lambda h: (sum(state.load[i] for i in cand if state.units[i].host == h), h))
            for h in hosts:
                for kk in _fewer(k):
                    got = state.place_rows(it, kk, [i for i in cand if state.units[i].host == h])
                    if got is not None:
                        return _row_label(requested, got), got
        if _allows(it, "row_wise"):
            for kk in _fewer(k):
                got = state.place_rows(it, kk, cand)
                if got is not None:
                    return _row_label(requested, got), got
    if _allows(it, "column_wise") and t.dim >= 2:
        kk = min(max(2, k), t.dim, len(cand))
        while True:
            cuts = [t.dim * j // kk for j in range(kk + 1)]
            got = state.place_pieces(it, [(0, t.rows, cuts[j], cuts[j + 1]) for j in range(kk)], cand)
            if got is not None:
                return "column_wise", got
            if kk >= min(t.dim, len(cand)):
                break
            kk = min(2 * kk, t.dim, len(cand))
    allowed = requested or SHARDING_TYPES
    raise state.nowhere(it, f"{'/'.join(allowed)} placements")


def _fewer(k: int) -> list[int]:
    """k, k/2, ..., 1: fewer, larger pieces, for when small banks run out before the rows do."""
    out = [k]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


def _row_label(requested, shards: list[Shard]) -> str:
    if len(shards) == 1:
        return "table_wise"
    if requested is not None and len(requested) == 1:
        return requested[0]
    hosts = {s.host for s in shards}
    cards = {s.where for s in shards}
    return "table_row_wise" if len(hosts) == 1 and len(cards) > 1 else "row_wise"

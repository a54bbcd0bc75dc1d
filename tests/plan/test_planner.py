"""The planner: every table placed or named in an error, constraints honoured, capacity never
exceeded, the same inputs the same bytes, and the JSON round trip exact."""

from __future__ import annotations

import pytest

import offload.plan as P
from offload.plan.plan import Plan
from offload.sim.errors import InputError, OffloadError


def _tables():
    return [P.Table("big", 3_000_000, 64, "int8_rowwise", pooling_factor=20.0),
            P.Table("mid", 200_000, 64, pooling_factor=4.0),
            P.Table("hot", 50_000, 32, pooling_factor=60.0),
            P.Table("a", 6, 8, one_hot=True), P.Table("b", 10, 8, one_hot=True), P.Table("c", 40_000, 16, one_hot=True)]


def _covers(tp):
    # Row and column ranges tile the table exactly once.
    cells = sorted((s.row0, s.row1, s.col0, s.col1) for s in tp.shards)
    area = sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in cells)
    return area == tp.rows * tp.dim and all(0 <= r0 < r1 <= tp.rows and 0 <= c0 < c1 <= tp.dim for r0, r1, c0, c1 in cells)


def test_every_table_placed_within_capacity_and_deterministic(tmp_path):
    topo = P.Topology.uniform("u50", hosts=2, cards_per_host=2)
    plan = P.shard(_tables(), topo, batch_size=256)
    names = {n for t in plan.tables for n in (t.parts or (t.name,))}
    assert names == {t.name for t in _tables()}
    for t in plan.tables:
        assert _covers(t), t.name
    units = {u.key: u for u in topo.units}
    for key, used in plan.unit_bytes().items():
        assert used <= units[key].bytes
    again = P.shard(_tables(), topo, batch_size=256)
    assert again.to_json() == plan.to_json()
    plan.to_json(tmp_path / "p.json")
    back = Plan.from_json(tmp_path / "p.json")
    assert back.to_json() == plan.to_json()
    assert "big" in plan.explain() and "HBM" in plan.explain()


def test_merge_of_tiny_one_hot_tables_lowers_lookups():
    plan = P.shard(_tables(), P.Topology.uniform("u55c"))
    merged = [t for t in plan.tables if t.parts]
    assert [t.parts for t in merged] == [("a", "b")]
    assert merged[0].rows == 60 and merged[0].dim == 16
    assert plan.table("a") is merged[0]
    none = P.shard(_tables(), P.Topology.uniform("u55c"), {"a": {"merge": False}})
    assert not any(t.parts for t in none.tables)


def test_constraints_pin_sharding_and_fmt():
    topo = P.Topology.uniform("u55c", hosts=2, cards_per_host=2)
    plan = P.shard(_tables(), topo, {"mid": {"card": (1, 1)}, "big": {"sharding": "row_wise"},
                                     "hot": {"fmt": "ap_fixed<8,3>", "sharding": "column_wise"}})
    assert {s.where for s in plan.table("mid").shards} == {(1, 1)}
    assert plan.table("big").sharding == "row_wise" and len(plan.table("big").shards) > 1
    hot = plan.table("hot")
    assert hot.fmt == "ap_fixed<8,3>" and hot.sharding == "column_wise"
    assert all(s.row0 == 0 and s.row1 == hot.rows for s in hot.shards)
    tw = P.shard(_tables(), topo, {"hot": {"sharding": "table_wise"}})
    assert len(tw.table("hot").shards) == 1


def test_a_table_that_fits_nowhere_is_named_with_its_bytes_and_the_largest_free_space():
    huge = P.Table("huge", 100_000_000, 64, "ap_fixed<16,6>")  # 12.8 GB against one 8 GB U50
    with pytest.raises(P.PlanError) as e:
        P.shard([huge], P.Topology.uniform("u50"))
    msg = str(e.value)
    assert "'huge'" in msg and str(huge.bytes) in msg and "largest free space is 268435456 bytes" in msg
    assert isinstance(e.value, OffloadError) and isinstance(e.value, ValueError)
    with pytest.raises(P.PlanError, match="'wide'"):  # table-wise only, larger than any channel
        P.shard([P.Table("wide", 5_000_000, 64)], P.Topology.uniform("u55c"), {"wide": {"sharding": "table_wise"}})


def test_bad_constraints_are_refused_naming_the_field():
    topo = P.Topology.uniform("u55c")
    with pytest.raises(InputError, match="unknown table 'nope'"):
        P.shard(_tables(), topo, {"nope": {"card": (0, 0)}})
    with pytest.raises(InputError, match="no such card"):
        P.shard(_tables(), topo, {"mid": {"card": (0, 3)}})
    with pytest.raises(InputError, match="sharding"):
        P.shard(_tables(), topo, {"mid": {"sharding": "diagonal"}})
    with pytest.raises(InputError, match="duplicate"):
        P.shard([P.Table("x", 5, 4), P.Table("x", 6, 4)], topo)


def test_reserve_keeps_bank_space_free():
    topo = P.Topology.uniform("u50")
    t = [P.Table("t", 1_000_000, 128, "ap_fixed<16,6>")]  # 256 MB: one U50 channel exactly
    assert len(P.shard(t, topo).table("t").shards) >= 1
    plan = P.shard(t, topo, reserve=0.5)
    units = {u.key: u for u in topo.units}
    for key, used in plan.unit_bytes().items():
        assert used <= units[key].bytes * 0.5

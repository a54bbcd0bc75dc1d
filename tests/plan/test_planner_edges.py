"""Planner edges the catalogue tests do not reach: the reserve at its value, row pieces of equal
traffic (a hot first row, a tail nobody reads), a hot table on every bank, the fall-back that cuts
rows where fragmented banks' free space ends, and column-wise cuts down to two columns."""

from __future__ import annotations

import pytest

import offload.plan as P
from offload.sim.errors import InputError

U50 = P.Topology.uniform("u50")  # one card: 32 HBM pseudo-channels of 256 MiB
HBM = [u for u in U50.units if u.kind == "HBM"]
RB = P.Table("x", 1, 64).row_bytes


def _within_capacity(plan):
    cap = {u.key: u.bytes for u in plan.topology.units}
    for key, used in plan.unit_bytes().items():
        assert used <= cap[key], key


def test_the_reserve_keeps_its_share_of_every_bank_free():
    room = int(HBM[0].bytes * (1 - 0.5))
    fits = P.Table("t", room // RB, 64)  # the most rows one half-reserved channel holds
    over = P.Table("t", room // RB + 1, 64)
    one = {"t": {"sharding": "table_wise"}}
    plan = P.shard([fits], U50, one, reserve=0.5)
    assert plan.table("t").shards[0].bytes <= room
    with pytest.raises(P.PlanError, match="'t'"):
        P.shard([over], U50, one, reserve=0.5)
    P.shard([over], U50, one, reserve=0.0)  # the same table without a reserve fits


def _row_pieces(access, rows=64):
    t = P.Table("h", rows, 64, access=tuple(access), pooling_factor=10.0)
    plan = P.shard([t], U50, {"h": {"sharding": "row_wise", "memory": "hbm"}})
    shards = sorted(plan.table("h").shards, key=lambda s: s.row0)
    assert shards[0].row0 == 0 and shards[-1].row1 == rows
    assert all(a.row1 == b.row0 for a, b in zip(shards, shards[1:]))
    return shards


def test_row_pieces_after_a_hot_first_row_hold_equal_traffic():
    # Row 0 takes half the lookups, the other 63 rows share the rest: after the hot row, every
    # piece holds the same traffic to within one row's, and the last holds no more than the others.
    shards = _row_pieces([63.0] + [1.0] * 63)
    row = shards[0].lookups / 63  # one cold row's lookups
    assert shards[0].row1 == 1
    middle = [s.lookups for s in shards[1:-1]]
    assert len(middle) >= 2 and max(middle) - min(middle) <= row * (1 + 1e-9)
    assert shards[-1].lookups <= max(middle) + 1e-9


def test_a_tail_nobody_reads_joins_the_last_piece():
    # 32 read rows, 32 never read, 32 channels: one read row a channel, the tail with the last.
    shards = _row_pieces([1.0] * 32 + [0.0] * 32)
    assert len(shards) == len(HBM) and len({s.bank for s in shards}) == len(HBM)
    assert [s.row1 - s.row0 for s in shards] == [1] * 31 + [33]
    assert len({round(s.lookups, 9) for s in shards}) == 1


def test_a_table_hot_enough_for_every_bank_is_cut_into_one_piece_a_bank():
    t = P.Table("hot", 32 * 4096, 64, pooling_factor=50.0)
    plan = P.shard([t], U50, {"hot": {"sharding": "row_wise", "memory": "hbm"}})
    shards = plan.table("hot").shards
    assert len(shards) == len(HBM) and len({s.bank for s in shards}) == len(HBM)
    assert {s.row1 - s.row0 for s in shards} == {4096}


def test_rows_that_fit_only_fragmented_banks_are_cut_where_their_free_space_ends():
    # 32 hot table-wise tables leave each channel 56 MiB; a cold 1.5 GiB row-wise table's equal
    # pieces are larger than that, so it is cut where each channel's free space ends.
    fill = [P.Table(f"f{i:02d}", 200 * 2**20 // RB, 64, pooling_factor=100.0) for i in range(32)]
    big = P.Table("big", 1500 * 2**20 // RB, 64, pooling_factor=0.01)
    cons = {f.name: {"sharding": "table_wise"} for f in fill} | {"big": {"sharding": "row_wise"}}
    plan = P.shard(fill + [big], U50, cons)
    _within_capacity(plan)
    shards = sorted(plan.table("big").shards, key=lambda s: s.row0)
    assert shards[0].row0 == 0 and shards[-1].row1 == big.rows and all(a.row1 == b.row0 for a, b in zip(shards, shards[1:]))
    assert len({s.bank for s in shards}) == len(shards) and max(s.bytes for s in shards) <= 56 * 2**20
    assert all(s.row1 > s.row0 for s in shards)  # no empty piece after the last row


def test_column_wise_cuts_reach_two_columns_and_refuse_one():
    two = P.shard([P.Table("c", 1000, 2)], U50, {"c": {"sharding": "column_wise", "memory": "hbm"}}).table("c")
    assert two.sharding == "column_wise" and sorted((s.col0, s.col1) for s in two.shards) == [(0, 1), (1, 2)]
    with pytest.raises(P.PlanError, match="'c'.*column_wise placements"):
        P.shard([P.Table("c", 1000, 1)], U50, {"c": {"sharding": "column_wise", "memory": "hbm"}})


def test_tables_up_to_one_mib_go_on_chip_by_default():
    small = P.Table("s", (1 << 20) // RB, 64)  # the largest whole-row table within 1 MiB
    big = P.Table("b", (1 << 20) // RB + 1, 64)
    plan = P.shard([small, big], U50)
    assert [s.kind for s in plan.table("s").shards] == ["onchip"]
    assert plan.table("s").sharding == "table_wise"
    assert all(s.kind == "HBM" for s in plan.table("b").shards)


def test_a_table_one_piece_holds_is_labelled_table_wise():
    # No traffic anywhere: pieces follow bytes only, and the small table needs one.
    plan = P.shard([P.Table("y", 30_000_000, 64, pooling_factor=0.0), P.Table("z", 100_000, 64, pooling_factor=0.0)], U50)
    z = plan.table("z")
    assert len(z.shards) == 1 and z.sharding == "table_wise"
    # The large one needs as many pieces as its bytes at the mean fill (45 %): every channel.
    assert len({s.bank for s in plan.table("y").shards}) == len(HBM)


def test_a_table_spread_over_two_hosts_is_labelled_row_wise():
    topo = P.Topology.uniform("u50", hosts=2, cards_per_host=2)
    t = P.shard([P.Table("t", 2 * 2**30 // RB, 64, pooling_factor=50.0)], topo).table("t")
    assert {s.host for s in t.shards} == {0, 1} and t.sharding == "row_wise"


def test_a_table_over_two_cards_of_one_host_is_labelled_table_row_wise():
    topo = P.Topology.uniform("u50", hosts=1, cards_per_host=2)
    t = P.shard([P.Table("t", 2 * 2**30 // RB, 64, pooling_factor=50.0)], topo).table("t")
    assert {s.where for s in t.shards} == {(0, 0), (0, 1)} and t.sharding == "table_row_wise"


def test_a_card_pin_keeps_host_and_card_apart():
    topo = P.Topology.uniform("u50", hosts=2, cards_per_host=2)
    plan = P.shard([P.Table("m", 200_000, 64, pooling_factor=4.0), P.Table("n", 200_000, 64)], topo,
                   {"m": {"card": (1, 0)}, "n": {"card": (0, 1)}})
    assert {s.where for s in plan.table("m").shards} == {(1, 0)}
    assert {s.where for s in plan.table("n").shards} == {(0, 1)}


def test_each_table_goes_to_the_bank_it_unbalances_least():
    # Two hot table-wise tables on an empty card: the first takes bank 0 (every bank ties, the
    # lowest wins), the second the next empty one, not the bank the first already loads.
    tabs = [P.Table("a", 1000, 64, pooling_factor=9.0), P.Table("b", 1000, 64, pooling_factor=8.0)]
    cons = {n: {"sharding": "table_wise", "memory": "hbm"} for n in ("a", "b")}
    plan = P.shard(tabs, U50, cons, onchip_max_bytes=0)
    assert [(s.kind, s.bank) for s in plan.table("a").shards] == [("HBM", 0)]
    assert [(s.kind, s.bank) for s in plan.table("b").shards] == [("HBM", 1)]


def test_a_table_without_a_quarter_of_headroom_on_a_host_spreads_over_hosts():
    # Each table is 85 % of one host's HBM: a host holds it only with 25 % room to spare, so both
    # spread over the two hosts rather than crowding onto the first.
    topo = P.Topology.uniform("u50", hosts=2, cards_per_host=1)
    rows = int(0.85 * 32 * HBM[0].bytes) // RB
    tabs = [P.Table("a", rows, 64, pooling_factor=0.0), P.Table("b", rows, 64, pooling_factor=0.0)]
    plan = P.shard(tabs, topo)
    _within_capacity(plan)
    for n in ("a", "b"):
        assert {s.host for s in plan.table(n).shards} == {0, 1} and plan.table(n).sharding == "row_wise", n


def test_a_table_placed_after_one_that_failed_the_first_pass_is_still_placed():
    # 'big' fails the piece pass (fragmented banks) and is placed again afterwards; 'z', read by
    # nobody, comes after big's pieces in the hottest-first order and must be placed all the same.
    fill = [P.Table(f"f{i:02d}", 200 * 2**20 // RB, 64, pooling_factor=100.0) for i in range(32)]
    big = P.Table("big", 1500 * 2**20 // RB, 64, pooling_factor=0.01)
    z = P.Table("z", 2 * 2**20 // RB, 64, pooling_factor=0.0)
    cons = {f.name: {"sharding": "table_wise"} for f in fill} | {"big": {"sharding": "row_wise"}}
    plan = P.shard(fill + [big, z], U50, cons, onchip_max_bytes=0)
    _within_capacity(plan)
    assert sum(s.row1 - s.row0 for s in plan.table("z").shards) == z.rows
    assert sum(s.row1 - s.row0 for s in plan.table("big").shards) == big.rows


def test_pieces_go_hottest_first():
    # Five whole tables on a U250's four DDR banks, the hottest with the fewest rows, and a cold
    # table holding nearly all the bytes (so the hot ones' bytes weigh nothing beside their time).
    # Hottest first (5, 4, 3, 3 one a bank, the last 3 on a 3) the busiest bank serves 6 lookups a
    # sample; in row order (3, 3, 3, 4, then 5 on a 3) it would serve 8.
    topo = P.Topology.uniform("u250", onchip_share=0.0)
    pools = {"p5": (5.0, 1000), "p4": (4.0, 1001), "p3a": (3.0, 1002), "p3b": (3.0, 1003), "p3c": (3.0, 1004)}
    tabs = [P.Table(n, rows, 64, pooling_factor=p) for n, (p, rows) in pools.items()]
    cold = P.Table("cold", 5_000_000, 64, pooling_factor=0.0)
    plan = P.shard(tabs + [cold], topo, {n: {"sharding": "table_wise"} for n in pools})
    per_bank: dict = {}
    for n in pools:
        (s,) = plan.table(n).shards
        per_bank[s.unit] = per_bank.get(s.unit, 0.0) + pools[n][0]
    assert sorted(per_bank.values()) == [3.0, 4.0, 5.0, 6.0]


def test_a_hot_table_is_cut_for_its_traffic_not_only_its_bytes():
    # 'hot' fits one channel many times over, but takes all the traffic: cut for the mean bank
    # time, it spreads over every channel; 'cold' (nobody reads it) holds the bytes.
    hot = P.Table("hot", 16384, 64, pooling_factor=50.0)
    cold = P.Table("cold", 2**30 // RB, 64, pooling_factor=0.0)
    plan = P.shard([hot, cold], U50, onchip_max_bytes=0)
    assert len({s.bank for s in plan.table("hot").shards}) == len(HBM)


def test_duplicate_names_are_named_and_only_they():
    with pytest.raises(InputError, match=r"duplicate names \['x'\]"):
        P.shard([P.Table("x", 5, 4), P.Table("y", 5, 4), P.Table("x", 6, 4)], U50)


def test_batch_size_one_is_the_smallest_accepted():
    assert P.shard([P.Table("t", 100, 8)], U50, batch_size=1).batch_size == 1
    with pytest.raises(InputError, match="batch_size"):
        P.shard([P.Table("t", 100, 8)], U50, batch_size=0)


def test_row_pieces_of_a_long_table_end_at_its_last_row():
    # The hot first bucket uses up the share of a piece early, so the cuts reach the last row
    # before the piece count runs out; past 256 rows (where Python's small ints end) as well.
    for rows in (64, 640):
        shards = _row_pieces([63.0] + [1.0] * 63, rows=rows)
        assert shards[-1].row1 == rows and all(s.row1 <= rows for s in shards)


def _fragmented(topo, fills, big_cons):
    # Hot table-wise tables leave each channel 56 MiB; a cold 1.5 GiB table's pieces do not fit
    # that, so it fails the first pass and is placed afterwards, cut where free space ends.
    big = P.Table("big", 1500 * 2**20 // RB, 64, pooling_factor=0.01)
    cons = {f.name: c for f, c in fills} | {"big": big_cons}
    plan = P.shard([f for f, _ in fills] + [big], topo, cons, onchip_max_bytes=0)
    _within_capacity(plan)
    shards = plan.table("big").shards
    assert sum(s.row1 - s.row0 for s in shards) == big.rows
    return plan.table("big")


def test_the_fall_back_keeps_a_table_row_wise_table_on_one_host():
    fills = [(P.Table(f"f{i:02d}", 200 * 2**20 // RB, 64, pooling_factor=100.0), {"sharding": "table_wise"}) for i in range(32)]
    big = _fragmented(U50, fills, {"sharding": "table_row_wise"})
    assert big.sharding == "table_row_wise" and {s.host for s in big.shards} == {0}


def test_the_fall_back_puts_rows_on_the_least_busy_host():
    # Both hosts fragmented alike, host 1's tables colder: the fall-back starts with host 1 and
    # finds room there.
    topo = P.Topology.uniform("u50", hosts=2, cards_per_host=1)
    fills = [(P.Table(f"h{h}f{i:02d}", 200 * 2**20 // RB, 64, pooling_factor=100.0 if h == 0 else 10.0),
              {"sharding": "table_wise", "card": (h, 0)}) for h in (0, 1) for i in range(32)]
    big = _fragmented(topo, fills, {})
    assert {s.host for s in big.shards} == {1}


def test_a_bank_in_use_can_beat_an_empty_one_on_bytes():
    # U280: 32 HBM channels of 256 MiB and two 16 GiB DDR banks. For three small hot tables an
    # empty channel's bytes term (its share against the even fill) is far above a DDR bank's time
    # term, even a DDR bank already serving a table, so the third table joins one.
    topo = P.Topology.uniform("u280", onchip_share=0.0)
    tabs = [P.Table(f"t{i}", 1000, 64, pooling_factor=3.0) for i in range(3)]
    plan = P.shard(tabs, topo, {t.name: {"sharding": "table_wise"} for t in tabs})
    assert [s.kind for t in plan.tables for s in t.shards] == ["DDR"] * 3
    assert sorted(s.bank for t in plan.tables for s in t.shards) == [0, 0, 1]


_FILLS = [(P.Table(f"f{i:02d}", 200 * 2**20 // RB, 64, pooling_factor=100.0), {"sharding": "table_wise"}) for i in range(32)]
_FREE_ROWS = (HBM[0].bytes - 200 * 2**20) // RB  # what a fill leaves in its channel: 56 MiB


def _after_fills(table, cons, **kw):
    plan = P.shard([f for f, _ in _FILLS] + [table], U50, {f.name: c for f, c in _FILLS} | {table.name: cons}, onchip_max_bytes=0, **kw)
    _within_capacity(plan)
    return plan.table(table.name)


def test_rows_that_exactly_fill_every_bank_left_are_placed():
    exact = _after_fills(P.Table("x", 32 * _FREE_ROWS, 64, pooling_factor=0.01), {"sharding": "row_wise"})
    assert sum(s.row1 - s.row0 for s in exact.shards) == 32 * _FREE_ROWS and len(exact.shards) == 32
    with pytest.raises(P.PlanError, match="'x'"):
        _after_fills(P.Table("x", 32 * _FREE_ROWS + 1, 64, pooling_factor=0.01), {"sharding": "row_wise"})


def test_the_fall_back_cuts_a_table_no_bank_holds_whole_in_two():
    # 100 MiB needs one piece for its bytes, but no channel has 100 MiB left: the whole-table try
    # fails again in the fall-back, which then cuts it in two halves that fit.
    mid = _after_fills(P.Table("mid", 100 * 2**20 // RB, 64, pooling_factor=0.0), {})
    assert len(mid.shards) == 2 and mid.sharding == "row_wise"


def test_column_cuts_double_until_the_pieces_fit():
    # 300 MiB column-wise: halves (150 MiB) and quarters (75) do not fit 56 MiB, eighths (37.5) do.
    col = _after_fills(P.Table("c", 300 * 2**20 // RB, 64, pooling_factor=0.0), {"sharding": "column_wise"})
    assert col.sharding == "column_wise" and sorted(s.col1 - s.col0 for s in col.shards) == [8] * 8


def test_banks_are_counted_per_host_on_an_uneven_topology():
    # Host 0 has one card (32 channels), host 1 two (64). 'a' takes 5 % of the traffic, so it is
    # cut into 40 pieces: only host 1 has a bank for each, and it holds them all.
    topo = P.Topology(hosts=[["u50"], ["u50", "u50"]], onchip_share=0.0)
    a = P.Table("a", 4000, 64, pooling_factor=5.0)
    b = P.Table("b", 2**20, 64, pooling_factor=95.0)
    plan = P.shard([a, b], topo)
    assert len(plan.table("a").shards) == 40 and {s.host for s in plan.table("a").shards} == {1}


def test_tables_that_failed_the_first_pass_are_placed_again_largest_first():
    # Both fail the first pass (56 MiB left a channel). The larger, column-wise, goes first: its 32
    # column pieces of 31.25 MiB need 32 channels with that much room; the row-wise one then fills
    # what is left. The other way round (or by name), the rows would leave too few such channels.
    topo_tabs = [f for f, _ in _FILLS]
    col = P.Table("zcol", 1000 * 2**20 // RB, 64, pooling_factor=0.0)
    rows = P.Table("arows", 700 * 2**20 // RB, 64, pooling_factor=0.0)
    cons = {f.name: c for f, c in _FILLS} | {"zcol": {"sharding": "column_wise"}, "arows": {"sharding": "row_wise"}}
    plan = P.shard(topo_tabs + [rows, col], U50, cons, onchip_max_bytes=0)
    _within_capacity(plan)
    assert plan.table("zcol").sharding == "column_wise" and len(plan.table("zcol").shards) == 32
    assert sum(s.row1 - s.row0 for s in plan.table("arows").shards) == rows.rows

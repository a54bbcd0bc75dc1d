"""The planner's cost model on hand-worked plans: a shard's time is its lookups times one read's,
a card's bytes are the kernel ABI's (int64 indices, one offset per bag and one more; an int64
partial per output column and a count per bag), and a card's time adds its busiest bank, PCIe
both ways, the transfer latencies and the launch, plus the network round trip off host 0."""

from __future__ import annotations

import pytest

import offload.plan as P
from offload.hls.cards import KERNEL_LAUNCH_S, PCIE_TRANSFER_LATENCY_S
from offload.plan.cost import card_io_bytes, card_time, shard_time

B = 4


def test_a_shards_time_is_its_lookups_times_one_reads():
    u = P.Topology.uniform("u50").units[0]
    one = u.lookup_s(128)
    assert one > 0 and shard_time(u, 1, 128) == one
    assert shard_time(u, 0, 128) == 0.0
    assert shard_time(u, 10, 128) == pytest.approx(10 * one, rel=1e-12)


def _plan(topo, cons, dims=(16, 8)):
    tables = [P.Table("a", 100_000, dims[0], pooling_factor=3.0), P.Table("b", 100_000, dims[1], pooling_factor=5.0)]
    return P.shard(tables, topo, cons, batch_size=B)


def test_card_bytes_count_only_that_cards_shards():
    topo = P.Topology.uniform("u50", hosts=2, cards_per_host=1)
    plan = _plan(topo, {"a": {"card": (0, 0), "sharding": "table_wise", "memory": "hbm"},
                        "b": {"card": (1, 0), "sharding": "table_wise", "memory": "hbm"}})
    # card (0, 0): 12 ids and 4 bag offsets (+1) in; 16 partial columns and a count, per sample, out
    assert card_io_bytes(plan, (0, 0)) == (8 * (B * 3 + B + 1), 8 * B * (16 + 1))
    assert card_io_bytes(plan, (1, 0)) == (8 * (B * 5 + B + 1), 8 * B * (8 + 1))


def test_column_pieces_on_one_card_each_send_their_columns_and_a_count():
    plan = _plan(P.Topology.uniform("u50"), {"a": {"sharding": "column_wise", "memory": "hbm"},
                                             "b": {"card": (0, 0), "sharding": "table_wise", "memory": "hbm"}})
    pieces = {(s.col0, s.col1) for s in plan.table("a").shards}
    assert len(pieces) >= 2 and sum(c1 - c0 for c0, c1 in pieces) == 16
    n = len(pieces)  # every piece is looked up by each bag: its ids, its offsets, its count
    bin_, bout = card_io_bytes(plan, (0, 0))
    assert bin_ == 8 * (B * 3 * n + B * 5 + (n + 1) * B + 1)
    assert bout == 8 * B * (16 + n + 8 + 1)


def test_a_cards_time_adds_its_busiest_bank_pcie_launch_and_the_network_off_host_0():
    topo = P.Topology.uniform("u50", hosts=2, cards_per_host=1)
    same = {"sharding": "table_wise", "memory": "hbm"}
    plan = _plan(topo, {"a": {"card": (0, 0), **same}, "b": {"card": (1, 0), **same}}, dims=(16, 16))
    times = plan.unit_times()
    for where, lookups in (((0, 0), B * 3), ((1, 0), B * 5)):
        busiest = max(v for k, v in times.items() if k[:2] == where)
        assert busiest > 0
        bin_, bout = 8 * (lookups + B + 1), 8 * B * 17
        pcie = (bin_ + bout) / topo.card(*where).pcie_bps + 2 * PCIE_TRANSFER_LATENCY_S + KERNEL_LAUNCH_S
        net = 0.0 if where[0] == 0 else (bin_ + bout) / topo.network_bps + 2 * topo.network_latency_s
        assert card_time(plan, where) == pytest.approx(busiest + pcie + net, rel=1e-12)
    assert plan.card_times()[(1, 0)] > plan.card_times()[(0, 0)]

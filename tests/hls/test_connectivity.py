"""Bank placement of embedding tables and the generated [connectivity] section."""

from __future__ import annotations

import re

import pytest

from offload.hls.cards import CARDS
from offload.hls.connectivity import Item, place, kernel_connectivity
from offload.hls.embedding import top_name
from offload.kernels.embedding import TableSpec, make_spec

MB = 1 << 20


def _check_capacity(items, placed, p):
    used = [0] * p.banks
    for it in items:
        pl = placed[it.name]
        k = pl.last - pl.first + 1
        assert k * p.bank_bytes >= it.bytes
        if k > 1:
            for b in range(pl.first, pl.last + 1):
                used[b] += p.bank_bytes  # a spanning table owns its run
        else:
            used[pl.first] += it.bytes
    assert max(used) <= p.bank_bytes
    return used


@pytest.mark.parametrize("card", sorted(CARDS))
def test_capacity_respected_and_traffic_balanced(card):
    p = CARDS[card].memory
    # 3 x banks equal tables of 1/4 bank each with equal traffic: a perfect spread is 3 per bank.
    items = [Item(f"t{i}", p.bank_bytes // 4, 1.0) for i in range(3 * p.banks)]
    placed = place(items, card)
    _check_capacity(items, placed, p)
    per_bank = [sum(1 for it in items if placed[it.name].first == b) for b in range(p.banks)]
    assert per_bank == [3] * p.banks


def test_greedy_heaviest_first_onto_least_loaded():
    items = [Item("a", 1 * MB, 10.0), Item("b", 1 * MB, 9.0), Item("c", 1 * MB, 1.0), Item("d", 1 * MB, 1.0), Item("e", 1 * MB, 8.0)]
    placed = place(items, "u250")
    # a,b,e on their own banks; c,d (traffic 1) share the remaining least-loaded ones.
    banks = {n: placed[n].first for n in "abcde"}
    assert len({banks["a"], banks["b"], banks["e"]}) == 3
    loads = [0.0] * 4
    for it in items:
        loads[placed[it.name].first] += it.traffic
    assert max(loads) == 10.0  # the heaviest table alone; nothing stacked on it


def test_big_tables_span_contiguous_pseudo_channels():
    p = CARDS["u280"].memory  # 256 MB pseudo-channels
    items = [Item("huge", 700 * MB, 5.0), Item("big", 300 * MB, 3.0), Item("small", 10 * MB, 9.0)]
    placed = place(items, CARDS["u280"])
    assert placed["huge"].spelling("HBM") == "HBM[0:2]"
    assert placed["big"].spelling("HBM") == "HBM[3:4]"
    assert placed["small"].first not in range(0, 5)
    _check_capacity(items, placed, p)


def test_errors_when_tables_do_not_fit():
    with pytest.raises(ValueError, match="more than u50's"):
        place([Item("t", 9 << 30, 1.0)], "u50")
    with pytest.raises(ValueError, match="exceed one DDR bank"):
        place([Item("t", 17 << 30, 1.0)], "u250")


def test_deterministic_and_connectivity_text():
    spec = make_spec([TableSpec("user", 1_000_000, 64, "ap_fixed<16,6>"),
                      TableSpec("item", 5_000_000, 32, "int8_rowwise", "ap_fixed<24,4>"),
                      TableSpec("ctx", 1000, 8, "ap_fixed<8,3>")], mode="sum")
    a = kernel_connectivity(spec, "u55c", traffic={"user": 1, "item": 20, "ctx": 3}, compute_units=2)
    b = kernel_connectivity(spec, "u55c", traffic={"user": 1, "item": 20, "ctx": 3}, compute_units=2)
    assert a == b
    top = top_name(spec)
    assert f"nk={top}:2" in a.splitlines() and f"nk={top}:2:" not in a
    sps = dict(re.findall(r"^sp=(\S+):(\S+)$", a, re.M))
    for cu in (f"{top}_1", f"{top}_2"):
        for arg in ("table0", "table1", "params1", "table2", "indices", "offsets", "per_sample_weights", "out"):
            assert re.fullmatch(r"HBM\[\d+(:\d+)?\]", sps[f"{cu}.{arg}"])
        assert sps[f"{cu}.table1"] == sps[f"{cu}.params1"]  # row-wise params live with their codes
        assert f"slr={cu}:SLR0" in a
    # three tables, three different pseudo-channels
    assert len({sps[f"{top}_1.table{t}"] for t in range(3)}) == 3
    ddr = kernel_connectivity(spec, "u250")
    assert re.search(r"sp=\S+\.table0:DDR\[[0-3]\]", ddr)
    with pytest.raises(ValueError, match="unknown tables"):
        kernel_connectivity(spec, "u55c", traffic={"nope": 1})

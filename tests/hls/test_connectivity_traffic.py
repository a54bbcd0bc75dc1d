"""What kernel_connectivity feeds the placer, checked from the outside: a table's traffic is
its lookups per sample (default 1) times its row bytes, the same bank's share of a spanning table's
traffic counts once, and the keyword-only options stay keyword-only. Killed mutants found by the
cosmic-ray run recorded in TESTING.md."""

from __future__ import annotations

import dataclasses
import re

import pytest

from offload.hls.connectivity import Item, Placement, kernel_connectivity, place
from offload.kernels.embedding import TableSpec, make_spec


def _table_banks(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"sp=\S+\.table(\d+):(\S+)", text)}


def test_default_traffic_is_one_lookup_times_row_bytes():
    # a: 64 x 16-bit = 128 B rows, few rows; b: 8 x 16-bit = 16 B rows, many rows (more bytes).
    # Default traffic 1 per sample: a moves 128 B per sample, b 16 B, so a is busier and goes first
    # (DDR[0]) although b is the larger table. Were traffic 0 (or bytes/rows inverted), the tie
    # would go to the larger table, b.
    spec = make_spec([TableSpec("a", 100, 64, "ap_fixed<16,6>"), TableSpec("b", 10000, 8, "ap_fixed<16,6>")], mode="sum", max_bag_size=8)
    assert spec.tables[0].bytes() == 100 * 128 and spec.tables[1].bytes() == 10000 * 16
    text = kernel_connectivity(spec, "u250")
    assert _table_banks(text) == {0: "DDR[0]", 1: "DDR[1]"}
    # And the other way round: a with more rows and wider rows is the busier of the two.
    spec = make_spec([TableSpec("a", 1000, 64, "ap_fixed<16,6>"), TableSpec("b", 10, 8, "ap_fixed<16,6>")], mode="sum", max_bag_size=8)
    assert _table_banks(kernel_connectivity(spec, "u250")) == {0: "DDR[0]", 1: "DDR[1]"}


def test_fractional_traffic_is_not_rounded():
    # b: 8.03 lookups x 16 B = 128.48 B per sample, a hair above a's 128 B: b is busiest. Rounding
    # 8.03 * 16 down to 128 would tie, and the tie goes to the larger table, a (256 000 B > 160 000 B).
    spec = make_spec([TableSpec("a", 2000, 64, "ap_fixed<16,6>"), TableSpec("b", 10000, 8, "ap_fixed<16,6>")], mode="sum", max_bag_size=8)
    assert spec.tables[0].bytes() > spec.tables[1].bytes()
    text = kernel_connectivity(spec, "u250", traffic={"b": 8.03})
    assert _table_banks(text) == {0: "DDR[1]", 1: "DDR[0]"}


def test_traffic_and_compute_units_are_keyword_only():
    spec = make_spec([TableSpec("a", 10, 4, "ap_fixed<16,6>")], mode="sum", max_bag_size=8)
    with pytest.raises(TypeError):
        kernel_connectivity(spec, "u250", {"a": 2.0})


def test_items_and_placements_are_immutable_values():
    it = Item("t", 10, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        it.bytes = 11
    with pytest.raises(dataclasses.FrozenInstanceError):
        Placement(0, 0).first = 1
    assert hash(it) == hash(Item("t", 10, 1.0))


def test_a_spanning_table_checks_every_bank_of_its_run():
    # u55c pseudo-channels of 512 MiB. "y" (3 PCs, largest, placed first) takes PC0..2; no traffic
    # anywhere, so x (2 PCs) takes the lowest run that is wholly free, PC3..4, never one that starts
    # on y's last PC.
    pc = 16 * (1 << 30) // 32
    got = place([Item("y", 2 * pc + 1, 0.0), Item("x", pc + 1, 0.0), Item("z", pc + 1, 0.0)], "u55c")
    assert (got["y"].first, got["x"].first, got["z"].first) == (0, 3, 5)
    spans = {n: set(range(p.first, p.last + 1)) for n, p in got.items()}
    assert [len(spans[n]) for n in "yxz"] == [3, 2, 2]
    assert not (spans["x"] & spans["y"]) and not (spans["x"] & spans["z"]) and not (spans["y"] & spans["z"])


def test_spanning_tables_can_start_on_any_pseudo_channel_that_leaves_room():
    # Sixteen 2-PC tables fill all 32 u55c pseudo-channels; the last starts on PC30, so run starts
    # range over 0 .. banks - k, not a shorter list.
    pc = 16 * (1 << 30) // 32
    got = place([Item(f"t{i:02d}", pc + 1, 1.0) for i in range(16)], "u55c")
    assert sorted((p.first, p.last) for p in got.values()) == [(2 * i, 2 * i + 1) for i in range(16)]


def test_equal_traffic_places_the_larger_table_first():
    # Rule 2's tie-break: same traffic, so the larger table picks first and gets DDR[0].
    got = place([Item("small", 1 << 30, 1.0), Item("large", 2 << 30, 1.0)], "u250")
    assert (got["large"].first, got["small"].first) == (0, 1)


def test_the_kernel_sits_next_to_the_lowest_of_equally_busy_banks():
    from offload.hls.cards import get_card

    # Two equal tables on DDR[0] and DDR[1], equally busy: the tie goes to the lower bank, whose
    # SLR the kernel is pinned to (U250: each DDR bank hangs off its own SLR).
    slr_of_bank = get_card("u250").memory.slr_of_bank
    assert slr_of_bank[0] != slr_of_bank[1]
    spec = make_spec([TableSpec("a", 100, 16, "ap_fixed<16,6>"), TableSpec("b", 100, 16, "ap_fixed<16,6>")], mode="sum", max_bag_size=8)
    text = kernel_connectivity(spec, "u250")
    assert _table_banks(text) == {0: "DDR[0]", 1: "DDR[1]"}
    assert re.findall(r"slr=\S+:SLR(\d+)", text) == [str(slr_of_bank[0])]

"""The documented bank-placement rules of offload.hls.connectivity, one test each, with bank sizes
taken from the data sheets rather than from the code's own table: a U250 has four 16 GiB DDR4
banks (AMD DS962), a U55C 32 HBM2 pseudo-channels of 512 MiB (16 GiB / 32, AMD DS978)."""

from __future__ import annotations

import re

from offload.hls.connectivity import Item, kernel_connectivity, place
from offload.kernels.embedding import TableSpec, make_spec

GiB = 1 << 30
U250_BANK = 16 * GiB
U55C_PC = 16 * GiB // 32


def test_a_table_that_exactly_fills_a_bank_goes_there():
    # A (10 GiB, busiest) takes DDR[0]; B, C, D (a whole bank each) fill the other three; E is
    # exactly the 6 GiB left in DDR[0]: the only place it fits, and it must be used.
    items = [Item("a", 10 * GiB, 10.0), Item("b", U250_BANK, 5.0), Item("c", U250_BANK, 5.0), Item("d", U250_BANK, 5.0), Item("e", 6 * GiB, 1.0)]
    got = place(items, "u250")
    assert got["e"].first == got["a"].first
    assert sorted(got[n].first for n in "abcd") == [0, 1, 2, 3]


def test_whole_bank_tables_fill_every_bank():
    got = place([Item(f"t{i}", U250_BANK, 1.0) for i in range(4)], "u250")
    assert sorted(p.first for p in got.values()) == [0, 1, 2, 3]


def test_a_table_one_byte_larger_than_a_pseudo_channel_spans_two():
    got = place([Item("big", U55C_PC + 1, 1.0), Item("pc", U55C_PC, 1.0)], "u55c")
    assert got["big"].last - got["big"].first == 1
    assert got["pc"].first == got["pc"].last and not got["big"].first <= got["pc"].first <= got["big"].last


def _io_bank(text: str) -> int:
    banks = {re.search(r"\[(\d+)\]", line).group(1) for line in text.splitlines() if re.match(r"sp=\S+\.(indices|offsets|per_sample_weights|out):", line)}
    assert len(banks) == 1, text
    return int(banks.pop())


def _table_banks(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"sp=\S+\.table(\d+):\w+\[(\d+)\]", text)}


def test_per_call_buffers_go_to_the_bank_with_the_least_table_traffic():
    # Three tables on three DDR banks; the fourth bank has no table traffic: the per-call buffers
    # (read and written on every call) belong there, away from the busiest bank.
    tables = [TableSpec(f"t{i}", 1000, 16, "ap_fixed<16,6>") for i in range(3)]
    spec = make_spec(tables, mode="sum", max_bag_size=8)
    text = kernel_connectivity(spec, "u250", traffic={"t0": 100.0, "t1": 10.0, "t2": 1.0})
    banks = _table_banks(text)
    assert len(set(banks.values())) == 3
    io = _io_bank(text)
    assert io not in banks.values()


def test_per_call_buffers_avoid_the_busiest_bank_when_every_bank_holds_a_table():
    tables = [TableSpec(f"t{i}", 1000, 16, "ap_fixed<16,6>") for i in range(4)]
    spec = make_spec(tables, mode="sum", max_bag_size=8)
    traffic = {"t0": 1.0, "t1": 50.0, "t2": 100.0, "t3": 20.0}
    text = kernel_connectivity(spec, "u250", traffic=traffic)
    banks = _table_banks(text)
    io = _io_bank(text)
    quietest = banks[str(min(range(4), key=lambda t: traffic[f"t{t}"]))]
    assert io == quietest

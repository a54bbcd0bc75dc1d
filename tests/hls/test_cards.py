"""offload.hls.cards: the one table of card facts, checked against the figures AMD publishes.

Each expected value below is copied from the document named next to it, not computed from the
table's own formulas, so a wrong bank size, bank count or bandwidth in the table fails here.
"""

from __future__ import annotations

import dataclasses

import pytest

from offload.hls.cards import CARDS, Memory, get_card
from offload.sim.errors import InputError, InputTypeError

GiB = 1 << 30

# name: (data sheet, device, HBM bytes, HBM total B/s, DDR bytes, DDR channels, DDR total B/s,
#        DSP slices, BRAM36, URAM, LUTs)
DATASHEETS = {
    # DS965 "Alveo U50 Data Center Accelerator Card Data Sheet": XCU50, 8 GB HBM2, 316 GB/s,
    # 872K LUTs, 5,952 DSP, 1,344 BRAM36 (47.3 Mb), 640 URAM (180 Mb).
    "u50": ("DS965", "XCU50", 8 * GiB, 316e9, 0, 0, 0.0, 5952, 1344, 640, 872_000),
    # DS978 "Alveo U55C Data Center Accelerator Card Data Sheet": XCU55C, 16 GB HBM2, 460 GB/s,
    # 1,304K LUTs, 9,024 DSP, 2,016 BRAM36 (70.9 Mb), 960 URAM (270 Mb).
    "u55c": ("DS978", "XCU55C", 16 * GiB, 460e9, 0, 0, 0.0, 9024, 2016, 960, 1_304_000),
    # DS963 "Alveo U280 Data Center Accelerator Card Data Sheet": XCU280, 8 GB HBM2 at 460 GB/s and
    # 32 GB DDR4 in 2 channels at 38 GB/s; 1,304K LUTs, 9,024 DSP, 2,016 BRAM36, 960 URAM.
    "u280": ("DS963", "XCU280", 8 * GiB, 460e9, 32 * GiB, 2, 38e9, 9024, 2016, 960, 1_304_000),
    # DS962 "Alveo U200 and U250 Data Center Accelerator Cards Data Sheet", U250: XCU250, no HBM,
    # 64 GB DDR4 in 4 channels at 77 GB/s; 1,728K LUTs, 12,288 DSP, 2,688 BRAM36, 1,280 URAM.
    "u250": ("DS962", "XCU250", 0, 0.0, 64 * GiB, 4, 77e9, 12288, 2688, 1280, 1_728_000),
}
# UG1120 "Alveo Data Center Accelerator Card Platforms User Guide": SLRs of each card, and the SLR
# each DDR bank is wired to (the HBM stacks sit below SLR0 on U50, U55C and U280).
SLRS = {"u50": 2, "u55c": 3, "u280": 3, "u250": 4}
DDR_SLR = {"u280": (0, 1), "u250": (0, 1, 2, 3)}


def test_the_table_holds_exactly_the_cards_with_datasheets():
    assert set(CARDS) == set(DATASHEETS)


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_card_facts_match_their_datasheet(name):
    ds, device, hbm_bytes, hbm_bps, ddr_bytes, ddr_banks, ddr_bps, dsp, bram36, uram, lut = DATASHEETS[name]
    c = CARDS[name]
    assert c.name == name and c.datasheet == ds
    assert c.part.upper().startswith(device + "-")
    assert (c.dsp, c.bram36, c.uram, c.lut) == (dsp, bram36, uram, lut)
    if hbm_bytes:
        assert c.hbm.kind == "HBM" and c.hbm.banks == 32  # 32 pseudo channels (UG1393, "HBM")
        assert c.hbm.bytes == hbm_bytes
        assert c.hbm.bps == pytest.approx(hbm_bps, rel=1e-12)
    else:
        assert c.hbm is None
    if ddr_bytes:
        assert c.ddr.kind == "DDR" and c.ddr.banks == ddr_banks and c.ddr.bytes == ddr_bytes
        # The data sheets give DDR bandwidth in whole GB/s: the true total is within 0.5 GB/s.
        assert c.ddr.bps == pytest.approx(ddr_bps, abs=0.5e9)
    else:
        assert c.ddr is None
    assert c.memory_bytes == hbm_bytes + ddr_bytes
    assert c.kernel_clock_hz == 300e6  # UG1393: Vitis default kernel clock on Alveo platforms


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_slrs_and_bank_attachment_match_the_platform_guide(name):
    c = CARDS[name]
    assert c.slrs == SLRS[name]
    if c.hbm is not None:
        assert c.hbm.slr_of_bank == (0,) * 32
    if c.ddr is not None:
        assert c.ddr.slr_of_bank == DDR_SLR[name]
    # The default platform is the card's gen3x16 XDMA shell, and the link the table states is that one.
    assert c.platform.startswith(f"xilinx_{name}_gen3x16_xdma_") and c.pcie == "Gen3 x16"


def test_kernels_use_hbm_where_the_card_has_it():
    # The U280 has both: kernel buffers go to its HBM, its DDR still counts as table memory.
    assert CARDS["u280"].memory is CARDS["u280"].hbm
    assert CARDS["u250"].memory is CARDS["u250"].ddr


def test_lookup_errors_are_typed_and_name_the_card():
    assert get_card(" U55C ") is CARDS["u55c"]
    assert get_card(CARDS["u50"]) is CARDS["u50"]
    with pytest.raises(InputError, match="'u999'.*known cards"):
        get_card("u999")
    with pytest.raises(InputTypeError, match="card: expected"):
        get_card(55)
    with pytest.raises(InputError, match="slr_of_bank: 2 entries for 4 DDR banks"):
        dataclasses.replace(CARDS["u250"].ddr, slr_of_bank=(0, 1))
    nomem = dataclasses.replace(CARDS["u250"], ddr=None)
    with pytest.raises(InputError, match="neither HBM nor DDR"):
        nomem.memory
    assert isinstance(CARDS["u55c"].hbm, Memory)

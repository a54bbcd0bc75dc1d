"""Alveo card budgets and the timing constants the offload advisor's analytical model uses.

Every number carries its source. Datasheet figures are exact; the host-side overheads (PCIe
efficiency, per-transfer and kernel-launch latency) and the HBM/DDR random-access latency are
published measurements or documented defaults, and are the first thing to replace with numbers
measured on the user's own card (``Card`` is a plain dataclass: ``dataclasses.replace`` it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Card", "CARDS", "get_card", "PCIE_GEN3_X16_EFFECTIVE_BPS", "PCIE_GEN4_X8_EFFECTIVE_BPS",
           "PCIE_TRANSFER_LATENCY_S", "KERNEL_LAUNCH_S", "HBM_RANDOM_READ_LATENCY_S", "DDR_RANDOM_READ_LATENCY_S",
           "M_AXI_OUTSTANDING_READS", "HBM_PC_BPS", "DDR4_CHANNEL_BPS"]

_GB = 1 << 30

# --- host <-> card -------------------------------------------------------------------------------
# PCIe Gen3 x16: 8 GT/s x 16 lanes x 128b/130b = 15.75 GB/s raw per direction (PCI-SIG Gen3 spec).
# UG1393 ("Determine the Maximum Achievable Throughput") says to measure the effective DMA rate
# with `xbutil dma test` (its Fig. 1 is such a run on a U200). We assume 12 GB/s, ~76 % of raw,
# the usual order for XDMA on Gen3 x16; replace with the user's own `xbutil` figure.
PCIE_GEN3_X16_EFFECTIVE_BPS = 12.0e9
# U55C's Gen4 x8 link has the same raw rate as Gen3 x16 (16 GT/s x 8), so the same effective figure.
PCIE_GEN4_X8_EFFECTIVE_BPS = 12.0e9
# Fixed cost of one host<->card buffer sync (xrt::bo::sync: DMA descriptor setup + completion).
# Vitis guidance ("PCIe Transfer Write Bandwidth", UG1315) flags transfers below ~4 KB as
# inefficient, i.e. a fixed cost well above the 0.3 us that 4 KB take on the wire. 10 us is our
# assumption for that fixed cost (driver + interrupt), not a measured figure.
PCIE_TRANSFER_LATENCY_S = 10e-6
# XRT kernel start -> done notification, published measurements: 50-100 us on a U55C with Vitis
# 2022.1 (github.com/Xilinx/XRT issue #8687, "large overhead for launching kernel"); xrt::run start
# 16-56 us on a U25 with XRT 2.12 (XRT issue #6601); ~45 us for an empty kernel through XRT
# (XRT issue #9018). We take the low end of the U55C figure.
KERNEL_LAUNCH_S = 50e-6

# --- card memory ---------------------------------------------------------------------------------
# HBM2 on U50/U55C/U280: 32 pseudo channels, 14.375 GB/s max theoretical each, 460 GB/s total
# (UG1393 "HBM Configuration and Use"). U50's datasheet (DS965) states 316 GB/s because its HBM runs
# at a lower clock: 316/32 = 9.875 GB/s per PC.
HBM_PC_BPS = 14.375e9
# DDR4-2400 x 64 bit = 19.2 GB/s per channel; UG1393 quotes 19.25 GB/s per DDR channel and
# 77 GB/s for the four channels of a U250/U200.
DDR4_CHANNEL_BPS = 19.25e9
# Idle random read latency of one HBM pseudo channel (page hit/closed/miss) was measured on a U280
# by Shuhai (Z. Wang, H. Huang, J. Zhang, G. Alonso, "Shuhai: Benchmarking High Bandwidth Memory
# on FPGAs", FCCM 2020, DOI 10.1109/FCCM48280.2020.00024), which also measures DDR4 for comparison.
# Its latencies are O(100 ns); 150 ns here is our rounded assumption for a random row read,
# not a number copied from the paper's tables (none were at hand): replace with a measured value.
HBM_RANDOM_READ_LATENCY_S = 150e-9
# DDR4 through the Alveo memory controller: same order; assumed slightly slower than HBM.
DDR_RANDOM_READ_LATENCY_S = 170e-9
# Vitis HLS m_axi default num_read_outstanding = 16 (UG1399, "set_directive_interface" / m_axi
# options). Little's law: a master sustains at most 16 reads per latency window.
M_AXI_OUTSTANDING_READS = 16


@dataclass(frozen=True)
class Card:
    """One Alveo card's budget. Memory sizes in bytes, bandwidths in bytes/s, clock in Hz."""

    name: str
    datasheet: str
    dsp: int
    bram36: int
    uram: int
    lut: int
    hbm_bytes: int
    hbm_channels: int
    hbm_channel_bps: float
    ddr_bytes: int
    ddr_channels: int
    pcie_bps: float
    kernel_clock_hz: float

    @property
    def memory_bytes(self) -> int:
        """Off-chip memory a resident table can live in (HBM plus DDR)."""
        return self.hbm_bytes + self.ddr_bytes

    @property
    def memory_channels(self) -> int:
        return self.hbm_channels + self.ddr_channels


# Kernel clock: the Vitis default for Alveo platforms is 300 MHz (UG1393, "--kernel_frequency";
# xilinx_u55c/u280/u250/u50 platforms ship a 300 MHz kernel clock, UG1120 platform pages).
_CLOCK = 300e6

CARDS: dict[str, Card] = {
    # DS978 (Alveo U55C data sheet): XCU55C, 1,304K LUTs, 9,024 DSP slices, 2,016 BRAM36 (70.9 Mb),
    # 960 URAM (270 Mb), 16 GB HBM2 in 32 x 512 MB pseudo channels, 460 GB/s; PCIe Gen3 x16 / Gen4 x8.
    "u55c": Card("u55c", "DS978", dsp=9024, bram36=2016, uram=960, lut=1_304_000,
                 hbm_bytes=16 * _GB, hbm_channels=32, hbm_channel_bps=HBM_PC_BPS,
                 ddr_bytes=0, ddr_channels=0, pcie_bps=PCIE_GEN4_X8_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
    # DS963 (Alveo U280 data sheet): XCU280, 1,304K LUTs, 9,024 DSP, 2,016 BRAM36, 960 URAM,
    # 8 GB HBM2 (32 x 256 MB PCs, 460 GB/s) + 32 GB DDR4 in 2 channels (38 GB/s); PCIe Gen3 x16.
    "u280": Card("u280", "DS963", dsp=9024, bram36=2016, uram=960, lut=1_304_000,
                 hbm_bytes=8 * _GB, hbm_channels=32, hbm_channel_bps=HBM_PC_BPS,
                 ddr_bytes=32 * _GB, ddr_channels=2, pcie_bps=PCIE_GEN3_X16_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
    # DS962 (Alveo U200/U250 data sheet), U250: XCU250, 1,728K LUTs, 12,288 DSP, 2,688 BRAM36,
    # 1,280 URAM, 64 GB DDR4 in 4 channels, 77 GB/s; PCIe Gen3 x16. No HBM.
    "u250": Card("u250", "DS962", dsp=12288, bram36=2688, uram=1280, lut=1_728_000,
                 hbm_bytes=0, hbm_channels=0, hbm_channel_bps=0.0,
                 ddr_bytes=64 * _GB, ddr_channels=4, pcie_bps=PCIE_GEN3_X16_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
    # DS965 (Alveo U50 data sheet): XCU50, 872K LUTs, 5,952 DSP, 1,344 BRAM36, 640 URAM,
    # 8 GB HBM2 (32 x 256 MB PCs), 316 GB/s; PCIe Gen3 x16 (Gen4 x8).
    "u50": Card("u50", "DS965", dsp=5952, bram36=1344, uram=640, lut=872_000,
                hbm_bytes=8 * _GB, hbm_channels=32, hbm_channel_bps=316e9 / 32,
                ddr_bytes=0, ddr_channels=0, pcie_bps=PCIE_GEN3_X16_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
}


def get_card(card: str | Card) -> Card:
    """A :class:`Card` by name (``"u55c"``, ``"u280"``, ``"u250"``, ``"u50"``), or the card itself."""
    if isinstance(card, Card):
        return card
    if not isinstance(card, str):
        raise TypeError(f"card: expected a card name or Card, got {type(card).__name__}")
    key = card.strip().lower()
    if key not in CARDS:
        raise ValueError(f"card {card!r}: unknown; known cards: {sorted(CARDS)}")
    return CARDS[key]

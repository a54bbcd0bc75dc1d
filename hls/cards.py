"""The one table of Alveo card and platform facts, and the timing constants the advisor's model uses.

Each card's part, default platform, SLRs, fabric budget (DSP, BRAM36, URAM, LUT), off-chip memory
banks (count, bytes, bandwidth, the SLR each hangs off), PCIe link and kernel clock live here and
nowhere else: the Vitis project writer (:mod:`offload.hls.build`), the bank placer
(:mod:`offload.hls.connectivity`), the partitioner and the advisor all read this table. Units:
bytes, bytes/s, seconds, Hz.

Every number carries its source. Datasheet figures are exact; the host-side overheads (PCIe
efficiency, per-transfer and kernel-launch latency) and the HBM/DDR random-access latency are
published measurements or documented defaults, and are the first thing to replace with numbers
measured on the user's own card (``Card`` and ``Memory`` are plain frozen dataclasses:
``dataclasses.replace`` them).
"""

from __future__ import annotations

from dataclasses import dataclass

from offload.sim.errors import InputError, InputTypeError

__all__ = ["Memory", "Card", "CARDS", "get_card", "PCIE_GEN3_X16_EFFECTIVE_BPS",
           "PCIE_TRANSFER_LATENCY_S", "KERNEL_LAUNCH_S", "HBM_RANDOM_READ_LATENCY_S", "DDR_RANDOM_READ_LATENCY_S",
           "M_AXI_OUTSTANDING_READS", "DDR4_CHANNEL_BPS",
           "KERNEL_LAUNCH_REPORTED_S", "HOST_CARD_ROUND_TRIP_S", "PERSISTENT_POLL_INTERVAL_S", "LAUNCH_MODES", "LAUNCH_CHOICES",
           "HOST_MEMORY_BLOCKLIST", "HOST_MEMORY_CARDS", "RingMemory", "ring_memory"]

_GiB = 1 << 30

# --- host <-> card -------------------------------------------------------------------------------
# PCIe Gen3 x16: 8 GT/s x 16 lanes x 128b/130b = 15.75 GB/s raw per direction (PCI-SIG Gen3 spec).
# UG1393 ("Determine the Maximum Achievable Throughput") says to measure the effective DMA rate
# with `xbutil dma test` (its Fig. 1 is such a run on a U200). We assume 12 GB/s, ~76 % of raw,
# the usual order for XDMA on Gen3 x16; replace with the user's own `xbutil` figure.
PCIE_GEN3_X16_EFFECTIVE_BPS = 12.0e9
# Every default platform below is a gen3x16 shell (its name says so). The U55C and U50 can also
# train Gen4 x8 (DS978, DS965), the same raw rate (16 GT/s x 8), so the same effective figure.
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

# --- launch modes (read by offload.advisor.model) -----------------------------------------------
# "per_call": every call syncs its buffers (PCIE_TRANSFER_LATENCY_S each) and starts one xrt::run
# (KERNEL_LAUNCH_S above). Users report 16-100 us a run: xrt::run::run + start 56, 28, 16, 17 us
# for four runs on a U25 with XRT 2.12 (Xilinx/XRT issue #6601); 50-100 us on a U55C with Vitis
# 2022.1 (Xilinx/XRT issue #8687). #9018's ~45 us empty kernel is an NPU (MLIR-AIE), not an Alveo.
KERNEL_LAUNCH_REPORTED_S = (16e-6, 100e-6)
# "persistent": the kernel is started once and serves a ring of request slots in host memory
# (xrt::bo::flags::host_only buffers, Vitis_Accel_Examples host_xrt/host_memory_simple_xrt, whose
# kernel reads and writes them over PCIe with no xrt::bo::sync). A call writes its slot, the
# kernel's loop sees it at its next poll, computes, writes the response and its sequence word to
# host memory; the host spins on that word. No xrt::run, no buffer sync.
# Host -> card -> host round trip of a small request: Coyote's perf_local example (the card reads
# a buffer from host memory and writes it back; software polls for completion), HOST data stream,
# 50 runs each, in fpgasystems/Coyote issue #161: 3.00698/3.02904/3.06628 us at 64/128/256 B
# (`bin/test -s 1 -h 1 -m 0`) and 3.56208/3.80692/3.10088 us (`-m 1`); other runs in the same
# thread read 2.36-2.63 us. We take the largest reading. It is a measurement of Coyote's shell, not
# of an XRT platform: an assumption for XRT's host-memory path until measured on a card.
HOST_CARD_ROUND_TRIP_S = 3.80692e-6
# Poll interval of the kernel loop: how long a request written to its slot waits until the kernel
# reads it. Our assumption, not a measurement: the loop re-reads the slot's sequence word back to
# back, one small host-memory read per poll, and such a read takes at most the round trip above;
# a request is charged the whole interval (the worst case, not the mean of half of it).
PERSISTENT_POLL_INTERVAL_S = HOST_CARD_ROUND_TRIP_S
LAUNCH_MODES = ("per_call", "persistent")
LAUNCH_CHOICES = ("auto", *LAUNCH_MODES)  # what a caller may ask for: "auto" is persistent where possible
# --- end of launch modes ------------------------------------------------------------------------

# --- card memory ---------------------------------------------------------------------------------
# HBM2 on U50/U55C/U280: 32 pseudo channels, 14.375 GB/s max theoretical each, 460 GB/s total
# (UG1393 "HBM Configuration and Use"). U50's datasheet (DS965) states 316 GB/s because its HBM runs
# at a lower clock: 316/32 = 9.875 GB/s per PC. The table below holds each card's datasheet total.
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
class Memory:
    """One kind of off-chip memory of a card: ``banks`` banks named ``{kind}[i]`` (the names
    ``v++ --connectivity.sp`` takes), each ``bank_bytes`` bytes and ``bank_bps`` bytes/s, bank i
    attached next to SLR ``slr_of_bank[i]``."""

    kind: str  # "HBM" (pseudo channels) or "DDR" (channels)
    banks: int
    bank_bytes: int
    bank_bps: float
    slr_of_bank: tuple[int, ...]
    random_read_latency_s: float

    def __post_init__(self) -> None:
        if len(self.slr_of_bank) != self.banks:
            raise InputError(f"slr_of_bank: {len(self.slr_of_bank)} entries for {self.banks} {self.kind} banks")

    @property
    def bytes(self) -> int:
        return self.banks * self.bank_bytes

    @property
    def bps(self) -> float:
        return self.banks * self.bank_bps


@dataclass(frozen=True)
class Card:
    """One Alveo card: FPGA part, default Vitis platform, fabric budget, memories, PCIe and clock."""

    name: str
    datasheet: str
    part: str  # the FPGA part HLS synthesises for (set_part)
    platform: str  # the default platform (xpfm) v++ --platform links against
    slrs: int
    dsp: int
    bram36: int
    uram: int
    lut: int
    hbm: Memory | None
    ddr: Memory | None
    pcie: str  # the link the default platform trains
    pcie_bps: float  # effective host<->card DMA rate, one direction
    kernel_clock_hz: float

    @property
    def memory(self) -> Memory:
        """The memory the project writer and the bank placer put kernel buffers in: HBM where the
        card has it (more banks, more bandwidth), else DDR. A U280's DDR is not used for them,
        although :attr:`memory_bytes` counts it."""
        mem = self.hbm or self.ddr
        if mem is None:
            raise InputError(f"card {self.name!r}: has neither HBM nor DDR")
        return mem

    @property
    def memory_bytes(self) -> int:
        """Off-chip memory a resident table can live in (HBM plus DDR)."""
        return sum(m.bytes for m in (self.hbm, self.ddr) if m is not None)


def _hbm(total_bytes: int, total_bps: float) -> Memory:
    # HBM2 on these cards: 32 pseudo channels (UG1393 "HBM Configuration and Use"), all under the
    # bottom SLR: the HBM stacks sit below SLR0 (UG1120 platform pages: HBM[0:31] in SLR0).
    return Memory("HBM", 32, total_bytes // 32, total_bps / 32, (0,) * 32, HBM_RANDOM_READ_LATENCY_S)


def _ddr(slr_of_bank: tuple[int, ...], bank_bytes: int) -> Memory:
    return Memory("DDR", len(slr_of_bank), bank_bytes, DDR4_CHANNEL_BPS, slr_of_bank, DDR_RANDOM_READ_LATENCY_S)


# Kernel clock: the Vitis default for Alveo platforms is 300 MHz (UG1393, "--kernel_frequency";
# xilinx_u55c/u280/u250/u50 platforms ship a 300 MHz kernel clock, UG1120 platform pages).
_CLOCK = 300e6
# Parts: the FPGA each card carries, spelled as Vivado/Vitis HLS take it (set_part); the same
# spellings as hls4ml's supported Alveo boards. Platforms: the gen3x16 XDMA shells AMD ships for
# each card (UG1120 "Alveo Data Center Accelerator Card Platforms", per-card platform pages, which
# also give the SLR count and which SLR each memory bank is attached to).

# Ordered as `offload build --target` has always listed them.
CARDS: dict[str, Card] = {
    # DS965 (Alveo U50 data sheet): XCU50, 872K LUTs, 5,952 DSP, 1,344 BRAM36, 640 URAM,
    # 8 GB HBM2 (32 x 256 MB PCs), 316 GB/s; PCIe Gen3 x16 (Gen4 x8). UG1120: 2 SLRs.
    "u50": Card("u50", "DS965", "xcu50-fsvh2104-2-e", "xilinx_u50_gen3x16_xdma_5_202210_1", slrs=2,
                dsp=5952, bram36=1344, uram=640, lut=872_000,
                hbm=_hbm(8 * _GiB, 316e9), ddr=None,
                pcie="Gen3 x16", pcie_bps=PCIE_GEN3_X16_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
    # DS978 (Alveo U55C data sheet): XCU55C, 1,304K LUTs, 9,024 DSP slices, 2,016 BRAM36 (70.9 Mb),
    # 960 URAM (270 Mb), 16 GB HBM2 in 32 x 512 MB pseudo channels, 460 GB/s; PCIe Gen3 x16 / Gen4 x8.
    # UG1120: 3 SLRs.
    "u55c": Card("u55c", "DS978", "xcu55c-fsvh2892-2L-e", "xilinx_u55c_gen3x16_xdma_3_202210_1", slrs=3,
                 dsp=9024, bram36=2016, uram=960, lut=1_304_000,
                 hbm=_hbm(16 * _GiB, 460e9), ddr=None,
                 pcie="Gen3 x16", pcie_bps=PCIE_GEN3_X16_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
    # DS962 (Alveo U200/U250 data sheet), U250: XCU250, 1,728K LUTs, 12,288 DSP, 2,688 BRAM36,
    # 1,280 URAM, 64 GB DDR4 in 4 channels of 16 GB (DDR4-2400), 77 GB/s; PCIe Gen3 x16. No HBM.
    # UG1120: 4 SLRs, DDR[i] attached to SLR i.
    "u250": Card("u250", "DS962", "xcu250-figd2104-2L-e", "xilinx_u250_gen3x16_xdma_4_1_202210_1", slrs=4,
                 dsp=12288, bram36=2688, uram=1280, lut=1_728_000,
                 hbm=None, ddr=_ddr((0, 1, 2, 3), 16 * _GiB),
                 pcie="Gen3 x16", pcie_bps=PCIE_GEN3_X16_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
    # DS963 (Alveo U280 data sheet): XCU280, 1,304K LUTs, 9,024 DSP, 2,016 BRAM36, 960 URAM,
    # 8 GB HBM2 (32 x 256 MB PCs, 460 GB/s) + 32 GB DDR4 in 2 channels of 16 GB (38 GB/s); PCIe
    # Gen3 x16. UG1120: 3 SLRs, DDR[0] attached to SLR0, DDR[1] to SLR1.
    "u280": Card("u280", "DS963", "xcu280-fsvh2892-2L-e", "xilinx_u280_gen3x16_xdma_1_202211_1", slrs=3,
                 dsp=9024, bram36=2016, uram=960, lut=1_304_000,
                 hbm=_hbm(8 * _GiB, 460e9), ddr=_ddr((0, 1), 16 * _GiB),
                 pcie="Gen3 x16", pcie_bps=PCIE_GEN3_X16_EFFECTIVE_BPS, kernel_clock_hz=_CLOCK),
}


def get_card(card: str | Card) -> Card:
    """A :class:`Card` by name (``"u55c"``, ``"u280"``, ``"u250"``, ``"u50"``), or the card itself."""
    if isinstance(card, Card):
        return card
    if not isinstance(card, str):
        raise InputTypeError(f"card: expected a card name or Card, got {type(card).__name__}")
    key = card.strip().lower()
    if key not in CARDS:
        raise InputError(f"card {card!r}: unknown; known cards: {sorted(CARDS)}")
    return CARDS[key]


# --- host memory (the persistent kernel's ring) -----------------------------------------------
# Which platforms let a kernel's m_axi port reach host memory (XRT "host memory access", the
# platform's host-memory bridge, formerly "Slave Bridge"): connectivity `sp=<cu>.<port>:HOST[0]`
# at link time, `xrt::bo::flags::host_only` buffers at run time (XRT
# src/runtime_src/doc/toc/hm.rst), and `xrt-smi configure --host-mem` (`xbutil configure
# --host-mem` before XRT 2.17) to reserve the memory before the xclbin is loaded.
# Source: Xilinx/Vitis_Accel_Examples host_xrt/host_memory_simple_xrt/description.json
# "platform_blocklist" (and makefile_us_alveo.mk PLATFORM_BLOCKLIST, the same list; the example's
# README renders it as "Alveo U50lv, Alveo U50 gen3x4" excluded). Matched as substrings of the
# platform name, as the example's makefile matches them. The Alveo entries of that list:
HOST_MEMORY_BLOCKLIST = ("u25_", "u30", "u50lv", "u50_gen3x4", "u2_", "v70", "samsung")
# Per card, the default platform above and what the example's list says of it. U200 has no Card
# here (no default platform offload builds for) but is listed for the lookup by name. U50: the
# list excludes the U50LV card and the U50's gen3x4 shell, not the gen3x16 shell offload
# builds for, so a U50 on its default platform keeps its ring in host memory; on a gen3x4
# platform it falls back.
HOST_MEMORY_CARDS = ("u55c", "u280", "u250", "u200", "u50")


@dataclass(frozen=True)
class RingMemory:
    """Where a persistent kernel's ring lives on one platform, and why.

    ``host``: True when the ring is a ``host_only`` buffer in host memory (the kernel polls it
    over PCIe, the host polls its own memory); False when it is a buffer in card memory, written
    and read by DMA (``xrt::bo::sync``): the request word, synced to the card after the inputs,
    is the doorbell the kernel polls. A register doorbell is not offered: pyxrt binds no
    register access from XRT 2.12 on (``kernel.read_register``/``write_register`` only in 2.11's
    pyxrt.cpp, ``xrt::ip`` never), and the kernel's loop polls memory either way.
    """

    card: str
    platform: str
    host: bool
    why: str

    @property
    def bank(self) -> str | None:
        """The connectivity bank of the ring port when it is in host memory, else None (the
        placer puts it in card memory)."""
        return "HOST[0]" if self.host else None


def ring_memory(card: "str | Card", platform: str | None = None) -> RingMemory:
    """Whether ``card`` on ``platform`` (default: the card's default platform) can keep a
    persistent kernel's ring in host memory, or falls back to card memory, with the reason.

    Example::

        ring_memory("u55c").host                                   # True
        ring_memory("u50", "xilinx_u50_gen3x4_xdma_2_202010_1")    # host=False, why names the list
    """
    c = get_card(card)
    plat = platform or c.platform
    src = "Vitis_Accel_Examples host_memory_simple_xrt platform_blocklist"
    hit = next((b for b in HOST_MEMORY_BLOCKLIST if b in plat.lower()), None)
    if hit is not None:
        return RingMemory(c.name, plat, False, f"platform {plat} matches {hit!r} in the {src}: no host-memory access; "
                          "the ring is in card memory and each request word is written by DMA")
    if c.name not in HOST_MEMORY_CARDS:
        return RingMemory(c.name, plat, False, f"{c.name}: no source says its platforms reach host memory; the ring is in card memory")
    return RingMemory(c.name, plat, True, f"{plat} is not excluded by the {src}: the ring is a host_only buffer at HOST[0] "
                      "(reserve it with `xrt-smi configure --host-mem -d <bdf> --size 1G enable`; `xbutil` on older XRT)")
# --- end of host memory ------------------------------------------------------------------------

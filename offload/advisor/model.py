"""Analytical latency and resource model of the offload kernels on an Alveo card (no torch).

Card latency of one call = transfers + launch + kernel time, in one of two launch modes
(:data:`LAUNCHES`, constants and their sources in :mod:`offload.hls.cards`):

- ``per_call``: every call syncs each buffer (a fixed cost each, plus bytes over PCIe) and starts
  one ``xrt::run``. This is the host path that exists today.
- ``persistent``: the kernel runs from load on and serves a ring of request slots
  (:mod:`offload.kernels.ring`). Where the platform reaches host memory
  (:func:`offload.hls.cards.ring_memory`) a call costs one small host-card round trip plus bytes
  over PCIe ("transfer"), the kernel loop's poll interval ("launch"), and the kernel. Where it does
  not, the ring is in card memory and a call costs four buffer syncs (inputs, then the request
  word; the response word, then the outputs) plus bytes, and a poll of card memory. MODELLED, not
  measured on a card.

Kernel time comes from the analytical model below or from the cycles an RTL simulation measured.

- Embedding lookups (memory bound): each table sits in its own HBM pseudo channel / DDR channel
  (tables are spread round-robin when there are more tables than channels). One AXI master per
  table issues random row reads; by Little's law it sustains at most ``outstanding / latency``
  reads a second, and never more than ``channel_bandwidth / row_bytes``.
- MLPs (hls4ml *latency* strategy, ``io_parallel``): every layer fully unrolled over
  ``n_in * n_out / reuse_factor`` multipliers; a layer's latency is ``reuse_factor - 1`` cycles of
  multiplier reuse + the DSP pipeline + a ``ceil(log2 n_in)``-level adder tree + one cycle for the
  activation; the network accepts a new sample every ``II = reuse_factor`` cycles (or slower when
  the input row needs more than one 512-bit AXI beat).
- hls4ml *resource* strategy convolutions with ``io_stream`` (used to validate against a real HLS
  report): one input pixel every ``reuse_factor`` cycles plus the pipeline depth.

All constants come from :mod:`offload.hls.cards` (with their sources) or are the named assumptions
below; nothing here is fitted to a synthesis report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from offload.hls.cards import (HOST_CARD_ROUND_TRIP_S, KERNEL_LAUNCH_S, M_AXI_OUTSTANDING_READS, PCIE_TRANSFER_LATENCY_S,
                               PERSISTENT_POLL_INTERVAL_S, Card, ring_memory)
from offload.sim.errors import InputError, InputTypeError

__all__ = ["Prediction", "predict_lookup", "predict_mlp", "predict_conv_stream", "mlp_layer_cycles", "dsp_per_mult", "transfer_s",
           "LAUNCHES", "CARD_RING_SYNCS", "check_launch", "per_call_costs", "persistent_costs"]

# DSP48E2 (UltraScale+) multiplies 27 x 18 bits (UG579, "DSP48E2 slice"); DSP48E1 (7-series) 25 x 18 (UG479).
DSP48E2_A, DSP48E2_B = 27, 18
DSP48E1_A, DSP48E1_B = 25, 18
# Pipeline registers HLS puts around a DSP multiply at 200-300 MHz (A/B input, M, P registers): 3.
DSP_PIPELINE_CYCLES = 3
# One cycle to register the activation (ReLU is a compare; table-lookup sigmoid/tanh are one BRAM read).
ACTIVATION_CYCLES = 1
# 512-bit m_axi data width (the widest HLS m_axi port; HBM AXI ports are 256-bit, DDR 512-bit).
AXI_BYTES_PER_BEAT = 64
# hls4ml's adder trees chain about one 2-input add level per cycle at 300 MHz for 32-bit accumulators.
ADD_LEVELS_PER_CYCLE = 1
# Rough LUT cost: one accum_bits-wide adder (accum_bits LUTs) per multiplier for the tree, and
# a fixed ~200 LUTs of control per layer. Order-of-magnitude only (the report says so).
CONTROL_LUTS_PER_LAYER = 200
BRAM36_BITS = 36 * 1024
# UltraRAM block: 4K deep x 72 bits (288 Kb), one read port a cycle per block (UG573, "UltraRAM").
URAM_DEPTH, URAM_BITS_WIDE = 4096, 72
# Our placement policy (not a hardware limit): a table goes on chip only if it takes at most a
# quarter of the card's URAM, leaving room for the other tables and the MLP weights.
URAM_TABLE_MAX_FRACTION = 0.25


@dataclass(frozen=True)
class Prediction:
    """Predicted card latency (seconds) split in parts, and resources."""

    transfer_s: float
    launch_s: float
    kernel_s: float
    kernel_cycles: int = 0
    resources: dict[str, float] = field(default_factory=dict)
    launch: str = "per_call"  # the launch mode the transfer and launch parts are for

    @property
    def total_s(self) -> float:
        return self.transfer_s + self.launch_s + self.kernel_s


def transfer_s(card: Card, bytes_in: Sequence[int], bytes_out: Sequence[int]) -> float:
    """Host<->card time: a fixed cost per buffer sync plus bytes over the effective PCIe bandwidth."""
    n = len(bytes_in) + len(bytes_out)
    return n * PCIE_TRANSFER_LATENCY_S + (sum(bytes_in) + sum(bytes_out)) / card.pcie_bps


def per_call_costs(card: Card, bytes_in: Sequence[int], bytes_out: Sequence[int]) -> tuple[float, float]:
    """(transfer, launch) seconds of one call that syncs every buffer and starts one ``xrt::run``."""
    return transfer_s(card, bytes_in, bytes_out), KERNEL_LAUNCH_S


# A ring in card memory is written and read by DMA in the order offload.kernels.ring prescribes:
# the slot's inputs, then its request word; the response word, then the outputs. One sync each.
CARD_RING_SYNCS = 4


def persistent_costs(card: Card, bytes_in: Sequence[int], bytes_out: Sequence[int]) -> tuple[float, float]:
    """(transfer, launch) seconds of one request to a kernel that is already running.

    Ring in host memory: one small host-card round trip plus the bytes over PCIe (the kernel reads
    the inputs from and writes the outputs to host memory, no buffer sync), and the wait until the
    kernel loop's next poll sees the request. Ring in card memory: :data:`CARD_RING_SYNCS` buffer
    syncs plus the bytes, and one read of card memory for the kernel's poll (the host's one
    sync of the response word assumes the kernel has answered by then: it takes nanoseconds)."""
    wire = (sum(bytes_in) + sum(bytes_out)) / card.pcie_bps
    if ring_memory(card).host:
        return HOST_CARD_ROUND_TRIP_S + wire, PERSISTENT_POLL_INTERVAL_S
    return CARD_RING_SYNCS * PCIE_TRANSFER_LATENCY_S + wire, card.memory.random_read_latency_s


# Launch mode -> (card, bytes in per buffer, bytes out per buffer) -> (transfer_s, launch_s).
LAUNCHES: dict[str, Callable[[Card, Sequence[int], Sequence[int]], tuple[float, float]]] = {
    "per_call": per_call_costs,
    "persistent": persistent_costs,
}


def check_launch(launch: object, extra: Sequence[str] = ()) -> str:
    """``launch`` if it names a launch mode of :data:`LAUNCHES` (or one of ``extra``), else a typed error."""
    known = (*LAUNCHES, *extra)
    if not isinstance(launch, str):
        raise InputTypeError(f"launch: expected one of {list(known)}, got {type(launch).__name__}")
    if launch not in known:
        raise InputError(f"launch: expected one of {list(known)}, got {launch!r}")
    return launch


def dsp_per_mult(a_bits: int, b_bits: int, dsp_a: int = DSP48E2_A, dsp_b: int = DSP48E2_B) -> int:
    """DSP slices for one ``a_bits x b_bits`` multiply: tiles of the DSP's multiplier (larger operand on the wide port)."""
    a, b = max(a_bits, b_bits), min(a_bits, b_bits)
    return math.ceil(a / dsp_a) * math.ceil(b / dsp_b)


def predict_lookup(card: Card, lookups_per_table: Sequence[int], row_bytes: Sequence[int], batch: int,
                   index_bytes: int = 4, out_bytes_per_value: int = 8, dims: Sequence[int] = (),
                   rows_per_table: Sequence[int] = (), accum_bits: int = 48, launch: str = "per_call") -> Prediction:
    """One table-batched lookup call: ``lookups_per_table[t]`` random rows of ``row_bytes[t]`` from table t,
    launched as ``launch`` says (a key of :data:`LAUNCHES`).

    Tables small enough (``URAM_TABLE_MAX_FRACTION`` of the card's URAM each, while URAM lasts) are
    placed on chip in URAM and read one row a cycle; the others live in HBM/DDR.
    """
    costs = LAUNCHES[check_launch(launch)]
    mem = card.memory
    channels, ch_bps, lat = mem.banks, mem.bank_bps, mem.random_read_latency_s
    rows_per_table = list(rows_per_table) or [0] * len(row_bytes)
    per_channel = [0.0] * channels
    on_chip = 0.0
    uram_left, uram_used, mem_bytes = card.uram, 0, 0
    for t, (n, rb, rows) in enumerate(zip(lookups_per_table, row_bytes, rows_per_table)):
        urams = math.ceil(rb * 8 / URAM_BITS_WIDE) * math.ceil(rows / URAM_DEPTH) if rows else 0
        if rows and urams <= uram_left and urams <= URAM_TABLE_MAX_FRACTION * card.uram:
            uram_left -= urams
            uram_used += urams
            on_chip = max(on_chip, n / card.kernel_clock_hz)  # one row a cycle from a width-partitioned URAM
            continue
        mem_bytes += rows * rb
        burst = math.ceil(rb / AXI_BYTES_PER_BEAT) * AXI_BYTES_PER_BEAT
        per_read = max(lat / M_AXI_OUTSTANDING_READS, burst / ch_bps)
        per_channel[t % channels] += n * per_read
    dims = list(dims) or [rb // 2 for rb in row_bytes]
    out_bytes = batch * sum(dims) * out_bytes_per_value
    # Pooled rows stream out while later bags are read (dataflow), through one AXI port into one
    # memory channel: the slower of reads and writes sets the pace; the last read's latency shows.
    write = out_bytes / min(AXI_BYTES_PER_BEAT * card.kernel_clock_hz, ch_bps)
    kernel = max(max(per_channel), on_chip, write) + (lat if any(per_channel) else 0.0)
    n_idx = sum(lookups_per_table)
    t_xfer, t_launch = costs(card, [n_idx * index_bytes, (len(lookups_per_table) * batch + 1) * index_bytes], [out_bytes])
    # Pooling: one accum_bits adder per output lane of every table.
    res = {"DSP": 0, "BRAM36": 0, "URAM": uram_used, "LUT": sum(dims) * accum_bits + CONTROL_LUTS_PER_LAYER * len(dims), "HBM_bytes": mem_bytes}
    return Prediction(t_xfer, t_launch, kernel, int(kernel * card.kernel_clock_hz), res, launch)


def mlp_layer_cycles(n_in: int, reuse_factor: int) -> int:
    """Latency of one hls4ml latency-strategy dense layer (+ activation) in cycles."""
    tree = math.ceil(math.log2(max(n_in, 2)) / ADD_LEVELS_PER_CYCLE)
    return (reuse_factor - 1) + DSP_PIPELINE_CYCLES + tree + ACTIVATION_CYCLES


def predict_mlp(card: Card, sizes: Sequence[int], batch: int, reuse_factor: int = 1, weight_bits: int = 16,
                data_bits: int = 16, accum_bits: int = 32, in_bytes_per_value: int = 4, out_bytes_per_value: int = 8,
                rtl_cycles: int | None = None, rtl_resources: Mapping[str, float] | None = None,
                launch: str = "per_call", rtl_ii_cycles: int | None = None) -> Prediction:
    """An MLP with layer widths ``sizes`` (``[n_in, h1, ..., n_out]``) over ``batch`` samples,
    launched as ``launch`` says (a key of :data:`LAUNCHES`).

    ``rtl_cycles`` (measured by ``MLP.to_rtl``'s Verilator testbench) replaces the modelled
    pipeline latency, with II = ``rtl_ii_cycles`` (default 1: the da4ml pipeline takes a row every
    cycle); ``rtl_resources`` (Yosys counts) replace the modelled LUT/DSP/BRAM.

    Example::

        predict_mlp(CARDS["u55c"], [16, 32, 16, 1], batch=1, launch="persistent").total_s
    """
    costs = LAUNCHES[check_launch(launch)]
    if len(sizes) < 2:
        raise ValueError(f"sizes: need at least [n_in, n_out], got {list(sizes)}")
    layers = list(zip(sizes[:-1], sizes[1:]))
    latency = sum(mlp_layer_cycles(i, reuse_factor) for i, _ in layers)
    row_ii = reuse_factor
    if rtl_cycles is not None:
        if int(rtl_cycles) < 1:
            raise ValueError(f"rtl_cycles must be >= 1, got {rtl_cycles!r}")
        row_ii = 1 if rtl_ii_cycles is None else int(rtl_ii_cycles)
        if row_ii < 1:
            raise ValueError(f"rtl_ii_cycles must be >= 1, got {rtl_ii_cycles!r}")
        latency, reuse_factor = int(rtl_cycles), 1
    beats_in = math.ceil(sizes[0] * in_bytes_per_value / AXI_BYTES_PER_BEAT)
    ii = max(row_ii, beats_in)
    cycles = latency + (batch - 1) * ii + beats_in
    mults = sum(math.ceil(i * o / reuse_factor) for i, o in layers)
    weights = sum(i * o for i, o in layers)
    dsp = mults * dsp_per_mult(weight_bits, data_bits)
    # reuse 1: weights are constants folded into the multipliers; reuse > 1: each multiplier reads
    # its reuse_factor weights from a memory (hls4ml partitions the weight array by n_in*n_out/R).
    bram = 0 if reuse_factor == 1 else math.ceil(weights * weight_bits / BRAM36_BITS)
    lut = mults * accum_bits + CONTROL_LUTS_PER_LAYER * len(layers)
    t_xfer, t_launch = costs(card, [batch * sizes[0] * in_bytes_per_value], [batch * sizes[-1] * out_bytes_per_value])
    res = {"DSP": dsp, "BRAM36": bram, "URAM": 0, "LUT": lut, "HBM_bytes": 0}
    if rtl_resources is not None:
        res.update({"DSP": rtl_resources["DSP"], "BRAM36": rtl_resources["BRAM"], "LUT": rtl_resources["LUT"]})
    return Prediction(t_xfer, t_launch, cycles / card.kernel_clock_hz, cycles, res, launch)


def predict_conv_stream(in_pixels: int, n_chan: int, n_filt: int, kernel: int, reuse_factor: int,
                        weight_bits: int, data_bits: int, dsp_a: int = DSP48E2_A, dsp_b: int = DSP48E2_B) -> tuple[int, int]:
    """(cycles, DSPs) of an hls4ml resource-strategy ``io_stream`` convolution (line-buffer implementation).

    Each padded input pixel is read once; an output pixel costs the ``reuse_factor`` cycles of the
    multiplier reuse loop plus the DSP pipeline and an accumulate, so the worst case (every pixel
    produces an output) is ``in_pixels * (reuse_factor + DSP_PIPELINE_CYCLES + 2)``.
    """
    cycles = in_pixels * (reuse_factor + DSP_PIPELINE_CYCLES + 2)
    mults = math.ceil(n_chan * kernel * n_filt / reuse_factor)
    return cycles, mults * dsp_per_mult(weight_bits, data_bits, dsp_a, dsp_b)

"""The open RTL tier: an ``mlp`` kernel as da4ml Verilog, run by Verilator, synthesised by Yosys.

- :mod:`~offload.hls.rtl.emit`: trace the spec's fixed-point datapath with da4ml, write pipelined Verilog.
- :mod:`~offload.hls.rtl.sim`: C++ testbench, cached Verilator build, cycle-accurate runs.
- :mod:`~offload.hls.rtl.stream`: ``offload_stream``, the pipeline behind AXI4-Stream request/response ports.
- :mod:`~offload.hls.rtl.stream_sim`: its testbench (tags, backpressure), latency and initiation interval.
- :mod:`~offload.hls.rtl.yosys`: ``synth_xilinx -family xcup`` resource counts.
- :mod:`~offload.hls.rtl.tools`: finding the tools (ToolchainMissing naming the one that is not there).
- :mod:`~offload.hls.rtl.model`: :class:`RtlModel`, what ``offload.nn.MLP.to_rtl`` returns.
"""

from offload.hls.rtl.model import RtlModel, RtlSummary
from offload.hls.rtl.stream_sim import StreamCycles

__all__ = ["RtlModel", "RtlSummary", "StreamCycles"]

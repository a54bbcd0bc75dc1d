"""Check the advisor's analytical HLS model against a real C-synthesis report.

The fixture ``vivado-2019.2-hls4ml-autoencoder`` is Vivado HLS 2019.2's report of an
hls4ml-generated convolutional autoencoder (public project ChiRuiChen/AutoEncoder_hls4ml, part
xc7z020, 5 ns clock). Its layer configuration, read from that project's ``firmware/parameters.h``
and ``hls4ml_config.yml`` (ap_fixed<32,16> everywhere, Resource strategy, io_stream, line-buffer
convolutions), is written down in :data:`AUTOENCODER_CONVS`. We predict each convolution's
worst-case latency and DSP count with :func:`offload.advisor.model.predict_conv_stream` (7-series
DSP48E1: 25 x 18 multipliers) and put the report's numbers next to them. Nothing is fitted.

The report is committed at
``tests/fixtures/hls-reports/vivado-2019.2-hls4ml-autoencoder/myproject_csynth.rpt``; callers pass
its path (this module ships without it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from offload.advisor.model import DSP48E1_A, DSP48E1_B, predict_conv_stream
from offload.hls.reports import ReportError, parse_instances

__all__ = ["ConvLayer", "AUTOENCODER_CONVS", "LayerCheck", "check_autoencoder"]


@dataclass(frozen=True)
class ConvLayer:
    config: int          # hls4ml config number (instance conv_2d_cl_..._config{N}_U0)
    in_hw: int           # padded input height = width (the zero-padding layer runs before it)
    n_chan: int
    n_filt: int
    reuse_factor: int


# From parameters.h (config{N}: in_height/in_width after padding, n_chan, n_filt, reuse_factor);
# the network is 32x32x1 -> [pad, conv 3x3, relu, maxpool 2] x3 -> conv -> [upsample, pad, conv] x3.
AUTOENCODER_CONVS: tuple[ConvLayer, ...] = (
    ConvLayer(2, 34, 1, 8, 9),
    ConvLayer(5, 18, 8, 4, 72),
    ConvLayer(8, 10, 4, 4, 36),
    ConvLayer(11, 6, 4, 4, 36),
    ConvLayer(14, 10, 4, 4, 36),
    ConvLayer(17, 18, 4, 8, 36),
    ConvLayer(20, 34, 8, 1, 72),
)
AUTOENCODER_BITS = 32  # ap_fixed<32,16> weights and data (hls4ml_config.yml: Model Precision)


@dataclass(frozen=True)
class LayerCheck:
    name: str
    predicted_cycles: int
    reported_cycles: int
    predicted_dsp: int
    reported_dsp: int

    @property
    def cycles_ratio(self) -> float:
        return self.predicted_cycles / self.reported_cycles

    @property
    def dsp_ratio(self) -> float:
        return self.predicted_dsp / self.reported_dsp if self.reported_dsp else float("inf")


def check_autoencoder(rpt: str | Path) -> list[LayerCheck]:
    """Predicted vs reported worst-case latency and DSPs of every convolution of the fixture."""
    instances = parse_instances(rpt)
    out = []
    for layer in AUTOENCODER_CONVS:
        inst = next((v for k, v in instances.items() if k.startswith("conv_2d_cl") and k.endswith(f"_config{layer.config}_U0")), None)
        if inst is None or inst.latency_max is None or "DSP" not in inst.resources:
            raise ReportError(f"{rpt}: no conv instance with a latency and a DSP count for config{layer.config}")
        cycles, dsps = predict_conv_stream(layer.in_hw * layer.in_hw, layer.n_chan, layer.n_filt, 9, layer.reuse_factor,
                                           AUTOENCODER_BITS, AUTOENCODER_BITS, DSP48E1_A, DSP48E1_B)
        out.append(LayerCheck(f"conv config{layer.config}", cycles, inst.latency_max, dsps, inst.resources["DSP"]))
    return out

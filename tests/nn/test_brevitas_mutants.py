"""MLP.from_brevitas at the edges its mutants reached (TESTING.md, mutation testing): per-channel
power-of-two weight scales, a scale that rounds up to a power of two, the fraction bits of a float
bias, Brevitas's float32 exactness where accumulators pass 2**24 units, and the sigmoid/tanh table
bounds as the module's docstring defines them. The oracles are Brevitas's forward, its integer
weights and scales, and hand-derived types; never offload's simulator alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

qnn = pytest.importorskip("brevitas.nn")
from brevitas.quant import (  # noqa: E402
    Int8ActPerTensorFixedPoint,
    Int8WeightPerTensorFixedPoint,
    Int8WeightPerTensorFloat,
    Uint8ActPerTensorFixedPoint,
)

from _brevitas_util import brevitas_out, calibrated  # noqa: E402
from offload.nn import MLP  # noqa: E402
from offload.sim.errors import UnsupportedError  # noqa: E402


class PerChannelFixedPoint(Int8WeightPerTensorFixedPoint):
    """Brevitas's fixed-point weight quantizer with one power-of-two scale per output channel."""

    scaling_per_output_channel = True


def _calibrated(net: torch.nn.Sequential, n_in: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return calibrated(net, n_in)


def _x(n_in: int, seed: int, n: int = 800) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(n, n_in)) * 2).astype(np.float32).astype(np.float64)


def test_per_channel_power_of_two_weight_scales_equal_brevitas_bit_for_bit():
    net = torch.nn.Sequential(
        qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True),
        qnn.QuantLinear(6, 3, bias=False, weight_bit_width=4, weight_quant=PerChannelFixedPoint, return_quant_tensor=True),
        qnn.QuantIdentity(bit_width=8, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True))
    with torch.no_grad():  # three channels three powers of two apart, none of them at scale 1
        net[1].weight[:] = torch.tensor([[0.1] * 6, [0.6] * 6, [2.0] * 6]) * torch.tensor([1, -1, 1, -1, 1, -0.5])
    net = _calibrated(net, 6)
    scales = net[1].quant_weight().scale.detach().flatten().numpy()
    assert len(set(scales.tolist())) == 3 and scales.max() != 1.0 and np.all(np.log2(scales) == np.round(np.log2(scales)))
    mlp = MLP.from_brevitas(net, device="sim")
    x = _x(6, 1)
    want = brevitas_out(net, x)
    assert int(np.sum(mlp.simulate(x) != want)) == 0 and len(np.unique(want)) > 10


@pytest.mark.parametrize("max_w, scale", [(5.25, 0.75), (8.75, 1.25)])  # log2: -0.42 rounds up to 0, 0.32 down to 0
def test_a_scale_near_a_power_of_two_is_refused_naming_it(max_w, scale):
    lin = qnn.QuantLinear(4, 2, bias=False, weight_bit_width=4, weight_quant=Int8WeightPerTensorFloat)
    with torch.no_grad():
        lin.weight[:] = torch.tensor([[max_w, 1, -1, 1], [1, -1, 1, 1.0]])
    assert float(lin.quant_weight().scale.detach()) == scale  # max|w| / 7: Brevitas's own scale
    net = torch.nn.Sequential(qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True), lin).eval()
    # the value as NumPy prints a float64 scalar, in either NumPy's repr
    with pytest.raises(UnsupportedError, match=rf"layer '1' \(QuantLinear\) weight: scale {scale} is not a power of two"):
        MLP.from_brevitas(net, device="sim")


def test_a_float_bias_is_typed_with_the_fewest_bits_that_hold_it():
    def net_with(bias):
        net = torch.nn.Sequential(
            qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True),
            qnn.QuantLinear(4, len(bias), bias=True, weight_bit_width=4, weight_quant=Int8WeightPerTensorFixedPoint,
                            bias_quant=None, return_quant_tensor=True))
        net = _calibrated(net, 4)
        with torch.no_grad():
            net[1].bias[:] = torch.tensor(bias)
        return MLP.from_brevitas(net, device="sim").brevitas.rows[1]

    # 0.375 = 0.011b: 3 fraction bits; |0.5| < 1: one integer bit, the sign's.
    assert net_with([0.5, -0.25, 0.375]).types["bias"] == "ap_fixed<4,1,AP_RND_CONV,AP_SAT>"
    # float32's 0.3 is 5033165 x 2**-24 (an odd integer): 24 fraction bits, under the 40 cap.
    assert float(np.float32(0.3)) * 2**24 == 5033165
    assert net_with([0.3, 0.5]).types["bias"] == "ap_fixed<25,1,AP_RND_CONV,AP_SAT>"


def test_accumulators_past_2_24_units_are_not_float32_exact():
    """4096 inputs of 8 bits times 8-bit weights near their largest: the integer accumulator's bound
    (Brevitas's own integers) passes 2**24, so Brevitas's float32 forward is not exact there."""
    n = 4096
    net = torch.nn.Sequential(
        qnn.QuantIdentity(bit_width=8, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True),
        qnn.QuantLinear(n, 1, bias=False, weight_bit_width=8, weight_quant=Int8WeightPerTensorFixedPoint, return_quant_tensor=True),
        qnn.QuantIdentity(bit_width=8, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True))
    with torch.no_grad():
        net[1].weight[:] = torch.where(torch.arange(n) % 2 == 0, 0.99, -0.99)
    net = _calibrated(net, n)
    w_int = net[1].quant_weight().int().detach().numpy().astype(np.int64)
    bound = int(np.abs(w_int).sum()) * 2 ** 7  # |x_int| <= 128 for 8 signed bits
    assert bound >= 2**24
    mlp = MLP.from_brevitas(net, device="sim")
    (dense,) = [r for r in mlp.brevitas.rows if r.module == "QuantLinear"]
    assert dense.exact_in_float32 is False and not mlp.brevitas.bit_exact


@pytest.mark.parametrize("op, span, slope", [("sigmoid", 16.0, 0.25), ("tanh", 8.0, 1.0)])
def test_table_bounds_are_the_documented_sum_and_hold(op, span, slope):
    """hls4ml's table: 1024 entries over [-8, 8) (tanh [-4, 4)), entries in ap_fixed<18,2> (lsb
    2**-16): bound = step x largest slope + a table lsb + an output step."""
    act = (qnn.QuantSigmoid if op == "sigmoid" else qnn.QuantTanh)(
        bit_width=8, act_quant=Uint8ActPerTensorFixedPoint if op == "sigmoid" else Int8ActPerTensorFixedPoint, return_quant_tensor=True)
    net = torch.nn.Sequential(
        qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True),
        qnn.QuantLinear(6, 4, bias=False, weight_bit_width=6, weight_quant=Int8WeightPerTensorFixedPoint, return_quant_tensor=True),
        act)
    net = _calibrated(net, 6, seed=3)
    out_lsb = float(act.act_quant.scale())
    mlp = MLP.from_brevitas(net, device="sim")
    (row,) = [r for r in mlp.brevitas.rows if r.kernel_layer.startswith(op)]
    assert row.table_bound == pytest.approx(span / 1024 * slope + 2.0**-16 + out_lsb, rel=1e-12)
    x = _x(6, 5)
    assert np.abs(mlp.simulate(x) - brevitas_out(net, x)).max() <= row.table_bound

"""MLP.from_brevitas: a Brevitas network's quantized forward, bit for bit, as an mlp kernel.

The oracle is Brevitas's own forward (its quantizers, its float32 arithmetic), never offload's
simulator. Inputs include the input grid's rounding ties (half-even in Brevitas, AP_RND_CONV in
the kernel: a mapping to AP_RND would fail on them) and values far outside every range
(saturation at every quantizer).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

qnn = pytest.importorskip("brevitas.nn")
from brevitas.quant import (  # noqa: E402
    Int8ActPerTensorFixedPoint,
    Int8ActPerTensorFloat,
    Int8WeightPerTensorFixedPoint,
    Int8WeightPerTensorFloat,
    Int32Bias,
    Uint8ActPerTensorFixedPoint,
)

from _brevitas_util import brevitas_out, calibrated  # noqa: E402
from offload.nn import MLP  # noqa: E402
from offload.sim.errors import UnsupportedError  # noqa: E402
from offload.sim.fixed import FixedType  # noqa: E402


def _net(bits: int = 4, bias_quant=Int32Bias, n_in: int = 10, sizes=(16, 8), last=None, seed: int = 0, rounding: str = "round"
         ) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    r = {"float_to_int_impl_type": rounding}
    layers = [qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True, **r)]
    width = n_in
    for h in sizes:
        layers += [qnn.QuantLinear(width, h, bias=True, weight_bit_width=bits, weight_quant=Int8WeightPerTensorFixedPoint,
                                   bias_quant=bias_quant, return_quant_tensor=True),
                   qnn.QuantReLU(bit_width=bits, act_quant=Uint8ActPerTensorFixedPoint, return_quant_tensor=True, **r)]
        width = h
    layers.append(qnn.QuantLinear(width, 1, bias=True, weight_bit_width=bits, weight_quant=Int8WeightPerTensorFixedPoint,
                                  bias_quant=bias_quant, return_quant_tensor=True))
    layers.append(last if last is not None else qnn.QuantIdentity(bit_width=8, act_quant=Int8ActPerTensorFixedPoint,
                                                                  return_quant_tensor=True, **r))
    return calibrated(torch.nn.Sequential(*layers), n_in)  # a few batches set the learned scales' statistics


def _rows(mlp: MLP, n_in: int, rng: np.random.Generator) -> np.ndarray:
    t = FixedType.parse(mlp.spec.input_type)
    return np.concatenate([
        rng.normal(size=(2000, n_in)) * 2,
        (np.floor(rng.normal(size=(500, n_in)) * 2 / t.lsb) + 0.5) * t.lsb,  # input ties
        rng.normal(size=(200, n_in)) * 100,  # saturates every quantizer
    ]).astype(np.float32).astype(np.float64)  # Brevitas reads float32


@pytest.mark.parametrize("bits, rounding", [(4, "round"), (6, "round"), (4, "floor")])
def test_simulate_equals_brevitas_bit_for_bit(bits, rounding):
    net = _net(bits, rounding=rounding)
    mlp = MLP.from_brevitas(net, device="sim")
    assert all(("AP_TRN" if rounding == "floor" else "AP_RND_CONV") in t["result"] for t in mlp.brevitas.types.values() if "weight" not in t)
    x = _rows(mlp, 10, np.random.default_rng(bits))
    want = brevitas_out(net, x)
    got = mlp.simulate(x)
    assert mlp.brevitas.bit_exact and mlp.brevitas.max_output_deviation == 0.0
    assert int(np.sum(got != want)) == 0
    assert np.array_equal(mlp(torch.from_numpy(x)).numpy(), got)  # the device runs the same kernel
    assert len(np.unique(want)) > 20  # the output is not a constant that any mapping would match


def test_rounding_and_saturation_modes_map_to_ap_types():
    mlp = MLP.from_brevitas(_net(4), device="sim")
    assert str(mlp.spec.input_type) == "ap_fixed<6,1,AP_RND_CONV,AP_SAT>" or "AP_RND_CONV,AP_SAT>" in str(mlp.spec.input_type)
    fc0 = next(layer for layer in mlp.spec.layers if layer.op == "dense")
    assert fc0.weight.overflow == "AP_SAT_SYM"  # Brevitas's weight quantizers are narrow range
    relu = next(layer for layer in mlp.spec.layers if layer.op == "relu")
    assert str(relu.result).startswith("ap_ufixed<4,") and relu.result.rounding == "AP_RND_CONV"


def test_float_bias_within_the_documented_bound():
    net = _net(4, bias_quant=None, seed=1)
    mlp = MLP.from_brevitas(net, device="sim")
    x = _rows(mlp, 10, np.random.default_rng(7))
    d = np.abs(mlp.simulate(x) - brevitas_out(net, x))
    assert not mlp.brevitas.bit_exact and any(r.float_bias for r in mlp.brevitas.rows)
    out_lsb = FixedType.parse(mlp.spec.layers[-1].result).lsb
    assert mlp.brevitas.max_output_deviation == out_lsb
    assert d.max() <= out_lsb
    assert np.mean(d > 0) < 0.01  # a tie hit by float32 rounding is rare


def test_sigmoid_within_its_table_bound():
    last = qnn.QuantSigmoid(bit_width=8, act_quant=Uint8ActPerTensorFixedPoint, return_quant_tensor=True)
    net = _net(6, last=last, seed=2)
    mlp = MLP.from_brevitas(net, device="sim")
    x = _rows(mlp, 10, np.random.default_rng(3))
    d = np.abs(mlp.simulate(x) - brevitas_out(net, x))
    bound = mlp.brevitas.max_output_deviation
    assert 0 < bound < 0.05 and d.max() <= bound


@pytest.mark.parametrize("bad, match", [
    (lambda: torch.nn.Sequential(qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True),
                                 qnn.QuantLinear(4, 2, bias=False, weight_bit_width=4, weight_quant=Int8WeightPerTensorFloat)),
     r"layer '1' \(QuantLinear\) weight: scale .* is not a power of two"),
    (lambda: torch.nn.Sequential(qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFloat, return_quant_tensor=True),
                                 qnn.QuantLinear(4, 2, bias=False, weight_bit_width=4, weight_quant=Int8WeightPerTensorFixedPoint)),
     r"layer '0' \(QuantIdentity\): scale .* is not a power of two"),
    (lambda: torch.nn.Sequential(qnn.QuantLinear(4, 2, bias=False, weight_bit_width=4, weight_quant=Int8WeightPerTensorFixedPoint)),
     r"layer '0' \(QuantLinear\): the network has no input quantizer"),
    (lambda: torch.nn.Sequential(qnn.QuantIdentity(bit_width=6, act_quant=Int8ActPerTensorFixedPoint, return_quant_tensor=True),
                                 torch.nn.Conv1d(1, 1, 3)),
     r"layer '1' \(Conv1d\) has no kernel counterpart"),
])
def test_what_does_not_map_is_refused_with_the_layer_named(bad, match):
    net = bad().train()
    with torch.no_grad():  # learned scales take their statistics' values
        try:
            net(torch.randn(64, 4) * 3)
        except RuntimeError:  # the Conv1d case: shapes are not the point there
            pass
    with pytest.raises(UnsupportedError, match=match) as e:
        MLP.from_brevitas(net.eval(), device="sim")
    assert isinstance(e.value, NotImplementedError)


@pytest.mark.hls
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_hls4ml_csim_equals_simulate(tmp_path):
    net = _net(4, sizes=(8,), n_in=6, seed=4)
    mlp = MLP.from_brevitas(net, device="sim")
    x = _rows(mlp, 6, np.random.default_rng(5))[::10]
    model = mlp.to_hls4ml(tmp_path)
    model.compile()
    want = np.asarray(model.predict(np.ascontiguousarray(x))).reshape(len(x), -1)
    assert np.array_equal(mlp.simulate(x), want)
    assert np.array_equal(brevitas_out(net, x), want)


@pytest.mark.rtl
@pytest.mark.parametrize("rounding", ["round", "floor"])  # half to even (AP_RND_CONV), floor (AP_TRN)
def test_verilator_rtl_equals_simulate(tmp_path, rounding):
    net = _net(4, sizes=(8,), n_in=6, seed=4, rounding=rounding)
    mlp = MLP.from_brevitas(net, device="sim")
    assert any("AP_RND_CONV" in str(layer.result) for layer in mlp.spec.layers) == (rounding == "round")
    x = _rows(mlp, 6, np.random.default_rng(6))[::5]
    rtl = mlp.to_rtl(str(tmp_path / "rtl"), clock_mhz=300).compile()
    assert np.array_equal(rtl.predict(x), mlp.simulate(x))
    assert np.array_equal(rtl.predict(x), brevitas_out(net, x))

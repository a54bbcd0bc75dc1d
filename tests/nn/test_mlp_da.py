"""strategy="distributed_arithmetic": the spec field, its contract, and the simulator's DA semantics.

The oracle for a DA Dense layer is written here from hls4ml/da4ml's sources (see
``offload.sim.mlp.strategy``), independently of the simulator: the exact sum
``sum_i x_i * w_i + b`` in Python integers, then one cast into the layer's ``result_t``. The
hls4ml C-simulation itself is compared in ``tests/hls/test_mlp_da_hls4ml.py``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

import offload
from mlp_cases import adversarial_inputs, random_spec
from offload.kernels.mlp import MlpSpec, run_rows
from offload.sim.errors import InputError
from offload.sim.fixed import FixedType
from offload.sim.mlp import forward, simulate

DA = "distributed_arithmetic"


def _da_spec(spec: MlpSpec) -> MlpSpec:
    """The same network under DA: the accumulators are dropped (the spec derives the exact ones)."""
    layers = tuple(replace(la, accum=None) if la.op == "dense" else la for la in spec.layers)
    return MlpSpec(spec.n_features, spec.input_type, layers, dict(spec.constants), 1, strategy=DA)


def _exact_dense_oracle(x_raw: np.ndarray, xt: FixedType, layer, tensors) -> np.ndarray:
    """result_t(sum x*w + b), the sum in Python integers on the finest grid of its terms."""
    wt, rt = FixedType.parse(layer.weight), FixedType.parse(layer.result)
    w = tensors[f"{layer.name}.weight"].astype(object)
    f = xt.F + wt.F
    acc = x_raw.astype(object) @ w
    if layer.use_bias:
        bt = FixedType.parse(layer.bias)
        fb = max(f, bt.F)
        acc = acc * (1 << (fb - f)) + tensors[f"{layer.name}.bias"].astype(object) * (1 << (fb - bt.F))
        f = fb
    worst = max(int(np.abs(acc).max()), 1)
    src = FixedType(worst.bit_length() + 1, worst.bit_length() + 1 - f, True)
    return rt.cast(acc.astype(np.int64), src)


@pytest.mark.parametrize("seed", [11, 12, 16, 21])
def test_da_dense_is_the_exact_sum_cast_once(seed):
    # random_spec's narrow accumulators round every product and saturate or wrap while summing:
    # under latency they change the outputs, under DA they must not exist.
    lat, _ = random_spec(seed)
    da = _da_spec(lat)
    rng = np.random.default_rng(seed)
    x = adversarial_inputs(rng, 4000, da.n_features, da.input_type)
    tensors = da.tensors()
    _, steps = forward(da.input_type, da.layers, tensors, x, trace=True)
    checked = 0
    for (_, x_raw, xt), layer, (_, y_raw, _) in zip(steps, da.layers, steps[1:]):
        if layer.op == "dense":
            np.testing.assert_array_equal(y_raw, _exact_dense_oracle(x_raw, xt, layer, tensors), err_msg=layer.name)
            checked += 1
    assert checked >= 2
    # The kind's fast path (the fused program), in small batches, gives the same rows.
    y = simulate(da.input_type, da.layers, tensors, x)
    y_fast = np.concatenate([run_rows(da.input_type, da.layers, tensors, x[i : i + 128]) for i in range(0, 1024, 128)])
    np.testing.assert_array_equal(y_fast, y[:1024])
    _, lat_steps = forward(lat.input_type, lat.layers, lat.tensors(), x, trace=True)
    assert any((a[1] != b[1]).any() for a, b in zip(steps, lat_steps)), "the narrow accumulators should matter under latency"


def test_da_spec_json_and_old_bundles():
    lat, _ = random_spec(11)
    da = _da_spec(lat)
    d = da.to_json()
    assert d["strategy"] == DA
    back = MlpSpec.from_json(json.loads(json.dumps(d)))
    assert back == da and back.strategy == DA
    # Latency specs write no strategy (their digests, names and golden vectors stay), and a spec
    # JSON without one (every bundle from before strategies) loads as latency.
    assert "strategy" not in lat.to_json()
    assert MlpSpec.from_json(lat.to_json()).strategy == "latency"
    assert da.digest() != lat.digest()
    with pytest.raises(ValueError, match="strategy"):
        MlpSpec.from_json({**d, "strategy": "resource"})


def test_da_spec_refuses_what_da_cannot_do():
    lat, _ = random_spec(12)
    da = _da_spec(lat)
    fc = next(la for la in da.layers if la.op == "dense")
    # An accumulator other than the exact one would make the simulator disagree with hls4ml.
    narrow = tuple(replace(la, accum="ap_fixed<10,4>") if la.name == fc.name else la for la in da.layers)
    with pytest.raises(ValueError, match=rf"layer '{fc.name}': accum ap_fixed<10,4> .*exact"):
        MlpSpec(da.n_features, da.input_type, narrow, dict(da.constants), 1, strategy=DA)
    # The exact one, spelled out, is accepted.
    assert MlpSpec(da.n_features, da.input_type, da.layers, dict(da.constants), 1, strategy=DA) == da
    with pytest.raises(ValueError, match="reuse_factor must be 1"):
        MlpSpec(da.n_features, da.input_type, da.layers, dict(da.constants), 2, strategy=DA)
    # da4ml reads weights as float32: a 26-bit weight type would not be exact.
    wide = tuple(replace(la, weight="ap_fixed<26,4>", accum=None) if la.name == fc.name else la for la in da.layers)
    with pytest.raises(ValueError, match="24 bits"):
        MlpSpec(da.n_features, da.input_type, wide, dict(da.constants), 1, strategy=DA)


def _seq(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 1), torch.nn.Sigmoid()).eval()


def test_from_float_strategy_attribute_and_errors():
    seq = _seq()
    x = np.random.default_rng(0).normal(size=(500, 6))
    lat = offload.nn.MLP.from_float(seq, calib=x, precision="ap_fixed<12,4,AP_RND,AP_SAT>", device="sim")
    assert lat.strategy == "latency" and lat.spec.strategy == "latency"
    da = offload.nn.MLP.from_float(seq, calib=x, precision="ap_fixed<12,4,AP_RND,AP_SAT>", strategy=DA, device="sim")
    assert da.strategy == DA and da.spec.strategy == DA
    # A plain type string sets the roles DA uses; the accumulators are the exact ones, also in the report.
    for layer in da.spec.layers:
        if layer.op == "dense":
            assert FixedType.parse(layer.accum).width > 12
    shown = {row.name: row.types for row in da.report.layers}
    assert shown["fc0"]["accum"] == str(da.spec.layers[0].accum)
    with pytest.raises(InputError, match=r"precision\['fc0'\]\['accum'\].*exact"):
        offload.nn.MLP.from_float(seq, precision={"default": "ap_fixed<12,4>", "fc0": {"accum": "ap_fixed<20,8>"}},
                                  n_features=6, strategy=DA, device="sim")
    with pytest.raises(InputError, match="reuse_factor must be 1"):
        offload.nn.MLP.from_float(seq, calib=x, precision="ap_fixed<12,4>", reuse_factor=2, strategy=DA, device="sim")
    with pytest.raises(InputError, match="strategy must be one of"):
        offload.nn.MLP.from_float(seq, calib=x, strategy="resource", device="sim")
    # The torch op on the sim device runs the DA kernel.
    xt = torch.from_numpy(x[:64].astype(np.float32))
    np.testing.assert_array_equal(da(xt).numpy(), da.simulate(x[:64].astype(np.float32)).astype(np.float32))


def test_auto_precision_searches_with_da():
    seq = _seq(1)
    x = np.random.default_rng(1).normal(size=(1000, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        da = offload.nn.MLP.from_float(seq, calib=x, precision="auto", strategy=DA, device="sim")
    assert da.strategy == DA and da.report.search["strategy"] == DA
    rows = {row.name: row for row in da.report.layers}
    # The searched types meet the cosine threshold on the DA datapath, and every Dense has its exact accumulator.
    assert min(r.cosine for r in rows.values()) >= 0.999
    for layer in da.spec.layers:
        if layer.op == "dense":
            assert rows[layer.name].types["accum"] == str(layer.accum)
    _, steps = forward(da.spec.input_type, da.spec.layers, da.spec.tensors(), x, trace=True)
    t = da.spec.tensors()
    np.testing.assert_array_equal(steps[1][1], _exact_dense_oracle(steps[0][1], steps[0][2], da.spec.layers[0], t))


def test_da_bias_finer_than_the_products_is_kept():
    # x: 4 fraction bits, w: 2, so products land on 2**-6; the bias has 14 fraction bits. DA adds it
    # exactly (da4ml's constant add), so a fine result type sees every bit of it.
    from offload.sim.mlp import MlpLayer

    rng = np.random.default_rng(3)
    w = rng.integers(-8, 8, size=(5, 3))
    b = rng.integers(-(1 << 15), 1 << 15, size=3)
    layer = MlpLayer("fc0", "dense", 5, 3, "ap_fixed<24,8,AP_RND,AP_SAT>", weight="ap_fixed<4,2>", bias="ap_fixed<16,2>")
    spec = MlpSpec(5, "ap_fixed<8,4>", (layer,), {"fc0.weight": w, "fc0.bias": b}, 1, strategy=DA)
    x = adversarial_inputs(rng, 2000, 5, spec.input_type)
    t = spec.tensors()
    _, steps = forward(spec.input_type, spec.layers, t, x, trace=True)
    np.testing.assert_array_equal(steps[1][1], _exact_dense_oracle(steps[0][1], steps[0][2], spec.layers[0], t))
    assert FixedType.parse(spec.layers[0].accum).F == 14

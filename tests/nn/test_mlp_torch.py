"""offload.nn.MLP and torch.ops.offload.mlp_score: module API, the op's contracts, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import offload
from offload.kernels import get_kind
from offload.kernels.mlp import MlpSpec


def _seq(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2),
    ).eval()


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(0)
    return offload.nn.MLP.from_float(_seq(), calib=rng.normal(size=(800, 6)), precision="ap_fixed<16,6,AP_RND,AP_SAT>")


def test_forward_runs_the_kernel_and_equals_simulate(mlp):
    # Wiring: the op reaches the device and converts dtypes. The numbers themselves are anchored to
    # hls4ml in the next test, not to the simulator they come from.
    x = torch.randn(33, 6) * 4
    y = mlp(x)
    assert y.dtype == torch.float32 and y.shape == (33, 2)
    exact = mlp.simulate(x.numpy())
    assert np.array_equal(y.numpy(), exact.astype(np.float32))
    y64 = mlp(x.double())
    assert y64.dtype == torch.float64 and np.array_equal(y64.numpy(), exact)


@pytest.mark.hls
@pytest.mark.filterwarnings("ignore")
def test_forward_equals_hls4ml_csim_of_the_same_module(mlp, tmp_path):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64) * 4
    model = mlp.to_hls4ml(tmp_path)
    model.compile()
    want = np.asarray(model.predict(np.ascontiguousarray(x.numpy()))).reshape(200, -1)
    assert np.array_equal(mlp(x).numpy(), want)


def test_opcheck_and_compile_fullgraph(mlp):
    rid = mlp.rid
    x = torch.randn(5, 6)
    torch.library.opcheck(torch.ops.offload.mlp_score.default, (rid, x))
    fn = torch.compile(lambda t: mlp(t) * 2.0, fullgraph=True, backend="aot_eager")
    assert torch.equal(fn(x), mlp(x) * 2.0)


def test_bad_inputs_are_clear_errors(mlp):
    x = torch.zeros(4, 6)
    x[3, 5] = float("nan")
    with pytest.raises(ValueError, match="row 3 column 5"):
        mlp(x)
    with pytest.raises(ValueError, match="row 3 column 5"):
        mlp.simulate(x.numpy())
    with pytest.raises(ValueError, match=r"\[batch, 6\]"):
        mlp(torch.zeros(4, 7))
    with pytest.raises(TypeError, match="floating point"):
        mlp(torch.zeros(4, 6, dtype=torch.int64))
    # Extreme but finite values saturate like the hardware; nothing raises.
    huge = torch.full((2, 6), 3.0e38)
    assert torch.isfinite(mlp(huge)).all()


def test_offload_kernels_are_json_and_numpy_and_serve_without_torch(mlp):
    (k,) = mlp.offload_kernels()
    spec = MlpSpec.from_json(json.loads(json.dumps(k.spec.to_json())))
    assert all(isinstance(v, np.ndarray) and v.dtype == np.int64 for v in k.tensors.values())
    x = np.random.default_rng(1).normal(size=(10, 6))
    out = get_kind("mlp").reference(spec, k.tensors, {"x": x})
    assert set(out) == {"y"} and np.array_equal(out["y"], mlp.simulate(x))


def test_unsupported_layers_and_bad_precision_are_named():
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 1))
    with pytest.raises(TypeError, match=r"layer '1' \(GELU\).*supported: Linear, ReLU"):
        offload.nn.MLP.from_float(seq, precision="ap_fixed<16,6>")
    seq = _seq()
    with pytest.raises(KeyError, match="unknown keys"):
        offload.nn.MLP.from_float(seq, precision={"nope": "ap_fixed<8,3>"})
    with pytest.raises(ValueError, match="not an ap_types type"):
        offload.nn.MLP.from_float(seq, precision="float32")
    with pytest.raises(ValueError, match="calibration set"):
        offload.nn.MLP.from_float(seq)
    with pytest.raises(ValueError, match="in_features=6 but its input has 5 features"):
        offload.nn.MLP.from_float(seq, calib=np.zeros((10, 5)))


def test_per_layer_precision_dict_reaches_the_spec():
    seq = _seq()
    assert offload.nn.MLP.layer_names(seq, fold_batchnorm=False) == ["fc0", "bn1", "relu2", "fc4", "tanh5", "fc6"]
    names = offload.nn.MLP.layer_names(seq)  # the BatchNorm after fc0 is folded into it
    assert names == ["fc0", "relu2", "fc4", "tanh5", "fc6"]
    prec = {"default": "ap_fixed<12,5>", "input": "ap_fixed<10,4,AP_RND,AP_SAT>",
            "fc4": {"accum": "ap_fixed<20,8,AP_TRN,AP_SAT>"}, "tanh5": {"table_size": 512}}
    m = offload.nn.MLP.from_float(seq, precision=prec, n_features=6, reuse_factor=2)
    layers = {layer.name: layer for layer in m.spec.layers}
    assert str(m.spec.input_type) == "ap_fixed<10,4,AP_RND,AP_SAT>"
    assert str(layers["fc4"].accum) == "ap_fixed<20,8,AP_TRN,AP_SAT>" and str(layers["fc4"].weight) == "ap_fixed<12,5>"
    assert layers["tanh5"].table_size == 512 and str(layers["tanh5"].table) == "ap_fixed<18,8>"
    assert m.spec.reuse_factor == 2


def test_batchnorm_after_linear_is_folded_exactly_up_to_float32_storage():
    from offload.nn.mlp import float_layers
    from offload.quant.ptq import float_forward

    seq = _seq(3)
    with torch.no_grad():
        seq[1].running_mean.normal_()
        seq[1].running_var.uniform_(0.5, 2.0)
        seq[1].weight.normal_()
    x = np.random.default_rng(2).normal(size=(200, 6))
    folded, unfolded = float_layers(seq, 6), float_layers(seq, 6, fold_batchnorm=False)
    assert [f.op for f in folded] == ["dense", "relu", "dense", "tanh", "dense"]
    a = float_forward(folded[:1], x)[-1]
    b = float_forward(unfolded[:2], x)[-1]
    # Folded weights and bias are the exact float64 products rounded once to float32 (relative
    # error <= 2**-24 each), so |a - b| <= 2**-24 * (|x| @ |W'| + |b'|) plus float64 noise.
    w, bias = folded[0].params["weight"].astype(np.float64), folded[0].params["bias"].astype(np.float64)
    bound = 2.0**-24 * (np.abs(x) @ np.abs(w) + np.abs(bias)) * (1 + 1e-9) + 1e-12
    assert np.all(np.abs(a - b) <= bound)


def test_saved_bundle_is_served_without_torch(mlp, tmp_path):
    import subprocess
    import sys

    offload.save(mlp, tmp_path / "risk.offload", name="risk")
    x = np.random.default_rng(4).normal(size=(50, 6)) * 5
    np.save(tmp_path / "x.npy", x)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any torch import now fails
        "import numpy as np, offload\n"
        "from offload.host import open_device\n"
        f"b = offload.load({str(tmp_path / 'risk.offload')!r})\n"
        "dev = open_device('sim'); k = next(iter(b.kernels.values()))\n"
        f"y = dev.run(dev.load(k), {{'x': np.load({str(tmp_path / 'x.npy')!r})}})['y']\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, y)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    assert np.array_equal(np.load(tmp_path / "y.npy"), mlp.simulate(x))

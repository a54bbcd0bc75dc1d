"""strategy="distributed_arithmetic": the simulator against hls4ml + da4ml's compiled C-simulation.

Two ways into hls4ml's DA firmware, each compared bit for bit with ``simulate`` on every row
(gaussian rows, rows far outside any calibration range, rounding ties, type edges):

- ``MLP.to_hls4ml(dir)`` then ``compile()`` / ``predict()`` (hls4ml's own build): one network with
  BatchNorm, LeakyReLU, a Linear without bias, Tanh, ReLU and Sigmoid, narrow saturating types and
  pre-activations far beyond the tables. hls4ml rebuilds on every compile (tens of seconds with
  da4ml), so this is the one test that pays for it.
- the card kernel (``offload.hls.mlp``: hls4ml's firmware with da4ml's ``nnet_code_gen.h`` under
  the Vitis top), through the emu device: the catalogue's DA entry (the risk MLP's shape), whose
  firmware and g++ build are cached by content hash and shared with the catalogue test; also the
  golden C-simulation ``offload build`` runs on it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import offload
from mlp_cases import adversarial_inputs
from offload.hls.build import golden_check
from offload.hls.mlp import sources
from offload.host import open_device
from offload.host.bundle import Bundle
from offload.kernels.catalogue import entries
from offload.sim.mlp import forward, simulate

pytestmark = pytest.mark.filterwarnings("ignore")
DA = "distributed_arithmetic"


def _assert_same(y_sim: np.ndarray, y_hls: np.ndarray) -> None:
    assert y_sim.shape == y_hls.shape
    bad = np.argwhere(y_sim != y_hls)
    assert len(bad) == 0, f"{len(bad)} mismatches, first at {bad[:3].tolist()}: sim {y_sim[tuple(bad[0])]} hls4ml {y_hls[tuple(bad[0])]}"


def _torch_model(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    seq = torch.nn.Sequential(
        torch.nn.BatchNorm1d(10), torch.nn.Linear(10, 16), torch.nn.LeakyReLU(0.05),
        torch.nn.Linear(16, 8, bias=False), torch.nn.Tanh(), torch.nn.Linear(8, 6), torch.nn.ReLU(),
        torch.nn.Linear(6, 1), torch.nn.Sigmoid(),
    )
    with torch.no_grad():
        bn = seq[0]
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.3, 3.0)
        bn.weight.normal_()
        bn.bias.normal_()
        for m in seq:
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(3.0)  # pre-activations well beyond the tanh / sigmoid tables
    return seq.eval()


@pytest.mark.slow
def test_to_hls4ml_da_project_matches_simulate(tmp_path):
    seq = _torch_model(0)
    names = offload.nn.MLP.layer_names(seq)
    tanh = next(n for n in names if n.startswith("tanh"))
    precision = {
        "default": "ap_fixed<10,4,AP_RND,AP_SAT>",
        "input": "ap_fixed<10,4,AP_RND_CONV,AP_SAT_SYM>",
        names[1]: {"weight": "ap_fixed<6,2,AP_RND_CONV,AP_SAT>", "result": "ap_fixed<8,3,AP_TRN,AP_WRAP>"},
        tanh: {"table": "ap_fixed<10,2,AP_RND>", "table_size": 256, "result": "ap_fixed<7,1,AP_RND_INF,AP_SAT>"},
        names[-1]: {"table": "ap_fixed<12,2>", "result": "ap_ufixed<8,0,AP_RND,AP_SAT>"},
    }
    mlp = offload.nn.MLP.from_float(seq, precision=precision, n_features=10, strategy=DA, device="sim")
    assert {la.op for la in mlp.spec.layers} >= {"batchnorm", "dense", "leaky_relu", "tanh", "relu", "sigmoid"}
    rng = np.random.default_rng(0)
    x = adversarial_inputs(rng, 60_000, 10, mlp.spec.input_type)
    hm = mlp.to_hls4ml(tmp_path)
    # DA on the Dense layers only (hls4ml refuses it elsewhere), every one written by da4ml.
    dense = [la.name for la in mlp.spec.layers if la.op == "dense"]
    assert [n for n in dense if hm.config.get_strategy(hm.graph[n]).lower() == DA] == dense
    hm.compile()
    code = (tmp_path / "firmware" / "nnet_utils" / "nnet_code_gen.h").read_text()
    assert code.count("void dense_da_") == len(dense)
    y_hls = np.asarray(hm.predict(np.ascontiguousarray(x))).reshape(len(x), -1)
    _assert_same(mlp.simulate(x), y_hls)
    # The case is adversarial: types saturate or wrap and the tables clamp somewhere.
    _, steps = forward(mlp.spec.input_type, mlp.spec.layers, mlp.spec.tensors(), x, trace=True)
    assert max(np.mean((raw == t.max_raw) | (raw == t.min_raw)) for _, raw, t in steps) > 0.01


@pytest.mark.slow
def test_da_card_kernel_matches_simulate():
    # The catalogue's DA entry (the risk MLP's shape, 16-32-16-1): its firmware and g++ build are
    # shared with the hls catalogue test and `offload regress`, so this adds rows, not a compile.
    e = next(e for e in entries("mlp/") if e.params.get("strategy") == DA)
    kernel = e.build().kernel
    spec = kernel.spec
    assert spec.strategy == DA and "dense_da_" in sources(spec)["nnet_code_gen.h"]
    rng = np.random.default_rng(5)
    x = adversarial_inputs(rng, 50_000, spec.n_features, spec.input_type)
    dev = open_device("emu")
    try:
        y = dev.run(dev.load(kernel), {"x": x})["y"]
    finally:
        dev.close()
    _assert_same(simulate(spec.input_type, spec.layers, spec.tensors(), x), y)
    # `offload build` C-simulates the same top function against the reference (golden inputs).
    (r,) = golden_check(Bundle("da", {"da": kernel}), cases=3)
    assert r.mismatches == 0 and r.compared > 0, r
    # Under latency with the catalogue's accumulator (products rounded to 10 fraction bits) the
    # same weights give other outputs: DA is not latency under another name.
    lat = tuple(replace(la, accum="ap_fixed<24,10>") if la.op == "dense" else la for la in spec.layers)
    assert (simulate(spec.input_type, lat, spec.tensors(), x) != y).any()

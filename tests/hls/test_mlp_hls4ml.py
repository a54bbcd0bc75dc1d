"""The MLP simulator against hls4ml's own compiled C-simulation (``compile()`` + ``predict``).

Zero mismatches, bit for bit, on random architectures with random rounding / overflow modes
(narrow accumulators that round every product and saturate or wrap while summing), inputs far
outside any calibration range, exact rounding ties, type edges, and sigmoid/tanh inputs beyond
their tables' range. Two paths into hls4ml are covered: the spec's own layer list
(``offload.hls.mlp.build_model``, what the kernel generator uses) and ``MLP.to_hls4ml``
(``convert_from_pytorch_model`` from the float torch weights, so hls4ml quantizes them itself).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import offload
from mlp_cases import adversarial_inputs, random_spec
from offload.hls.mlp import build_model
from offload.kernels.mlp import run_rows
from offload.sim.mlp import forward, simulate

pytestmark = pytest.mark.filterwarnings("ignore")


def _predict(model, x: np.ndarray) -> np.ndarray:
    model.compile()
    return np.asarray(model.predict(np.ascontiguousarray(x, dtype=np.float64))).reshape(len(x), -1)


def _assert_same(y_sim: np.ndarray, y_hls: np.ndarray) -> None:
    bad = np.argwhere(y_sim != y_hls)
    assert len(bad) == 0, f"{len(bad)} mismatches, first at {bad[:3].tolist()}: sim {y_sim[tuple(bad[0])]} hls4ml {y_hls[tuple(bad[0])]}"


@pytest.mark.parametrize("seed", [11, 12, 16])
def test_random_spec_matches_hls4ml_100k_rows(seed, tmp_path):
    spec, floats = random_spec(seed)
    rng = np.random.default_rng(seed)
    x = adversarial_inputs(rng, 100_000, spec.n_features, spec.input_type)
    # Float weights (not the dequantized raws): hls4ml prints and re-reads them itself.
    model = build_model(spec, tmp_path, float_weights=floats)
    y_hls = _predict(model, x)
    tensors = spec.tensors()
    y_sim = simulate(spec.input_type, spec.layers, tensors, x)
    _assert_same(y_sim, y_hls)
    # The kind's fast path (the fused program, int64 steps guarded by bounds from the types): the
    # same rows through it, in small batches, against hls4ml directly rather than against the reference.
    n = 150 * 128
    y_fast = np.concatenate([run_rows(spec.input_type, spec.layers, tensors, x[i : i + 128]) for i in range(0, n, 128)])
    _assert_same(y_fast, y_hls[:n])
    # float32 rows go through the bridge's float entry point: input_t(float) is input_t(double(f)),
    # outputs come back as result_t.to_float() (round to nearest even, as NumPy's float64->float32).
    x32 = x.astype(np.float32)
    y32 = np.asarray(model.predict(x32)).reshape(len(x), -1)
    assert y32.dtype == np.float32
    _assert_same(simulate(spec.input_type, spec.layers, spec.tensors(), x32.astype(np.float64)).astype(np.float32), y32)
    # The case is adversarial: activations hit their tables' clamps and types saturate or wrap.
    _, steps = forward(spec.input_type, spec.layers, spec.tensors(), x, trace=True)
    hit_limits = [np.mean((raw == t.max_raw) | (raw == t.min_raw)) for _, raw, t in steps]
    assert max(hit_limits) > 0.01


def _torch_model(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    seq = torch.nn.Sequential(
        torch.nn.BatchNorm1d(10), torch.nn.Linear(10, 24), torch.nn.BatchNorm1d(24), torch.nn.LeakyReLU(0.05),
        torch.nn.Dropout(0.3), torch.nn.Linear(24, 12, bias=False), torch.nn.Tanh(), torch.nn.Identity(),
        torch.nn.Linear(12, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1), torch.nn.Sigmoid(),
    )
    with torch.no_grad():
        for m in seq:
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.3, 3.0)
                m.weight.normal_()
                m.bias.normal_()
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(3.0)  # pre-activations well beyond the tanh / sigmoid tables
    return seq.eval()


@pytest.mark.slow
def test_from_float_auto_matches_hls4ml_100k_rows(tmp_path):
    seq = _torch_model(0)
    rng = np.random.default_rng(0)
    mlp = offload.nn.MLP.from_float(seq, calib=rng.normal(size=(2000, 10)), precision="auto")
    x = adversarial_inputs(rng, 100_000, 10, mlp.spec.input_type)
    _assert_same(mlp.simulate(x), _predict(mlp.to_hls4ml(tmp_path), x))


@pytest.mark.slow
def test_narrow_saturating_types_match_hls4ml_100k_rows(tmp_path):
    seq = _torch_model(1)
    names = offload.nn.MLP.layer_names(seq)
    tanh = next(n for n in names if n.startswith("tanh"))
    # Narrow everywhere, every product rounded into a short saturating accumulator, a wrapping
    # layer, tiny tables: the simulator's exact (non fast) paths.
    precision = {
        "default": "ap_fixed<8,3,AP_RND,AP_SAT>",
        "input": "ap_fixed<9,4,AP_RND_CONV,AP_SAT_SYM>",
        names[1]: {"weight": "ap_fixed<6,2,AP_RND_CONV,AP_SAT>", "accum": "ap_fixed<10,4,AP_TRN,AP_SAT>", "result": "ap_fixed<8,3,AP_TRN,AP_WRAP>"},
        tanh: {"table": "ap_fixed<10,2,AP_RND>", "table_size": 256, "result": "ap_fixed<7,1,AP_RND_INF,AP_SAT>"},
        names[-1]: {"table": "ap_fixed<12,2>", "result": "ap_ufixed<8,0,AP_RND,AP_SAT>"},
    }
    mlp = offload.nn.MLP.from_float(seq, precision=precision, n_features=10)
    rng = np.random.default_rng(1)
    x = adversarial_inputs(rng, 100_000, 10, mlp.spec.input_type)
    _assert_same(mlp.simulate(x), _predict(mlp.to_hls4ml(tmp_path), x))

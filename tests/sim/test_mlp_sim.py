"""Unit checks of the MLP reference's steps, and the kind's fast path against the reference.

(The reference as a whole is proven against hls4ml's C-simulation in test_mlp_hls4ml.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

import offload.sim.mlp as simmlp
from mlp_cases import adversarial_inputs, random_spec
from offload.kernels.mlp import run_rows
from offload.sim.fixed import FixedType


@pytest.mark.parametrize("seed", [1, 2, 4, 6])
def test_fast_path_equals_step_by_step_accumulation(seed):
    spec, _ = random_spec(seed, narrow=False)  # wide accumulators: the exact dense sums
    rng = np.random.default_rng(seed)
    x = adversarial_inputs(rng, 3000, spec.n_features, spec.input_type)
    fast = run_rows(spec.input_type, spec.layers, spec.tensors(), x)
    slow = simmlp.simulate(spec.input_type, spec.layers, spec.tensors(), x)
    assert np.array_equal(fast, slow)


def test_table_index_clamps_and_truncates_toward_zero():
    t = FixedType.parse("ap_fixed<16,6>")
    # x * 1024 / 16 = 64 x; int() truncates toward zero; + 512; clamp to [0, 1023]
    xs = np.array([0.0, 1 / 64, -1 / 64, 1.5 / 64, -1.5 / 64, 7.99, 8.0, -8.0, -8.02, 31.9])
    idx = simmlp.reference._table_index(t.quantize(xs), t, "sigmoid", 1024)
    assert idx.tolist() == [512, 513, 511, 513, 511, 1023, 1023, 0, 0, 1023]
    # tanh: x * N / 8 with N = 512 -> 64 x, offset 256
    idx = simmlp.reference._table_index(t.quantize(np.array([-0.9 / 64, 3.999, -4.5])), t, "tanh", 512)
    assert idx.tolist() == [256, 511, 0]


def test_activation_tables_span_their_ranges():
    sig = FixedType.parse("ap_fixed<18,8>").to_float(simmlp.activation_table("sigmoid", 1024, "ap_fixed<18,8>"))
    th = FixedType.parse("ap_fixed<18,8>").to_float(simmlp.activation_table("tanh", 1024, "ap_fixed<18,8>"))
    # entry i holds f(range * (i - N/2) / N): sigmoid(-8) and tanh(-4) first, f(0) in the middle
    lsb = 2.0**-10
    assert abs(sig[0] - 1 / (1 + np.exp(8.0))) <= lsb and sig[512] == 0.5
    assert abs(th[0] - np.tanh(-4.0)) <= lsb and th[512] == 0.0
    assert np.all(np.diff(sig) >= 0) and np.all(np.diff(th) >= 0)


def test_weights_go_through_hls4ml_decimal_text():
    t = FixedType.parse("ap_fixed<8,2,AP_RND>")
    # 6 fraction bits -> 6 decimals: 0.0078125 (exactly half an LSB) prints as "0.007812", just
    # below the tie, so AP_RND gives 0 where the value itself (a tie, rounded up) gives 1.
    # 0.0234375 (1.5 LSB) prints as "0.023438", above the tie: 2 either way.
    vals = np.array([0.0078125, 0.0234375])
    assert simmlp.quantize_like_hls4ml(vals, t).tolist() == [0, 2]
    assert t.quantize(vals).tolist() == [1, 2]

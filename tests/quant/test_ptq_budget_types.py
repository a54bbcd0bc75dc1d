"""Two facts of the precision search checked from its results: biases that are negative get a
signed type, and the cosine of an all-zero float output against a non-zero one is 0 (not NaN:
``cosine < cos_threshold`` is False for NaN, so such a layer would pass the search unrefined)."""

from __future__ import annotations

import numpy as np

from offload.quant.ptq import FloatLayer, _cosine, choose_precision


def test_negative_biases_get_a_signed_type():
    rng = np.random.default_rng(41)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    b = np.array([-2.5, -0.75, -1.25], dtype=np.float32)  # every bias negative
    bn = {"scale": np.array([1.5, 0.5, 2.0], dtype=np.float32), "bias": np.array([-3.0, -0.5, -1.0], dtype=np.float32)}
    layers = [FloatLayer("fc", "dense", 4, 3, {"weight": w, "bias": b}), FloatLayer("bn", "batchnorm", 3, 3, bn)]
    _, types, _ = choose_precision(layers, rng.normal(size=(200, 4)))
    for name in ("fc", "bn"):
        assert types[name]["bias"].startswith("ap_fixed<"), (name, types[name]["bias"])


def test_cosine_of_zero_against_nonzero_is_zero_and_of_two_zeros_is_one():
    z, v = np.zeros(5), np.arange(5.0)
    assert _cosine(v, z) == 0.0 and _cosine(z, v) == 0.0
    assert _cosine(z, z) == 1.0
    assert abs(_cosine(v, 2 * v) - 1.0) < 1e-15

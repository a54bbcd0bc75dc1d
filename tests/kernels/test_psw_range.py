"""Raw per-sample weights outside ``weight_type`` are refused before any device work: past the
range the reference (int64 products) and the C++ (the raw bits reinterpreted in the type's
width) compute different things, so letting them through makes sim and emu disagree."""

from __future__ import annotations

import numpy as np
import pytest

from offload.host import open_device
from offload.kernels.embedding import TableSpec, make_kernel, make_spec



def _kernel(weight_type: str):
    spec = make_spec([TableSpec("t", 8, 4, "ap_fixed<12,4>")], mode="sum", max_bag_size=4, weight_type=weight_type)
    rng = np.random.default_rng(7)
    return make_kernel("k", spec, [rng.uniform(-7, 7, (8, 4))])


@pytest.mark.parametrize("weight_type", ["ap_fixed<8,3>", "ap_ufixed<6,2>", "ap_fixed<16,6,AP_RND_CONV,AP_SAT>"])
@pytest.mark.parametrize("device", ["sim", "emu"])
def test_weights_one_past_either_end_are_refused_and_the_ends_agree(weight_type, device):
    k = _kernel(weight_type)
    wt = k.spec.weight_type
    lo, hi = int(wt.min_raw), int(wt.max_raw)
    dev = open_device(device)
    h = dev.load(k)
    base = {"indices": np.array([0, 1, 2, 3], dtype=np.int64), "offsets": np.array([0, 2, 4], dtype=np.int64)}
    for bad in (hi + 1, lo - 1):
        w = np.array([lo, hi, 1, bad], dtype=np.int64)
        with pytest.raises(ValueError, match=r"per_sample_weights: raw values outside .*\[%d, %d\]" % (lo, hi)):
            dev.run(h, {**base, "per_sample_weights": w})
    # At the ends themselves both devices compute the same thing (and the call is accepted).
    w = np.array([lo, hi, hi, lo], dtype=np.int64)
    got = dev.run(h, {**base, "per_sample_weights": w})["out"]
    sim = open_device("sim")
    want = sim.run(sim.load(k), {**base, "per_sample_weights": w})["out"]
    np.testing.assert_array_equal(got, want)

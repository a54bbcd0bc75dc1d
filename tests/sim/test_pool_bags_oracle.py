"""pool_bags against a per-bag Python oracle on type combinations where terms are not a plain copy:
a signed table into an unsigned saturating accumulator (terms are not an exact shift), and an
output type with more fraction bits than the accumulator (a left shift by the difference)."""

from __future__ import annotations

import numpy as np

from offload.sim.embedding import pool_bags
from offload.sim.fixed import FixedType


def _bags(rng, n_bags, max_len):
    lens = rng.integers(0, max_len + 1, n_bags)
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def test_signed_terms_into_an_unsigned_saturating_accumulator():
    vt, acc = FixedType.parse("ap_fixed<8,4>"), FixedType.parse("ap_ufixed<16,8,AP_TRN,AP_SAT>")
    rng = np.random.default_rng(23)
    off = _bags(rng, 30, 12)
    vals = rng.integers(vt.min_raw, vt.max_raw + 1, (int(off[-1]), 3)).astype(np.int64)
    got = pool_bags(vals, vt, off, "sum", acc, acc)
    # Each term becomes an acc value first (F 4 -> 8: x16; negative -> 0 under AP_SAT), then the
    # running sum saturates at acc's top after every addition.
    want = np.zeros((30, 3), dtype=np.int64)
    for b in range(30):
        for c in range(3):
            s = 0
            for v in vals[off[b]:off[b + 1], c]:
                s = min(acc.max_raw, max(0, s + max(0, int(v) * 16)))
            want[b, c] = s
    assert np.array_equal(got, want)
    assert (got >= 0).all()


def test_output_with_more_fraction_bits_is_the_sum_shifted_by_the_difference():
    vt = FixedType.parse("ap_fixed<8,7>")  # F = 1
    acc, out = FixedType.parse("ap_fixed<20,19>"), FixedType.parse("ap_fixed<24,22>")  # F = 1, F = 2
    rng = np.random.default_rng(29)
    off = _bags(rng, 20, 6)
    vals = rng.integers(vt.min_raw, vt.max_raw + 1, (int(off[-1]), 2)).astype(np.int64)
    got = pool_bags(vals, vt, off, "sum", acc, out)
    want = np.stack([vals[off[b]:off[b + 1]].sum(axis=0) * 2 for b in range(20)])
    assert np.array_equal(got, want)

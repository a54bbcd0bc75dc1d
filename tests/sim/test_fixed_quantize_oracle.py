"""FixedType.quantize against exact rational arithmetic (fractions.Fraction), fast enough for the
mutation subset: the g++/ap_types comparison (test_fixed_point.py) is the authority but takes
minutes. The oracle is the definition of each mode, worked on the exact value x * 2**F:
round, then fit the width (saturate or wrap). Cases reach both of quantize's paths: |x * 2**F|
below 2**62 (float arithmetic) and above (IEEE-field decoding), exact ties, and ap_int's
truncation toward zero with its documented quirk (negative |x| < 0.5 becomes +1)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from offload.sim.fixed import FixedType, accumulate


def _round(v: Fraction, mode: str) -> int:
    fl = math.floor(v)
    frac = v - fl
    half = Fraction(1, 2)
    if mode == "AP_TRN":
        return fl
    if mode == "AP_TRN_ZERO":
        return math.trunc(v)
    if frac != half:
        return fl + (1 if frac > half else 0)
    # an exact tie between fl and fl + 1
    return {"AP_RND": fl + 1, "AP_RND_MIN_INF": fl, "AP_RND_ZERO": fl if v > 0 else fl + 1,
            "AP_RND_INF": fl + 1 if v > 0 else fl, "AP_RND_CONV": fl if fl % 2 == 0 else fl + 1}[mode]


def _fit(q: int, t: FixedType) -> int:
    lo, hi = (-(1 << (t.width - 1)), (1 << (t.width - 1)) - 1) if t.signed else (0, (1 << t.width) - 1)
    if lo <= q <= hi:
        return q
    if t.overflow == "AP_SAT":
        return max(lo, min(hi, q))
    if t.overflow == "AP_SAT_ZERO":
        return 0
    if t.overflow == "AP_SAT_SYM":
        return max(-hi if t.signed else lo, min(hi, q))
    m = q % (1 << t.width)  # AP_WRAP with no saturated bits
    return m - (1 << t.width) if t.signed and m > hi else m


def oracle(x: float, t: FixedType) -> int:
    if t.is_int:
        q = math.trunc(Fraction(x))
        if x < 0 and x > -0.5:
            q = 1
        return _fit(q, FixedType(t.width, t.width, rounding="AP_TRN", overflow="AP_WRAP", signed=t.signed))
    return _fit(_round(Fraction(x) * 2**t.F, t.rounding), t)


TYPES = [
    "ap_fixed<16,6,AP_RND,AP_SAT>", "ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "ap_fixed<16,6>", "ap_fixed<16,6,AP_TRN_ZERO,AP_WRAP>",
    "ap_fixed<18,8,AP_RND_ZERO,AP_SAT_SYM>", "ap_fixed<18,8,AP_RND_INF,AP_SAT_ZERO>", "ap_fixed<18,8,AP_RND_MIN_INF,AP_WRAP>",
    "ap_ufixed<12,4,AP_RND,AP_SAT>", "ap_ufixed<12,4,AP_TRN,AP_WRAP>", "ap_fixed<40,10,AP_RND_CONV,AP_WRAP>",
    "ap_fixed<8,-2,AP_RND,AP_SAT>", "ap_fixed<8,12,AP_RND_CONV,AP_WRAP>", "ap_fixed<8,12,AP_TRN,AP_SAT>",
    "ap_int<8>", "ap_uint<8>", "ap_int<32>",
]


def _values(t: FixedType) -> np.ndarray:
    rng = np.random.default_rng(1701)
    lsb = 2.0 ** -t.F
    grid = np.arange(-40, 41) * lsb / 2  # every tie and every grid point near zero
    span = 2.0 ** (t.width - t.F)
    wide = rng.uniform(-3, 3, 400) * span  # in range and overflowing both ways
    far = np.array([2.0**70, -(2.0**70), 2.0**62 * lsb * 1.5, -(2.0**62) * lsb * 1.25, 1e300, -1e300])  # the bit-level path
    # |x * 2**F| >= 2**62 with low bits set: wrapping keeps them, so they must survive the path.
    low_bits = np.ldexp(np.array([2.0**52 + 11, -(2.0**52 + 11), 2.0**52 + 3]), 12 - t.F)
    tiny = np.array([-0.49, -0.25, -1e-300, 1e-300, -0.0, 0.0, -0.5, 0.5, -0.51])  # normal numbers: ap_types decodes subnormals its own way (see quantize)
    return np.concatenate([grid, wide, far, low_bits, tiny, (rng.normal(size=200) * span / 4).round(3)])


@pytest.mark.parametrize("text", TYPES)
def test_quantize_matches_the_exact_definition(text):
    t = FixedType.parse(text)
    xs = _values(t)
    got = t.quantize(xs)
    want = [oracle(float(x), t) for x in xs]
    bad = [(float(x), int(g), w) for x, g, w in zip(xs, got, want) if int(g) != w]
    assert not bad, bad[:5]


def test_negative_saturated_bits_are_refused():
    with pytest.raises(ValueError, match=r"N \(saturation bits\) must be 0..W=16, got -1"):
        FixedType(16, 6, rounding="AP_TRN", overflow="AP_WRAP", sat_bits=-1)


@pytest.mark.parametrize("acc_text", ["ap_fixed<12,6,AP_RND_CONV,AP_SAT>", "ap_fixed<12,6,AP_TRN,AP_SAT_SYM>"])
def test_accumulate_saturates_after_every_addition_in_order(acc_text):
    # Terms on a coarser grid (F=4) than the accumulator (F=6): each is aligned exactly, then the
    # running sum is saturated after every addition, so order matters: +30, +30 saturates at the
    # top (31.98...), then -30 comes back down to about 1.98 rather than to 30.
    x_t, acc_t = FixedType.parse("ap_fixed<10,6>"), FixedType.parse(acc_text)
    rng = np.random.default_rng(5)
    x = np.concatenate([x_t.quantize([30.0, 30.0, -30.0, -31.5, -31.5, 17.25]), x_t.quantize(rng.uniform(-32, 32, 40))])
    acc = 0
    for v in x:
        acc = _fit(acc + int(v) * 2 ** (acc_t.F - x_t.F), acc_t)
    assert int(accumulate(x, x_t, acc_t)) == acc
    assert int(accumulate(x[:3], x_t, acc_t)) == _fit(_fit(2 * 30 * 64, acc_t) - 30 * 64, acc_t)


CAST_MODES = ["AP_TRN", "AP_TRN_ZERO", "AP_RND", "AP_RND_ZERO", "AP_RND_MIN_INF", "AP_RND_INF", "AP_RND_CONV"]


@pytest.mark.parametrize("overflow", ["AP_SAT", "AP_WRAP", "AP_SAT_SYM", "AP_SAT_ZERO"])
@pytest.mark.parametrize("mode", CAST_MODES)
def test_cast_to_a_coarser_grid_matches_the_exact_definition(mode, overflow):
    # ap_fixed<24,8> (F=16) -> ap_fixed<12,6> (F=6): a right shift by 10 with mode's rounding on the
    # exact value raw / 2**10, then the width fit; every tie, both signs, values past both limits.
    src, dst = FixedType.parse("ap_fixed<24,8>"), FixedType.parse(f"ap_fixed<12,6,{mode},{overflow}>")
    rng = np.random.default_rng(11)
    ties = (np.arange(-300, 300) * 512).astype(np.int64)  # multiples of 2**9: exact halves of 2**10
    raws = np.concatenate([ties, ties + 1, ties - 1, rng.integers(src.min_raw, src.max_raw + 1, 500), [src.min_raw, src.max_raw, 0, -1, 1]])
    got = dst.cast(raws, src)
    want = [_fit(_round(Fraction(int(r), 1 << 10), mode), dst) for r in raws]
    bad = [(int(r), int(g), w) for r, g, w in zip(raws, got, want) if int(g) != w]
    assert not bad, bad[:5]

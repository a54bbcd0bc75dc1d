"""FixedType's text form, attributes and error handling; accumulate's two paths agree (no C++ needed)."""

from __future__ import annotations

import numpy as np
import pytest

from offload.sim import FixedType, accumulate, add, add_type, mul, mul_type, sub_type

P = FixedType.parse


@pytest.mark.parametrize(
    "text",
    [
        "ap_fixed<16,6>",
        "ap_fixed<16,6,AP_RND_CONV,AP_SAT>",
        "ap_fixed<16,6,AP_RND>",
        "ap_ufixed<8,-3,AP_TRN,AP_SAT_SYM>",
        "ap_fixed<8,20,AP_RND_ZERO,AP_WRAP,3>",
        "ap_fixed<1,1>",
        "ap_ufixed<64,64,AP_RND_INF,AP_SAT_ZERO>",
        "ap_fixed<1024,10>",
        "ap_int<8>",
        "ap_uint<64>",
    ],
)
def test_parse_str_round_trip(text):
    t = P(text)
    assert str(t) == text
    assert P(str(t)) == t


@pytest.mark.parametrize(
    "text,canonical",
    [
        (" ap_fixed < 16 , 6 > ", "ap_fixed<16,6>"),
        ("ap_fixed<16,6,AP_TRN,AP_WRAP>", "ap_fixed<16,6>"),
        ("ap_fixed<16,6,AP_TRN,AP_WRAP,0>", "ap_fixed<16,6>"),
        ("ap_fixed<16,6,AP_RND,AP_WRAP>", "ap_fixed<16,6,AP_RND>"),
        ("ap_fixed<16,6,AP_TRN,AP_SAT>", "ap_fixed<16,6,AP_TRN,AP_SAT>"),
        ("ap_fixed<16,+6>", "ap_fixed<16,6>"),
    ],
)
def test_parse_canonicalises(text, canonical):
    assert str(P(text)) == canonical


def test_attributes_follow_the_definitions():
    t = P("ap_fixed<8,3,AP_RND,AP_SAT>")
    assert (t.W, t.I, t.F, t.signed, t.rounding, t.overflow) == (8, 3, 5, True, "AP_RND", "AP_SAT")
    # signed 8-bit raw range [-128, 127], LSB 2**-5
    assert (t.min_raw, t.max_raw, t.lsb) == (-128, 127, 1 / 32)
    assert (t.min_float, t.max_float) == (-4.0, 4.0 - 1 / 32)
    u = P("ap_ufixed<4,6>")
    assert (u.F, u.min_raw, u.max_raw, u.lsb, u.max_float) == (-2, 0, 15, 4.0, 60.0)
    assert P("ap_uint<64>").raw_dtype == np.uint64 and P("ap_int<64>").raw_dtype == np.int64
    assert FixedType(16, 6, rounding="AP_RND_CONV", overflow="AP_SAT") == P("ap_fixed<16,6,AP_RND_CONV,AP_SAT>")
    assert t.with_modes("AP_TRN", "AP_WRAP") == FixedType(8, 3)
    assert P("ap_int<8>").with_modes(overflow="AP_SAT") == P("ap_fixed<8,8,AP_TRN,AP_SAT>")
    with pytest.raises(AttributeError):
        t.width = 9  # frozen


@pytest.mark.parametrize(
    "text,message",
    [
        ("ap_fixed<0,0>", "W must be 1..1024"),
        ("ap_fixed<1025,3>", "W must be 1..1024"),
        ("ap_int<0>", "W must be 1..1024"),
        ("ap_fixed<16,6,AP_FOO>", "unknown rounding mode 'AP_FOO'"),
        ("ap_fixed<16,6,AP_RND,AP_BAR>", "unknown overflow mode 'AP_BAR'"),
        ("ap_fixed<16,6,AP_RND,AP_WRAP_SM>", "'AP_WRAP_SM' is not supported"),
        ("ap_fixed<16,6,AP_RND,AP_WRAP,17>", "N (saturation bits) must be 0..W=16"),
        ("ap_fixed<16>", "takes 2 to 5 parameters"),
        ("ap_fixed<16,6,AP_RND,AP_WRAP,1,2>", "takes 2 to 5 parameters"),
        ("ap_int<8,3>", "takes exactly one parameter W"),
        ("ap_fixed<16,x>", "I must be an integer"),
        ("ap_fixed<16.0,6>", "W must be an integer"),
        ("ap_fixed<16,,6>", "empty template argument"),
        ("ap_float<16,6>", "not an ap_types type"),
        ("ap_fixed<16,6", "not an ap_types type"),
        ("", "not an ap_types type"),
    ],
)
def test_malformed_type_strings(text, message):
    with pytest.raises(ValueError) as e:
        P(text)
    assert message in str(e.value)


def test_parse_rejects_non_strings():
    with pytest.raises(TypeError, match="must be a str"):
        P(16)
    with pytest.raises(TypeError, match="width must be an int"):
        FixedType(16.0, 6)


def test_quantize_nan_raises_and_inf_saturates():
    t = P("ap_fixed<8,3,AP_RND,AP_SAT>")
    with pytest.raises(ValueError, match="NaN"):
        t.quantize([1.0, np.nan])
    assert t.quantize([np.inf, -np.inf]).tolist() == [t.max_raw, t.min_raw]


def test_quantize_keeps_shape_and_dtype():
    t = P("ap_fixed<16,6>")
    x = np.linspace(-3, 3, 24).reshape(2, 3, 4)
    r = t.quantize(x)
    assert r.shape == x.shape and r.dtype == np.int64
    assert t.quantize(1.5).shape == ()
    # AP_TRN is floor: |x - back| < 1 LSB, and back <= x
    back = t.to_float(r)
    assert np.all(back <= x) and np.all(x - back < t.lsb)


def test_wide_types_refuse_raw_work():
    wide = P("ap_fixed<100,10>")
    with pytest.raises(OverflowError, match="W=100"):
        wide.quantize([1.0])
    a = P("ap_fixed<40,10>")
    assert mul_type(a, a) == FixedType(80, 20)  # the type itself is fine
    with pytest.raises(OverflowError, match=r"W=80"):
        mul(np.array([1]), a, np.array([1]), a)
    with pytest.raises(OverflowError, match="W=65"):
        add(np.array([1]), P("ap_fixed<64,32>"), np.array([1]), P("ap_fixed<8,4>"))


def test_raw_inputs_are_validated():
    t = P("ap_fixed<8,3>")
    with pytest.raises(ValueError, match=r"\[-128, 127\]"):
        P("ap_fixed<4,2>").cast(np.array([128]), t)
    with pytest.raises(TypeError, match="must be integers"):
        P("ap_fixed<4,2>").cast(np.array([1.5]), t)
    with pytest.raises(ValueError, match="uninitialised"):
        P("ap_int<8>").cast(np.array([-3]), P("ap_fixed<8,-2>"))


def test_result_types_follow_rtype():
    a, b = P("ap_fixed<16,6>"), P("ap_ufixed<8,2>")
    # plus: I = max(6, 2 + 1) + 1 = 7, F = max(10, 6) = 10
    assert add_type(a, b) == FixedType(17, 7, True)
    assert sub_type(b, b) == FixedType(9, 3, True)  # minus is always signed
    assert add_type(b, b) == FixedType(9, 3, False)
    assert mul_type(a, b) == FixedType(24, 8, True)
    assert str(add_type(P("ap_int<8>"), P("ap_uint<8>"))) == "ap_int<10>"


def test_add_mul_on_raw_values_are_exact():
    a, b = P("ap_fixed<16,6>"), P("ap_ufixed<8,2>")
    rng = np.random.default_rng(1)
    ra = rng.integers(a.min_raw, a.max_raw + 1, 1000)
    rb = rng.integers(b.min_raw, b.max_raw + 1, 1000)
    s, st = add(ra, a, rb, b)
    p, pt = mul(ra, a, rb, b)
    # both sides are exactly representable in float64 (< 53 bits), so float math is an exact oracle
    assert np.array_equal(st.to_float(s), a.to_float(ra) + b.to_float(rb))
    assert np.array_equal(pt.to_float(p), a.to_float(ra) * b.to_float(rb))


@pytest.mark.parametrize(
    "acc",
    ["ap_fixed<20,8>", "ap_fixed<14,8,AP_RND>", "ap_fixed<14,8,AP_RND_MIN_INF>", "ap_fixed<14,6,AP_TRN>", "ap_ufixed<10,6,AP_TRN>"],
)
def test_accumulate_fast_path_equals_stepwise(acc):
    """The one-pass sum must equal the literal acc = acc + x loop built from add() and cast()."""
    x_t, acc_t = P("ap_fixed<16,6>"), P(acc)
    rng = np.random.default_rng(2)
    x = rng.integers(x_t.min_raw, x_t.max_raw + 1, (50, 30))
    init = rng.integers(acc_t.min_raw, acc_t.max_raw + 1, 50)
    want = init.copy()
    for k in range(x.shape[1]):
        s, st = add(want, acc_t, x[:, k], x_t)
        want = acc_t.cast(s, st)
    assert np.array_equal(accumulate(x, x_t, acc_t, axis=1, init=init), want)
    assert np.array_equal(accumulate(x.T, x_t, acc_t, axis=0, init=init), want)

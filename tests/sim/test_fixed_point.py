"""offload.sim.fixed against ap_types itself: zero mismatches on random and adversarial cases.

One C++ program (hls/fixed_proof.py, built once and cached by content hash) instantiates every
case below with its types fixed at compile time; the same inputs go through FixedType and the
raw bit patterns must be identical. Types are drawn with a fixed seed (so the build is cached)
plus hand-picked corners: W=1, W=64, I<0, I>W, I=0, unsigned, ap_int/ap_uint, AP_WRAP with N,
F beyond the double range (subnormal decoding), I beyond it (inf handling).
"""

from __future__ import annotations

import numpy as np
import pytest

from offload.sim import FixedType, accumulate, add, add_type, mul, mul_type, sub, sub_type
from offload.sim.fixed import OVERFLOW_MODES, ROUNDING_MODES

fixed_proof = pytest.importorskip("offload.hls.fixed_proof")
from offload.hls import csim  # noqa: E402

SEED = 20261129
P = FixedType.parse


def _have_toolchain() -> bool:
    try:
        csim._compiler()
        csim.ap_types_include()
        return True
    except csim.ToolchainMissing:
        return False


needs_cxx = pytest.mark.skipif(not _have_toolchain(), reason="g++ / ap_types headers not available")


# ---------------------------------------------------------------------------------------------------
# Case generation
# ---------------------------------------------------------------------------------------------------
_WIDTHS = [1, 2, 3, 5, 7, 8, 9, 12, 16, 17, 24, 31, 32, 33, 40, 48, 52, 53, 54, 55, 63, 64]


def _random_type(rng: np.random.Generator, max_w: int = 64, allow_int: bool = True) -> FixedType:
    w = int(rng.choice([x for x in _WIDTHS if x <= max_w])) if rng.random() < 0.7 else int(rng.integers(1, max_w + 1))
    signed = bool(rng.random() < 0.6)
    if allow_int and rng.random() < 0.1:
        return FixedType(w, w, signed, "AP_TRN_ZERO", "AP_WRAP", 0, True)
    r = rng.random()
    if r < 0.7:
        i = int(rng.integers(-3, w + 4))
    elif r < 0.85:
        i = int(rng.integers(-40, 0))
    else:
        i = int(rng.integers(w + 1, w + 40))
    q = str(rng.choice(ROUNDING_MODES))
    o = str(rng.choice(OVERFLOW_MODES))
    n = int(rng.integers(1, w + 1)) if (o == "AP_WRAP" and rng.random() < 0.25) else 0
    return FixedType(w, i, signed, q, o, n)


CORNER_TYPES = [
    P(s)
    for s in [
        "ap_fixed<1,1>",
        "ap_fixed<1,1,AP_RND,AP_SAT_SYM>",
        "ap_ufixed<1,1,AP_RND_INF,AP_SAT>",
        "ap_fixed<1,-4,AP_RND_CONV,AP_SAT>",
        "ap_ufixed<1,9,AP_RND,AP_WRAP>",
        "ap_fixed<64,32,AP_RND_CONV,AP_SAT>",
        "ap_fixed<64,1,AP_RND,AP_SAT_SYM>",
        "ap_fixed<64,64,AP_TRN_ZERO,AP_SAT_ZERO>",
        "ap_fixed<64,70,AP_RND_INF,AP_WRAP>",
        "ap_ufixed<64,64,AP_RND,AP_SAT>",
        "ap_ufixed<64,0,AP_RND_MIN_INF,AP_WRAP>",
        "ap_ufixed<64,12,AP_RND_ZERO,AP_SAT_SYM>",
        "ap_fixed<16,6,AP_RND_CONV,AP_SAT>",
        "ap_fixed<16,6>",
        "ap_fixed<8,0,AP_RND,AP_SAT>",
        "ap_fixed<8,-5,AP_RND_CONV,AP_WRAP>",
        "ap_fixed<6,20,AP_RND_MIN_INF,AP_SAT_SYM>",
        "ap_ufixed<6,20,AP_TRN,AP_SAT>",
        "ap_fixed<8,3,AP_RND_ZERO,AP_WRAP,1>",
        "ap_fixed<8,3,AP_RND_INF,AP_WRAP,3>",
        "ap_ufixed<8,3,AP_RND_CONV,AP_WRAP,2>",
        "ap_fixed<12,4,AP_TRN,AP_WRAP,12>",
        "ap_fixed<53,20,AP_RND_CONV,AP_WRAP>",
        "ap_fixed<54,2,AP_RND,AP_SAT>",
        "ap_fixed<20,-1055,AP_RND,AP_SAT>",  # LSB below the subnormals: the header's decoding shows
        "ap_fixed<64,-1010,AP_RND_CONV,AP_WRAP>",
        "ap_fixed<8,1030,AP_RND,AP_SAT>",  # 1e308 and inf land inside the range
        "ap_ufixed<16,1025,AP_RND_INF,AP_WRAP>",
        "ap_int<1>",
        "ap_int<8>",
        "ap_int<33>",
        "ap_int<64>",
        "ap_uint<1>",
        "ap_uint<16>",
        "ap_uint<64>",
    ]
]


# Every Q x O pair, signed and unsigned, and AP_WRAP with N, on one small format.
MODE_GRID_TYPES = [FixedType(9, 3, s, q, o) for q in ROUNDING_MODES for o in OVERFLOW_MODES for s in (True, False)] + [
    FixedType(9, 3, s, q, "AP_WRAP", 2) for q in ROUNDING_MODES for s in (True, False)
]


def _quantize_types() -> list[FixedType]:
    rng = np.random.default_rng(SEED)
    return CORNER_TYPES + MODE_GRID_TYPES + [_random_type(rng) for _ in range(45)]


def _cast_pairs() -> list[tuple[FixedType, FixedType]]:
    rng = np.random.default_rng(SEED + 1)
    pairs = [
        (P("ap_fixed<64,32>"), P("ap_fixed<1,1,AP_RND,AP_SAT_SYM>")),
        (P("ap_ufixed<64,60>"), P("ap_fixed<64,64,AP_RND,AP_SAT>")),
        (P("ap_fixed<64,2>"), P("ap_ufixed<64,2,AP_RND_CONV,AP_SAT>")),
        (P("ap_fixed<64,3>"), P("ap_fixed<8,3,AP_RND_CONV,AP_SAT_SYM>")),
        (P("ap_fixed<16,6>"), P("ap_fixed<8,3,AP_RND_ZERO,AP_WRAP,2>")),
        (P("ap_fixed<16,6>"), P("ap_ufixed<8,3,AP_RND_INF,AP_WRAP,3>")),
        (P("ap_fixed<16,6>"), P("ap_int<8>")),
        (P("ap_fixed<16,30>"), P("ap_int<8>")),
        (P("ap_fixed<8,1>"), P("ap_int<4>")),
        (P("ap_fixed<8,0>"), P("ap_int<8>")),  # to_ap_int_base() quirk for I <= 0
        (P("ap_fixed<8,0>"), P("ap_uint<5>")),
        (P("ap_ufixed<12,4>"), P("ap_int<3>")),
        (P("ap_int<16>"), P("ap_fixed<8,4,AP_RND,AP_SAT>")),
        (P("ap_uint<64>"), P("ap_int<8>")),
        (P("ap_int<64>"), P("ap_uint<64>")),
        (P("ap_uint<64>"), P("ap_ufixed<8,-2,AP_RND_CONV,AP_SAT_SYM>")),
        (P("ap_fixed<40,-20>"), P("ap_fixed<6,2,AP_RND_CONV,AP_SAT>")),
        (P("ap_fixed<6,2>"), P("ap_fixed<40,-20,AP_RND,AP_SAT_ZERO>")),
        (P("ap_fixed<1,1>"), P("ap_ufixed<64,64,AP_RND,AP_SAT>")),
    ]
    while len(pairs) < 75:
        s, d = _random_type(rng), _random_type(rng)
        if not (d.is_int and not s.is_int and s.integer < 0):  # undefined in ap_types: ValueError
            pairs.append((s, d))
    return pairs


def _arith_pairs(op: str, count: int, seed: int) -> list[tuple[FixedType, FixedType]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[FixedType, FixedType]] = []
    width = {"add": add_type, "sub": sub_type, "mul": mul_type}[op]
    if op == "mul":
        out += [(P("ap_fixed<32,16>"), P("ap_fixed<32,16>")), (P("ap_ufixed<32,2>"), P("ap_ufixed<32,40>")), (P("ap_ufixed<1,1>"), P("ap_fixed<1,-3>")), (P("ap_uint<32>"), P("ap_uint<32>"))]
    else:
        out += [(P("ap_fixed<63,10>"), P("ap_fixed<20,10>")), (P("ap_ufixed<57,57>"), P("ap_ufixed<8,2>")), (P("ap_ufixed<16,6>"), P("ap_fixed<16,6>")), (P("ap_int<8>"), P("ap_uint<8>"))]
    while len(out) < count:
        a, b = _random_type(rng, allow_int=False), _random_type(rng, allow_int=False)
        if width(a, b).width <= 64:
            out.append((a, b))
    return out


def _acc_pairs() -> list[tuple[FixedType, FixedType]]:
    rng = np.random.default_rng(SEED + 7)
    pairs = [
        (P("ap_fixed<32,12>"), P("ap_fixed<24,14,AP_TRN,AP_WRAP>")),  # fast path, quantizing
        (P("ap_fixed<32,12>"), P("ap_fixed<24,14,AP_RND,AP_WRAP>")),  # fast path, RND
        (P("ap_fixed<16,6>"), P("ap_fixed<18,8>")),  # fast path, exact
        (P("ap_fixed<16,6>"), P("ap_fixed<12,6,AP_RND_CONV,AP_SAT>")),
        (P("ap_fixed<16,6>"), P("ap_fixed<12,4,AP_RND_ZERO,AP_WRAP>")),
        (P("ap_ufixed<16,6>"), P("ap_fixed<10,6,AP_RND_INF,AP_SAT_SYM>")),
        (P("ap_fixed<16,6>"), P("ap_ufixed<12,8,AP_TRN,AP_SAT>")),
        (P("ap_fixed<16,6>"), P("ap_fixed<12,7,AP_TRN_ZERO,AP_WRAP,2>")),
        (P("ap_fixed<24,4>"), P("ap_fixed<40,20,AP_RND_CONV,AP_SAT_ZERO>")),
    ]
    while len(pairs) < 16:
        x, a = _random_type(rng, 40, allow_int=False), _random_type(rng, 40, allow_int=False)
        if add_type(a, x).width <= 64:
            pairs.append((x, a))
    return pairs


def _float_inputs(t: FixedType, rng: np.random.Generator) -> np.ndarray:
    """Adversarial doubles for type t: ties at every bit position, range edges, wraps, tiny, specials."""
    with np.errstate(over="ignore"):  # values past the double range become inf: wanted
        return _float_inputs_unguarded(t, rng)


def _float_inputs_unguarded(t: FixedType, rng: np.random.Generator) -> np.ndarray:
    f = t.F
    lo, hi = t.min_raw, t.max_raw
    ints: list[int] = [0, 1, 2, 3, 5, 7]
    for k in range(0, min(t.width + 2, 52)):
        ints += [1 << k, (1 << k) - 1, (1 << k) + 1]
    ints += [int(v) for v in rng.integers(0, 1 << 50, 20) >> rng.integers(0, 50, 20)]
    n = np.array(ints, dtype=np.float64)
    ties = np.ldexp(2 * n + 1, -f - 1)  # exactly (n + 1/2) LSB: every rounding mode's tie
    near = np.concatenate([np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    edges_raw = np.array([hi - 1, hi, hi + 1, hi + 2, lo - 2, lo - 1, lo, lo + 1], dtype=np.float64)
    edges = np.concatenate([np.ldexp(edges_raw, -f), np.ldexp(edges_raw + 0.5, -f), np.ldexp(edges_raw - 0.5, -f)])
    span = 2.0**t.width
    wraps = np.ldexp(np.array([k * span + r for k in (1, 2, 3, 5, 1000) for r in (0, 1, hi, lo, 0.5, -0.5)], dtype=np.float64), -f)
    tiny = np.ldexp(1.0, -f - np.arange(1, 80))
    special = np.array([0.0, 5e-324, 1e-320, 2.2250738585072014e-308, 2.225073858507201e-308, 1e-300, 0.1, 1.0, 1e300, 1.7976931348623157e308, np.inf])
    # random values across scales: log-uniform magnitude from 2**-(F+8) to 2**(I+8)
    e = rng.integers(-f - 8, t.integer + 9, 300)
    rand = np.ldexp(rng.uniform(0.5, 1.0, 300), e)
    on_grid = np.ldexp(rng.integers(-(2**52), 2**52, 100).astype(np.float64) + rng.random(100), -f + min(0, 52 - t.width))
    mag = np.concatenate([ties, near, edges, wraps, tiny, special, rand, on_grid])
    x = np.concatenate([mag, -mag, [-0.0]])
    return x[~np.isnan(x)]


def _raw_inputs(t: FixedType, rng: np.random.Generator, size: int = 400, dst: FixedType | None = None) -> np.ndarray:
    """Raw values of t: uniform over the range, small ones, the edges, and ties for a target dst."""
    dt = t.raw_dtype
    lo, hi = t.min_raw, t.max_raw
    vals = [rng.integers(lo, hi, size=size, dtype=dt, endpoint=True)]
    small = rng.integers(-300, 300, size=size // 4)
    vals.append(np.clip(small, lo, hi).astype(dt))
    edges = [v for v in (lo, lo + 1, lo + 2, -1, 0, 1, 2, hi - 1, hi, hi // 2, hi // 2 + 1, lo // 2, lo // 2 - 1) if lo <= v <= hi]
    vals.append(np.array(edges, dtype=object).astype(dt))
    if dst is not None and t.F > dst.F:
        s = t.F - dst.F  # raw = (m + 1/2) LSB of dst, i.e. exact ties of the conversion
        if s < t.width:
            m = rng.integers(-(1 << max(t.width - s - 1, 0)), 1 << max(t.width - s - 1, 0), size=size // 4)
            tie = [int(v) * (1 << s) + (1 << (s - 1)) for v in m] + [(1 << (s - 1)), -(1 << (s - 1))]
            vals.append(np.array([v for v in tie if lo <= v <= hi], dtype=object).astype(dt))
    return np.concatenate(vals)


# ---------------------------------------------------------------------------------------------------
# One program, all cases
# ---------------------------------------------------------------------------------------------------
class _Suite:
    def __init__(self) -> None:
        rng = np.random.default_rng(SEED + 100)
        self.cases: list = []
        self.inputs: list = []
        C = fixed_proof.Case
        for t in _quantize_types():
            self.cases.append(C("quantize", (t,)))
            self.inputs.append(_float_inputs(t, rng))
        for s, d in _cast_pairs():
            self.cases.append(C("cast", (s, d)))
            self.inputs.append(_raw_inputs(s, rng, dst=d))
        for op, seed in (("add", SEED + 2), ("sub", SEED + 3), ("mul", SEED + 4)):
            for a, b in _arith_pairs(op, 14, seed):
                self.cases.append(C(op, (a, b)))
                ra = _raw_inputs(a, rng, 200)
                rb = np.resize(rng.permutation(_raw_inputs(b, rng, 200)), ra.size)
                self.inputs.append((ra, rb))
        for x, a in _acc_pairs():
            k = 12
            xs = _raw_inputs(x, rng, 600)[: 40 * k]
            xs = np.resize(xs, 40 * k)
            rng.shuffle(xs)
            xs = xs.reshape(40, k)
            # a few rows pinned at the extremes so saturation / wrap paths run every time
            xs[0, :] = x.max_raw
            xs[1, :] = x.min_raw
            init = _raw_inputs(a, rng, 40)[:40]
            self.cases.append(C("acc", (x, a)))
            self.inputs.append((xs, init))
        self.results = fixed_proof.run_cases(self.cases, self.inputs)

    def of(self, op: str):
        return [(c, x, r) for c, x, r in zip(self.cases, self.inputs, self.results) if c.op == op]


@pytest.fixture(scope="module")
def suite() -> _Suite:
    if not _have_toolchain():
        pytest.skip("g++ / ap_types headers not available")
    return _Suite()


def _mismatch_report(what: str, inputs, got, ref, limit: int = 6) -> str:
    bad = np.flatnonzero(np.asarray(got) != np.asarray(ref))
    lines = [f"{what}: {bad.size} mismatches"]
    for i in bad[:limit]:
        lines.append(f"  in={np.ravel(inputs)[i]!r} ours={np.ravel(got)[i]} ap_types={np.ravel(ref)[i]}")
    return "\n".join(lines)


@needs_cxx
def test_quantize_matches_ap_types(suite):
    failures = []
    for c, x, (ref, _) in suite.of("quantize"):
        (t,) = c.types
        got = t.quantize(x)
        assert got.dtype == t.raw_dtype
        if not np.array_equal(got, ref):
            failures.append(_mismatch_report(f"quantize {t}", x, got, ref))
    assert not failures, "\n".join(failures)


@needs_cxx
def test_to_float_matches_to_double(suite):
    failures = []
    for c, x, (ref, back) in suite.of("quantize"):
        (t,) = c.types
        if t.F > 1000 or t.integer > 1000:
            continue  # to_double() builds the exponent field without range checks there
        got = t.to_float(ref)
        if not np.array_equal(got.view(np.uint64), back.view(np.uint64)):
            failures.append(_mismatch_report(f"to_float {t}", ref, got, back))
    assert not failures, "\n".join(failures)


@needs_cxx
def test_cast_matches_ap_types(suite):
    failures = []
    for c, x, ref in suite.of("cast"):
        s, d = c.types
        got = d.cast(x, s)
        if not np.array_equal(got, ref):
            failures.append(_mismatch_report(f"cast {s} -> {d}", x, got, ref))
    assert not failures, "\n".join(failures)


@needs_cxx
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_arithmetic_matches_ap_types(suite, op):
    fn, tfn = {"add": (add, add_type), "sub": (sub, sub_type), "mul": (mul, mul_type)}[op]
    failures = []
    for c, (a, b), (ref, (w, i, s)) in suite.of(op):
        at, bt = c.types
        rt = tfn(at, bt)
        assert (rt.width, rt.integer, rt.signed) == (w, i, s), f"{at} {op} {bt}: ours {rt}, ap_types <{w},{i},{s}>"
        got, gt = fn(a, at, b, bt)
        assert gt == rt
        if not np.array_equal(got, ref):
            failures.append(_mismatch_report(f"{at} {op} {bt}", a, got, ref))
    assert not failures, "\n".join(failures)


@needs_cxx
def test_accumulate_matches_acc_plus_equals_loop(suite):
    failures = []
    for c, (xs, init), ref in suite.of("acc"):
        xt, at = c.types
        got = accumulate(xs, xt, at, axis=1, init=init)
        if not np.array_equal(got, ref):
            failures.append(_mismatch_report(f"acc {at} += {xt}", init, got, ref))
        # the same sum along axis 0 of the transposed array
        assert np.array_equal(accumulate(xs.T, xt, at, axis=0, init=init), got)
    assert not failures, "\n".join(failures)


@needs_cxx
def test_proof_covers_every_mode(suite):
    """The proof above only proves what it runs: every Q x O pair, N, W=1, W=64, I<0, I>W, ap_int."""
    qt = [c.types[0] for c in suite.cases if c.op == "quantize"]
    combos = {(t.rounding, t.overflow, t.signed) for t in qt if not t.is_int}
    assert combos >= {(q, o, s) for q in ROUNDING_MODES for o in OVERFLOW_MODES for s in (True, False)}
    assert any(t.sat_bits for t in qt) and any(t.is_int for t in qt)
    assert {1, 64} <= {t.width for t in qt}
    assert any(t.integer < 0 for t in qt) and any(t.integer > t.width for t in qt)
    ops = {c.op for c in suite.cases}
    assert ops == {"quantize", "cast", "add", "sub", "mul", "acc"}


def test_proof_case_validation():
    with pytest.raises(ValueError, match="Case.op must be one of"):
        fixed_proof.Case("div", (P("ap_fixed<8,3>"), P("ap_fixed<8,3>")))
    with pytest.raises(ValueError, match="takes 2 types"):
        fixed_proof.Case("cast", (P("ap_fixed<8,3>"),))
    with pytest.raises(ValueError, match="wider than the 64 bits"):
        fixed_proof.Case("mul", (P("ap_fixed<40,3>"), P("ap_fixed<40,3>")))
    with pytest.raises(ValueError, match="at most 64 bits"):
        fixed_proof.Case("quantize", (P("ap_fixed<65,3>"),))


@pytest.mark.slow
@needs_cxx
def test_random_sweep_second_seed():
    """A second, independent draw of random types (quantize, cast, accumulate) in its own program."""
    rng = np.random.default_rng(SEED + 1000)
    C = fixed_proof.Case
    cases, inputs = [], []
    while len(cases) < 40:
        t = _random_type(rng)
        cases.append(C("quantize", (t,)))
        inputs.append(_float_inputs(t, rng))
    while len(cases) < 80:
        s, d = _random_type(rng), _random_type(rng)
        if not (d.is_int and not s.is_int and s.integer < 0):
            cases.append(C("cast", (s, d)))
            inputs.append(_raw_inputs(s, rng, dst=d))
    while len(cases) < 90:
        x, a = _random_type(rng, 40, allow_int=False), _random_type(rng, 40, allow_int=False)
        if add_type(a, x).width <= 64:
            xs = np.resize(_raw_inputs(x, rng, 300), 300)
            rng.shuffle(xs)
            cases.append(C("acc", (x, a)))
            inputs.append((xs.reshape(30, 10), _raw_inputs(a, rng, 30)[:30]))
    failures = []
    for c, x, ref in zip(cases, inputs, fixed_proof.run_cases(cases, inputs)):
        if c.op == "quantize":
            got, ref = c.types[0].quantize(x), ref[0]
        elif c.op == "cast":
            got = c.types[1].cast(x, c.types[0])
        else:
            got = accumulate(x[0], c.types[0], c.types[1], axis=1, init=x[1])
        if not np.array_equal(got, ref):
            failures.append(_mismatch_report(f"{c.op} {', '.join(map(str, c.types))}", x if c.op != "acc" else x[1], got, ref))
    assert not failures, "\n".join(failures)

"""The fused MLP program's int32 lanes: chosen only where the program's bounds prove every value a
dense loop forms exact in int32 (or the accumulator wraps into at most 32 bits), and exact there.

Each case is one dense layer whose inputs and weights reach a bound's edge: just inside it the
program must take int32 lanes and equal the reference; one step outside it must take int64
lanes, and equal the reference. Forcing int32 lanes on the outside case must give wrong answers:
the case really crosses the edge, so a builder that moved a bound past it would fail here.
"""

from __future__ import annotations

import numpy as np
import pytest

import offload.sim.mlp as simmlp
from mlp_cases import adversarial_inputs, random_spec
from offload.sim.fixed import FixedType
from offload.sim.mlp import MlpLayer, fused

pytestmark = pytest.mark.skipif(not fused.available(), reason="numba missing")

X = "ap_fixed<16,6>"  # raw inputs in [-32768, 32767]: F = 10
XMIN = FixedType.parse(X).min_raw


def _lanes(prog: fused.Program) -> list[int]:
    out = []
    for k in range(int(prog.prog[fused._H_N])):
        r = prog.prog[fused._HEAD + k * fused._REC:][: fused._REC]
        if r[fused._R_OP] == fused._OP_DENSE:
            out.append(int(r[fused._R_LANE]))
    return out


def _mode(prog: fused.Program) -> int:
    return int(prog.prog[fused._HEAD + fused._R_MODE])


def _rows(n_in: int) -> np.ndarray:
    """Every input at the type's most negative value (the largest products with negative
    weights), at its largest, mixed, and random rows; a batch that is not a multiple of the
    kernel's row block."""
    t = FixedType.parse(X)
    lo, hi = t.min_raw * t.lsb, t.max_raw * t.lsb
    rng = np.random.default_rng(n_in)
    x = [np.full(n_in, lo), np.full(n_in, hi), np.where(np.arange(n_in) % 2, lo, hi)]
    x += list(rng.integers(t.min_raw, t.max_raw, size=(38, n_in), endpoint=True) * t.lsb)
    return np.array(x)


def _layer(n_in: int, n_out: int, weight: str, accum: str, result: str | None = None) -> MlpLayer:
    return MlpLayer("fc", "dense", n_in, n_out, result or accum, weight=weight, accum=accum, use_bias=False)


# (name, layer, weight column (raw), loop the layer must take). Each pair: inside, then outside.
def _cases():
    rnd = "AP_RND"
    cases = []
    for n_out in (1, 3):  # the dot path and the matrix loop
        # rounded: a product with its rounding bias must be exact before the shift. Input F = 10,
        # weight F = 16, accumulator F = 12: s = 14; products up to 32768 * 65535 = 2**31 - 2**15
        # (+ 2**14 of bias): inside; 32768 * 65536 = 2**31 does not fit int32.
        for w in (-65535, -65536):
            cases.append((f"rounded product {w} x{n_out}", _layer(2, n_out, "ap_fixed<18,2>", f"ap_fixed<40,28,{rnd}>"),
                          [w, 1], fused._D_ROUNDED, w == -65535))
        # rounded, the accumulator wrapping into 20 bits: the same product edge. (A product that
        # wrapped in int32 is off by 2**(32 - s) = 2**18 once shifted: a wrap into 18 bits or
        # fewer would hide it, 20 bits shows it.)
        for w in (-65535, -65536):
            cases.append((f"rounded wrap product {w} x{n_out}", _layer(4, n_out, "ap_fixed<18,2>", f"ap_fixed<20,8,{rnd}>"),
                          [w, 1, 1, 1], fused._D_ROUNDED, w == -65535))
        # rounded, no fit: the partial sums. Products 2**30, s = 1: terms of 2**29; three of them
        # stay inside int32, four reach 2**31.
        for n_in in (3, 4):
            cases.append((f"rounded sum of {n_in} x{n_out}", _layer(n_in, n_out, "ap_fixed<16,6>", f"ap_fixed<50,31,{rnd}>"),
                          [-32768] * n_in, fused._D_ROUNDED, n_in == 3))
        # plain, no fit (products exact on the accumulator grid: F 20): a column sum of
        # 32768 * (32768 + 32767) stays inside, 32768 * 65536 = 2**31 does not.
        for w2 in (-32767, -32768):
            cases.append((f"plain sum {w2} x{n_out}", _layer(2, n_out, "ap_fixed<16,6>", "ap_fixed<50,30>"),
                          [-32768, w2], fused._D_PLAIN, w2 == -32767))
        # plain, the accumulator wrapping: into 32 bits int32's own wrap is exact; into 33 it is
        # not (four products of 2**30: 2**32, which 33 bits hold as -2**32 and int32 as 0).
        for width in (32, 33):
            cases.append((f"plain wrap into {width} x{n_out}", _layer(4, n_out, "ap_fixed<16,6>", f"ap_fixed<{width},{width - 20}>"),
                          [-32768] * 4, fused._D_PLAIN, width == 32))
    # Saturating accumulators (always the matrix loop): a clamped sum plus a clamped product in
    # [2 * lo, 2 * hi] must fit. ap_fixed<31>: [-2**31, 2**31 - 2], inside; ap_fixed<32>: 2**32 - 2.
    # Unsigned: ap_ufixed<30> inside, ap_ufixed<31> not. Products 2**30, s = 0.
    for ovf, loop in (("AP_SAT", fused._D_SAT), ("AP_SAT_ZERO", fused._D_SATZ)):
        for n_out in (1, 3):
            for width in (31, 32):
                cases.append((f"{ovf} ap_fixed<{width}> x{n_out}", _layer(3, n_out, "ap_fixed<16,6>", f"ap_fixed<{width},{width - 20},AP_TRN,{ovf}>"),
                              [-32768, -32768, 32767], loop, width == 31))
            for width in (30, 31):
                cases.append((f"{ovf} ap_ufixed<{width}> x{n_out}", _layer(3, n_out, "ap_fixed<16,6>", f"ap_ufixed<{width},{width - 20},AP_TRN,{ovf}>"),
                              [-32768, -32768, 32767], loop, width == 30))
    return cases


CASES = _cases()


@pytest.mark.parametrize("name,layer,column,loop,inside", CASES, ids=[c[0] for c in CASES])
def test_lanes_at_the_int32_edges(name, layer, column, loop, inside, monkeypatch):
    tensors = {"fc.weight": np.tile(np.array(column, dtype=np.int64)[:, None], (1, layer.n_out))}
    tensors["fc.weight"][:, 1:] //= 3  # other columns: smaller weights, other sums
    layers = (layer,)
    x = _rows(layer.n_in)
    want = simmlp.simulate(X, layers, tensors, x)
    prog = fused.compile_program(X, layers, tensors)
    assert prog is not None and _mode(prog) == loop
    assert _lanes(prog) == [fused._LANE32 if inside else fused._LANE64]
    for rows in (x, x[:1], x[:7]):
        np.testing.assert_array_equal(prog.run(rows), want[: len(rows)])
    # int32 lanes here really are wrong: the edge is where the builder put it. (Not for an
    # unsigned AP_SAT_ZERO accumulator: a sum past int32 turns negative, below its range, and is
    # zeroed as the true sum past its range is; the bound is one bit tighter than it need be.)
    if not inside and not (loop == fused._D_SATZ and not FixedType.parse(layer.accum).signed):
        monkeypatch.setattr(fused, "_lane", lambda *a: fused._LANE32)
        forced = fused.compile_program(X, layers, tensors)
        assert _lanes(forced) == [fused._LANE32]
        assert not np.array_equal(forced.run(x), want)


def test_every_batch_size_around_the_row_block():
    # Blocks of rows, then the rest one at a time: every split of a batch gives the reference's
    # rows, in both lane widths.
    for seed, narrow in ((3, True), (4, False), (21, True)):
        spec, _ = random_spec(seed, narrow=narrow)
        tensors = spec.tensors()
        prog = fused.program_for(spec.input_type, spec.layers, tensors)
        x = adversarial_inputs(np.random.default_rng(seed), 40, spec.n_features, spec.input_type)
        x[np.abs(x) > 1e200] = 0.5
        want = simmlp.simulate(spec.input_type, spec.layers, tensors, x)
        for n in range(1, 14):
            np.testing.assert_array_equal(prog.run(x[:n]), want[:n])
            np.testing.assert_array_equal(prog.run(x[n:]), want[n:])


def test_the_edge_cases_put_every_dense_loop_on_both_sides_of_its_bound():
    # The edge test above asserts the lane each case takes; this keeps its table complete, so every
    # dense loop is checked against the reference in both widths (the random specs alone reach the
    # int32 lane only for the plain loop).
    assert {(loop, inside) for *_, loop, inside in CASES} == {(m, side) for m in range(4) for side in (True, False)}

"""The MLP simulator's fused compiled program against its step-by-step reference.

The mlp kind's fast path (``run_rows``) runs :mod:`offload.sim.mlp.fused` first: every layer of a
row in one numba call, in int64 arithmetic. Zero mismatches are required against the reference
(``offload.sim.mlp.simulate``, the oracle; itself proven against hls4ml's C-simulation in
test_mlp_hls4ml.py) on random specs with every rounding / overflow mode, on types at the limits,
and on targeted cases: exact rounding ties of every product, saturation and wrap-around edges,
table edges, input ties and the float quantization's limit.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

import numpy as np
import pytest

import offload.sim.mlp as simmlp
from mlp_cases import OVERFLOW, ROUNDING, adversarial_inputs, random_spec
from offload.kernels.mlp import MlpSpec, bind_rows, run_rows
from offload.sim.fixed import FixedType
from offload.sim.mlp import MlpLayer, fused

pytestmark = pytest.mark.skipif(not fused.available(), reason="numba missing")


def _general(input_type, layers, tensors, x, monkeypatch) -> np.ndarray:
    """The step-by-step reference."""
    return simmlp.simulate(input_type, layers, tensors, x)


def _fused(input_type, layers, tensors, x, monkeypatch) -> np.ndarray:
    """The kind's fast path with the reference made to fail: the call must take the program."""
    def fail(*a, **k):
        raise AssertionError("run_rows() left the fused program")

    with monkeypatch.context() as m:
        m.setattr(simmlp, "simulate", fail)
        return run_rows(input_type, layers, tensors, x)


def _inputs(rng, rows: int, nf: int, input_type: str) -> np.ndarray:
    """Adversarial rows with the +-1e300 ones brought down to +-1e6 (larger take the reference)."""
    x = adversarial_inputs(rng, rows, nf, input_type)
    huge = np.abs(x) > 1e200
    x[huge] = np.sign(x[huge]) * 1e6
    return x


def _kinds(prog: fused.Program) -> collections.Counter:
    """What a program exercises: ops, dense loops, fit kinds of the accumulator."""
    c = collections.Counter()
    for k in range(int(prog.prog[fused._H_N])):
        r = prog.prog[fused._HEAD + k * fused._REC:][: fused._REC]
        op = int(r[fused._R_OP])
        c[("op", op)] += 1
        if op == fused._OP_DENSE:
            c[("dense", int(r[fused._R_MODE]))] += 1
            c[("accfit", int(r[fused._R_A + fused._OVF]))] += 1
        c[("fit", int(r[fused._R_B2 + fused._OVF]))] += 1
    return c


@pytest.mark.parametrize("narrow", [True, False])
def test_fused_equals_general_path_on_random_specs(narrow, monkeypatch):
    kinds = collections.Counter()
    for seed in range(60):
        spec, _ = random_spec(seed, narrow=narrow)
        tensors = spec.tensors()
        rng = np.random.default_rng(seed)
        x = _inputs(rng, 600, spec.n_features, spec.input_type)
        prog = fused.program_for(spec.input_type, spec.layers, tensors)
        assert prog is not None, spec.layers
        kinds.update(_kinds(prog))
        want = _general(spec.input_type, spec.layers, tensors, x, monkeypatch)
        y = _fused(spec.input_type, spec.layers, tensors, x, monkeypatch)
        bad = np.argwhere(y != want)
        assert len(bad) == 0, f"seed {seed}: {len(bad)} mismatches, first {bad[:3].tolist()}"
        for i in range(0, 600, 41):  # batch 1
            assert np.array_equal(_fused(spec.input_type, spec.layers, tensors, x[i : i + 1], monkeypatch), want[i : i + 1])
    ops = {kinds[("op", o)] > 0 for o in range(5)}
    assert ops == {True}, kinds
    if narrow:  # every dense loop and every accumulator fit
        assert all(kinds[("dense", m)] for m in range(4)), kinds
        assert all(kinds[("accfit", f)] for f in range(4)), kinds
    else:
        assert kinds[("dense", fused._D_PLAIN)] and kinds[("accfit", fused._FIT_NONE)]


def _edge_type(rng, wmax: int, signed_p: float = 0.8) -> str:
    w = int(rng.integers(2, wmax + 1))
    i = int(rng.integers(-6, w + 7))
    q, o = str(rng.choice(ROUNDING)), str(rng.choice(OVERFLOW))
    n = int(rng.integers(1, w + 1)) if o == "AP_WRAP" and rng.random() < 0.2 else 0
    return str(FixedType(w, i, bool(rng.random() < signed_p), q, o, n))


def test_fused_equals_general_path_at_type_edges(monkeypatch):
    """Widths up to the program's int64 limits, I > W and I < 0, unsigned types, AP_WRAP with N,
    tables of any size over inputs with F <= 0: each model either runs exactly or is refused."""
    rng = np.random.default_rng(7)
    done = refused = 0
    kinds = collections.Counter()
    for trial in range(400):
        nf, hid = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        layers = [
            MlpLayer("fc0", "dense", nf, hid, _edge_type(rng, 40), weight=_edge_type(rng, 20),
                     bias=_edge_type(rng, 20), accum=_edge_type(rng, 62)),
            MlpLayer("act1", str(rng.choice(["relu", "leaky_relu", "sigmoid", "tanh"])), hid, hid, _edge_type(rng, 30),
                     param=_edge_type(rng, 12), alpha=float(rng.choice([0.01, 0.3, -0.5])),
                     table=_edge_type(rng, 18), table_size=int(rng.integers(2, 3000))),
            MlpLayer("bn2", "batchnorm", hid, hid, _edge_type(rng, 30), scale=_edge_type(rng, 16), bias=_edge_type(rng, 16)),
            MlpLayer("fc3", "dense", hid, int(rng.integers(1, 3)), _edge_type(rng, 40), weight=_edge_type(rng, 16),
                     accum=_edge_type(rng, 50), use_bias=False),
        ]
        consts = {}
        for layer in layers:
            roles = {"dense": ("weight", "bias") if layer.use_bias else ("weight",), "batchnorm": ("scale", "bias")}.get(layer.op, ())
            for role in roles:
                t = FixedType.parse(getattr(layer, role))
                shape = (layer.n_in, layer.n_out) if role == "weight" else (layer.n_out,)
                consts[f"{layer.name}.{role}"] = rng.integers(t.min_raw, t.max_raw, size=shape, endpoint=True)
        try:
            spec = MlpSpec(nf, _edge_type(rng, 40), tuple(layers), consts)
        except ValueError:
            continue  # a product or table index wider than the spec allows
        tensors = spec.tensors()
        prog = fused.program_for(spec.input_type, spec.layers, tensors)
        if prog is None:
            refused += 1
            continue
        x = _inputs(rng, 64, nf, spec.input_type)
        y = prog.run(x)
        if y is None:  # an input past the float quantization's limit
            continue
        done += 1
        kinds.update(_kinds(prog))
        assert np.array_equal(y, _general(spec.input_type, spec.layers, tensors, x, monkeypatch)), (trial, spec.input_type, spec.layers)
    assert done >= 100 and refused >= 10, (done, refused)
    assert all(kinds[("dense", m)] for m in range(4)) and all(kinds[("fit", f)] for f in range(4)), kinds


@pytest.mark.parametrize("rounding", ROUNDING)
def test_every_product_a_tie_at_saturation_and_wrap_edges(rounding, monkeypatch):
    """Products one bit finer than the accumulator (every odd product an exact tie), all input
    values of the type exhaustively, weights at the extremes, accumulators narrow enough that
    products and partial sums leave their range: every overflow mode."""
    xt = "ap_fixed<6,3>"  # F = 3; weights F = 4: products F = 7, the accumulator F = 6
    w_t = "ap_fixed<6,2>"
    grid = np.arange(-32, 32) / 8.0  # every raw value of ap_fixed<6,3>
    x = np.array(list(itertools.product(grid, grid[::3])))  # 2 features
    for overflow, width, signed in itertools.product(OVERFLOW, (7, 9, 12), (True, False)):
        acc = str(FixedType(width, width - 6, signed, rounding, overflow))
        res = str(FixedType(8, 4, True, rounding, "AP_SAT" if overflow == "AP_WRAP" else "AP_WRAP"))
        layers = (MlpLayer("fc", "dense", 2, 4, res, weight=w_t, bias=w_t, accum=acc),)
        tensors = {"fc.weight": np.array([[-32, 31, 17, -1], [31, -32, -17, 3]]), "fc.bias": np.array([0, 5, -32, 31])}
        want = _general(xt, layers, tensors, x, monkeypatch)
        assert np.array_equal(_fused(xt, layers, tensors, x, monkeypatch), want), (acc, res)


def test_table_edges_and_input_ties(monkeypatch):
    """Sigmoid/tanh indices at 0, N-1 and one step either side; table sizes that are not powers of
    two; table inputs with F <= 0 (the index shifts left); every input rounding mode on exact ties.
    A batchnorm of scale 1 brings the input into the table's input type ``it``."""
    rng = np.random.default_rng(3)
    for op, n, it, tt in [("sigmoid", 1024, "ap_fixed<16,6>", "ap_fixed<18,8>"), ("tanh", 1000, "ap_fixed<12,8>", "ap_ufixed<10,1>"),
                          ("sigmoid", 3, "ap_fixed<8,10>", "ap_fixed<10,2,AP_RND,AP_SAT>"),
                          ("tanh", 2047, "ap_fixed<20,4,AP_RND_CONV>", "ap_fixed<14,2>"),
                          ("sigmoid", 700, "ap_fixed<10,12,AP_RND_INF>", "ap_fixed<9,1>")]:
        t = FixedType.parse(it)
        span = 16 if op == "sigmoid" else 8
        edges = np.array([-span / 2, span / 2, 0.0])[:, None] + np.arange(-3, 4)[None, :] * t.lsb
        lsb_in = 2.0**-12
        x = np.concatenate([edges.ravel(), (np.arange(-50, 50) + 0.5) * lsb_in, (np.arange(-20, 20) + 0.5) * t.lsb,
                            rng.normal(size=200) * span])[:, None]
        layers = (MlpLayer("bn", "batchnorm", 1, 1, it, scale="ap_fixed<4,2>", bias="ap_fixed<4,2>"),
                  MlpLayer("a", op, 1, 1, "ap_fixed<12,2,AP_RND_ZERO,AP_SAT_ZERO>", table=tt, table_size=n))
        tensors = {"bn.scale": np.array([4]), "bn.bias": np.array([0])}  # 1.0 and 0.0
        for q in ROUNDING:
            in_t = f"ap_fixed<24,12,{q},AP_SAT>"
            want = _general(in_t, layers, tensors, x, monkeypatch)
            assert np.array_equal(_fused(in_t, layers, tensors, x, monkeypatch), want), (op, n, in_t, it, tt)


def test_inputs_past_the_float_quantization_take_forward(monkeypatch):
    spec, _ = random_spec(5, narrow=True)
    tensors = spec.tensors()
    prog = fused.program_for(spec.input_type, spec.layers, tensors)
    t = FixedType.parse(spec.input_type)
    x = np.zeros((3, spec.n_features))
    x[1, 0] = np.nextafter(2.0 ** (62 - t.F), 0)  # the largest value the program quantizes itself
    assert prog.run(x) is not None
    assert np.array_equal(prog.run(x), _general(spec.input_type, spec.layers, tensors, x, monkeypatch))
    for v in (2.0 ** (62 - t.F), -np.inf, 1e300):
        x[2, 0] = v
        assert prog.run(x) is None
        assert np.array_equal(run_rows(spec.input_type, spec.layers, tensors, x),
                              _general(spec.input_type, spec.layers, tensors, x, monkeypatch))
    x[2, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        run_rows(spec.input_type, spec.layers, tensors, x)


def test_program_follows_changed_weights(monkeypatch):
    for seed in range(20, 60):  # a spec whose output is not constant, so changed weights show
        spec, _ = random_spec(seed, narrow=True)
        tensors = spec.tensors()
        rng = np.random.default_rng(seed)
        x = _inputs(rng, 200, spec.n_features, spec.input_type)
        before = _fused(spec.input_type, spec.layers, tensors, x, monkeypatch)
        if np.unique(before).size > 20:
            break
    name = [k for k in tensors if k.endswith(".weight")][-1]
    wt = FixedType.parse(spec.tensor_types()[name])
    tensors[name][...] = rng.integers(wt.min_raw, wt.max_raw, size=tensors[name].shape, endpoint=True)  # in place
    after = _fused(spec.input_type, spec.layers, tensors, x, monkeypatch)
    assert not np.array_equal(before, after)
    assert np.array_equal(after, _general(spec.input_type, spec.layers, tensors, x, monkeypatch))
    tensors[name] = np.full_like(tensors[name], wt.max_raw)  # a new array under the same name
    assert np.array_equal(_fused(spec.input_type, spec.layers, tensors, x, monkeypatch),
                          _general(spec.input_type, spec.layers, tensors, x, monkeypatch))
    frozen = {k: np.array(v, copy=True) for k, v in tensors.items()}
    for v in frozen.values():
        v.setflags(write=False)
    prog = fused.program_for(spec.input_type, spec.layers, frozen)
    assert all(snap is None for _, _, snap in prog.arrays)  # taken as constant: no per-call compare


def test_without_numba_falls_back_with_one_warning(monkeypatch):
    spec, _ = random_spec(8, narrow=True)
    tensors = spec.tensors()
    x = _inputs(np.random.default_rng(8), 100, spec.n_features, spec.input_type)
    want = _fused(spec.input_type, spec.layers, tensors, x, monkeypatch)
    monkeypatch.setattr(fused, "_NUMBA", None)
    monkeypatch.setattr(fused, "_warned", False)
    with pytest.warns(RuntimeWarning, match="numba is not installed"):
        got = run_rows(spec.input_type, spec.layers, tensors, x)
    assert np.array_equal(got, want)
    assert fused.warm_up() == 0.0


def test_device_load_warms_the_kernel(monkeypatch):
    """The mlp kind's prepare (run by every host device's load, the service's among them) compiles
    the kernel and builds the program for the very mapping the device then passes."""
    from offload.host.sim import SimDevice
    from offload.kernels import Kernel

    calls = []
    real = fused.warm_up
    monkeypatch.setattr(fused, "warm_up", lambda: calls.append(1) or real())
    spec, _ = random_spec(9, narrow=True)
    dev = SimDevice()
    h = dev.load(Kernel("m", spec, spec.tensors()))
    assert calls == [1] and fused._run_rows.signatures
    assert dev.info().details["jit_s"] >= 0.0
    x = _inputs(np.random.default_rng(9), 50, spec.n_features, spec.input_type)
    with monkeypatch.context() as m:
        m.setattr(fused, "compile_program", lambda *a: pytest.fail("the program was not built at load"))
        y = dev.run(h, {"x": x})["y"]
    assert np.array_equal(y, _general(spec.input_type, spec.layers, spec.tensors(), x, monkeypatch))
    # The device's resident copies (aligned views of a private read-only buffer) are taken as
    # constant: no per-call snapshot compare on the device's hot path.
    resident = dev._get(h).tensors
    prog = fused.program_for(spec.input_type, spec.layers, resident)
    assert prog.arrays and all(snap is None for _, _, snap in prog.arrays)
    dev.close()


def test_a_read_only_view_of_a_writable_buffer_is_not_taken_as_constant(monkeypatch):
    spec, _ = random_spec(10, narrow=True)
    base = {k: np.array(v, copy=True) for k, v in spec.tensors().items()}
    views = {k: v[...] for k, v in base.items()}
    for v in views.values():
        v.setflags(write=False)
    prog = fused.program_for(spec.input_type, spec.layers, views)
    assert prog.arrays and all(snap is not None for _, _, snap in prog.arrays)
    x = _inputs(np.random.default_rng(10), 100, spec.n_features, spec.input_type)
    before = run_rows(spec.input_type, spec.layers, views, x)
    name = [k for k in base if k.endswith(".weight")][0]
    base[name][...] = 0  # written through the base: the program must see it
    after = run_rows(spec.input_type, spec.layers, views, x)
    assert np.array_equal(after, _general(spec.input_type, spec.layers, views, x, monkeypatch))
    assert not np.array_equal(before, after) or np.unique(before).size == 1


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("seed", [11, 12])  # saturating and wrapping accumulators, batchnorm, leaky_relu
def test_fused_matches_hls4ml_directly(seed, tmp_path):
    """The program against hls4ml's compiled C-simulation itself, batch and batch 1."""
    from offload.hls.mlp import build_model

    spec, floats = random_spec(seed)
    tensors = spec.tensors()
    x = _inputs(np.random.default_rng(seed), 5000, spec.n_features, spec.input_type)
    prog = fused.program_for(spec.input_type, spec.layers, tensors)
    y = prog.run(x)
    assert y is not None
    model = build_model(spec, tmp_path, float_weights=floats)
    model.compile()
    want = np.asarray(model.predict(np.ascontiguousarray(x))).reshape(len(x), -1)
    assert np.array_equal(y, want), f"{int((y != want).sum())} mismatches"
    for i in range(0, 5000, 499):
        assert np.array_equal(prog.run(x[i : i + 1]), want[i : i + 1])


def test_bind_rows_is_the_reference_bit_for_bit(monkeypatch):
    # bind_rows() looks the program up once; every call must still be the reference's answer, on
    # the program's rows, on rows past the float quantization (the reference), and on a width the
    # program was not built for.
    for seed in range(12):
        spec, _ = random_spec(seed, narrow=seed % 2 == 0)
        tensors = spec.tensors()
        rng = np.random.default_rng(100 + seed)
        run = bind_rows(spec, tensors)
        x = adversarial_inputs(rng, 200, spec.n_features, spec.input_type)  # keeps the +-1e300 rows
        for rows in (x[:1], x[:64], x):
            np.testing.assert_array_equal(run(rows), simmlp.simulate(spec.input_type, spec.layers, tensors, rows))
    spec, _ = random_spec(0, narrow=False)
    run = bind_rows(spec, spec.tensors())
    wide = np.zeros((2, spec.n_features + 1))  # never handed to the program: simulate() refuses it
    with pytest.raises(ValueError, match="broadcast"):
        simmlp.simulate(spec.input_type, spec.layers, spec.tensors(), wide)
    with pytest.raises(ValueError, match="broadcast"):
        run(wide)


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bit patterns: -0.0 and 0.0 differ, as they do on the wire."""
    assert a.dtype == np.float32
    return np.ascontiguousarray(a).view(np.uint32)


def _wide_output_cases() -> list[tuple[MlpSpec, np.ndarray]]:
    """Specs whose outputs FP32 cannot hold, with float32 rows for them, so that its rounding has
    work: many fraction bits (ties of the float32 grid among them), and outputs in FP32's
    subnormal range (from subnormal float32 inputs of an input type with 150 fraction bits)."""
    from mlp_cases import quantize_like_hls4ml

    rng = np.random.default_rng(31)
    cases = []
    for it, result, accum, scale in (("ap_fixed<18,8>", "ap_fixed<40,12>", "ap_fixed<48,20>", 3.0),
                                     ("ap_fixed<18,8>", "ap_fixed<60,30>", "ap_fixed<60,30>", 3.0),
                                     ("ap_fixed<24,-126>", "ap_fixed<40,-118>", "ap_fixed<60,-104>", 2.0**-129)):
        nf, n_out = 6, 3
        w, b = rng.normal(size=(nf, n_out)), rng.normal(size=n_out) * scale
        layer = MlpLayer("fc0", "dense", nf, n_out, result, weight="ap_fixed<18,2>", bias=result, accum=accum, use_bias=True)
        consts = {"fc0.weight": quantize_like_hls4ml(w, "ap_fixed<18,2>"), "fc0.bias": quantize_like_hls4ml(b, result)}
        x = (rng.normal(size=(300, nf)) * scale).astype(np.float32)
        cases.append((MlpSpec(nf, it, (layer,), consts), x))
    return cases


def test_fp32_path_is_the_float64_path_rounded_to_fp32(monkeypatch):
    # run_fp32 reads float32 rows as they are and rounds each output as it stores it: bit for bit
    # the float64 path's outputs .astype(float32), on adversarial FP32 rows (ties of the input
    # type, its limits, values far outside), on rows past the float quantization (None, as run),
    # and through bind_rows(fp32=True) on every kind of input it may get. The random specs' outputs
    # fit FP32 (their types are narrow); the wide ones' do not, so the rounding itself is tested.
    fused.warm_up()
    compiled = len(fused._run_rows.signatures)
    cases = [(spec, _inputs(np.random.default_rng(200 + seed), 300, spec.n_features, spec.input_type).astype(np.float32))
             for seed, spec in ((s, random_spec(s, narrow=s % 2 == 0)[0]) for s in range(12))]
    rounded = subnormal = 0
    for seed, (spec, x32) in enumerate(cases + _wide_output_cases()):
        tensors = spec.tensors()
        x64 = x32.astype(np.float64)
        prog = fused.program_for(spec.input_type, spec.layers, tensors)
        assert prog is not None or seed < 12, "a wide spec left the compiled path"
        if prog is not None:
            got, y64 = prog.run_fp32(x32), prog.run(x64)
            assert got.dtype == np.float32 and got.flags.c_contiguous
            np.testing.assert_array_equal(_bits(got), _bits(y64.astype(np.float32)))
            rounded += int((got.astype(np.float64) != y64).sum())
            subnormal += int(((got != 0) & (np.abs(got) < np.finfo(np.float32).tiny)).sum())
            past = x32.copy()
            past[7, 0] = 3e38  # |x * 2**F| >= 2**62: the bit-level quantization
            assert prog.run_fp32(past) is None and prog.run(past.astype(np.float64)) is None
        run32 = bind_rows(spec, tensors, fp32=True)
        past = x32.copy()
        past[::5, 0] = np.float32(3e38)
        ro = x32.copy()
        ro.setflags(write=False)
        for rows in (x32[:1], x32[:64], x32, past, x64, np.asfortranarray(x32), ro, x32[::2], x32.astype(">f4"),
                     np.clip(x32, -6e4, 6e4).astype(np.float16)):  # (float16: the subnormal case's rows become 0)
            want = simmlp.simulate(spec.input_type, spec.layers, tensors, rows.astype(np.float64)).astype(np.float32)
            np.testing.assert_array_equal(_bits(run32(rows)), _bits(want))
    assert rounded > 1000 and subnormal > 100  # the FP32 rounding had work, subnormals included
    # Layouts and dtypes other than a writable C-ordered native float32 array were converted,
    # never compiled for: no request pays a JIT that warm_up did not.
    assert len(fused._run_rows.signatures) == compiled


def test_warm_up_compiles_both_signatures_and_says_when_it_did_nothing():
    fused.warm_up()
    sigs = {tuple(str(t) for t in s) for s in fused._run_rows.signatures}
    assert any(s[0].startswith("array(float64, 2d, C") and s[-1].startswith("array(float64, 2d, C") for s in sigs)
    assert any(s[0].startswith("array(float32, 2d, C") and s[-1].startswith("array(float32, 2d, C") for s in sigs)
    assert fused.warm_up() == 0.0


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A writable copy of ``a`` one byte off its dtype's alignment."""
    buf = bytearray(a.nbytes + 1)
    m = np.frombuffer(buf, dtype=a.dtype, offset=1, count=a.size).reshape(a.shape)
    m[...] = a
    assert not m.flags.aligned and m.flags.writeable
    return m


def test_warmed_programs_call_the_compiled_entry_points_for_every_layout(monkeypatch):
    # After warm_up a program calls its two compiled overloads directly, never numba's
    # dispatcher (which types all six arguments on every call): every float64 layout run() gets
    # (read-only, misaligned, Fortran-ordered, another dtype) becomes the one compiled type first,
    # and the answers are the reference's, bit for bit.
    fused.warm_up()
    assert set(fused._ENTRY) == {"d", "f"}
    spec, _ = random_spec(5)
    tensors = spec.tensors()
    prog = fused.program_for(spec.input_type, spec.layers, tensors)
    x = _inputs(np.random.default_rng(5), 64, spec.n_features, spec.input_type)
    want = _general(spec.input_type, spec.layers, tensors, x, monkeypatch)
    x32 = x.astype(np.float32)
    want32 = _general(spec.input_type, spec.layers, tensors, x32.astype(np.float64), monkeypatch).astype(np.float32)
    monkeypatch.setattr(fused, "_run_rows", lambda *a: pytest.fail("a warmed program went through the dispatcher"))
    ro = x.copy()
    ro.setflags(write=False)
    for rows in (x, ro, _misaligned(x), np.asfortranarray(x), x.astype(">f8")):
        np.testing.assert_array_equal(prog.run(rows).view(np.uint64), np.ascontiguousarray(want).view(np.uint64))
    for rows in (x32, _misaligned(x32), x32.astype(">f4")):
        got = prog.run_fp32(rows)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(_bits(got), _bits(want32))
    # The bound call: the compiled pass for the rows it takes, the caller's general path for the
    # rest (here run_fp32, itself proven above), the same bits either way.
    general: list[np.ndarray] = []
    score = prog.bind_fp32(lambda r: general.append(r) or prog.run_fp32(r))
    for rows, via_general in ((x32, False), (_misaligned(x32), True), (x32.astype(">f4"), True), (x, True), (x32[:0], True)):
        n = len(general)
        got = score(rows)
        assert got.dtype == np.float32 and len(general) == n + via_general
        np.testing.assert_array_equal(_bits(got), _bits(want32[: len(rows)]))


def test_a_program_refuses_rows_of_another_shape():
    # The kernel sizes its buffers from the program, not from x: rows of another width (or a
    # tensor of other rank) would be read and written past them, so they are refused first.
    spec, _ = random_spec(6)
    prog = fused.program_for(spec.input_type, spec.layers, spec.tensors())
    nf = spec.n_features
    for bad in (np.zeros((2, nf + 1)), np.zeros((2, nf - 1)), np.zeros(nf), np.zeros((1, 2, nf))):
        for run, rows in ((prog.run, bad), (prog.run_fp32, bad.astype(np.float32))):
            with pytest.raises(ValueError, match=rf"expected rows \[B, {nf}\]"):
                run(rows)


def test_a_program_is_built_only_from_int64_vectors():
    # Its three vectors go to the compiled entry points unchecked: another dtype, rank or layout is
    # refused when the program is made, not read as int64 (int32 for data32) by the kernel.
    spec, _ = random_spec(7)
    prog = fused.program_for(spec.input_type, spec.layers, spec.tensors())
    for name, bad, dt in (("prog", prog.prog.astype(np.int32), "int64"), ("data", prog.data.reshape(1, -1), "int64"),
                          ("data", prog.data[::-1], "int64"), ("prog", list(prog.prog), "int64"),
                          ("data32", prog.data32.astype(np.int64), "int32"), ("data32", np.zeros((2, 2), np.int32), "int32")):
        with pytest.raises(TypeError, match=f"Program.{name}: expected a C-contiguous 1-D {dt} array"):
            dataclasses.replace(prog, **{name: bad})

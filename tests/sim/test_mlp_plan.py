"""The MLP simulator's compiled small-batch plan against its general step-by-step path.

``simulate`` runs a plan compiled once per (layers, tensors): float64 steps with the scalings
folded into the weights, tables pre-cast, provably idle saturations dropped. Zero mismatches are
required against ``forward`` with every shortcut off (``_FAST_DENSE = False``), on random specs
with random rounding / overflow modes, adversarial rows, batch 1 and larger batches. (The general
path itself is proven against hls4ml's C-simulation in test_mlp_hls4ml.py.)
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import offload.sim.mlp as simmlp
from mlp_cases import OVERFLOW, ROUNDING, adversarial_inputs, random_spec
from offload.kernels.mlp import MlpSpec
from offload.sim.fixed import FixedType
from offload.sim.mlp import MlpLayer


def _general(spec, tensors, x, monkeypatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(simmlp.datapath, "_FAST_DENSE", False)
        return simmlp.simulate(spec.input_type, spec.layers, tensors, x)


def _planned(spec, tensors, x, monkeypatch) -> np.ndarray:
    """simulate() with the fused program out of the way (as where numba is missing or the model
    leaves its bounds) and forward() made to fail: the call must take the plan."""
    def no_forward(*a, **k):
        raise AssertionError("simulate() took the general path")

    with monkeypatch.context() as m:
        m.setattr(simmlp.fused, "program_for", lambda *a: None)
        m.setattr(simmlp, "forward", no_forward)
        return simmlp.simulate(spec.input_type, spec.layers, tensors, x)


def _plan_inputs(rng, rows: int, spec) -> np.ndarray:
    """Adversarial rows (ties, type edges, far outside), with the +-1e300 ones brought down to
    +-1e6 so the batch stays on the plan (larger values take the bit-level quantization)."""
    x = adversarial_inputs(rng, rows, spec.n_features, spec.input_type)
    huge = np.abs(x) > 1e200
    x[huge] = np.sign(x[huge]) * 1e6
    return x


@pytest.mark.parametrize("narrow", [True, False])
def test_plan_equals_general_path_on_random_specs(narrow, monkeypatch):
    kinds = collections.Counter()
    for seed in range(40):
        spec, _ = random_spec(seed, narrow=narrow)
        tensors = spec.tensors()
        rng = np.random.default_rng(seed)
        x = _plan_inputs(rng, 800, spec)
        plan = simmlp.plan.plan_for(spec.input_type, spec.layers, tensors)
        assert plan is not None, spec.layers
        kinds.update(getattr(s, "__name__", "") for s in plan.steps)
        y = plan.run(x)
        assert y is not None  # the batch really took the plan
        want = _general(spec, tensors, x, monkeypatch)
        bad = np.argwhere(y != want)
        assert len(bad) == 0, f"seed {seed}: {len(bad)} mismatches, first {bad[:3].tolist()}"
        # Batch 1, row by row, through the public entry point (the plan is cached by then).
        for i in range(0, 800, 37):
            assert np.array_equal(_planned(spec, tensors, x[i : i + 1], monkeypatch), want[i : i + 1]), (seed, i)
    # The cases reach the plan's float GEMM, table, and (narrow) per-product wrap and int64 steps.
    assert kinds["gemm"] and kinds["lookup"]
    if narrow:
        assert kinds["wrapsum"] and kinds["step"]


def test_plan_falls_back_for_inputs_it_cannot_take(monkeypatch):
    spec, _ = random_spec(3, narrow=False)
    tensors = spec.tensors()
    rng = np.random.default_rng(3)
    x = adversarial_inputs(rng, 400, spec.n_features, spec.input_type)  # holds +-1e300
    plan = simmlp.plan.plan_for(spec.input_type, spec.layers, tensors)
    assert plan.run(x) is None
    assert np.array_equal(simmlp.simulate(spec.input_type, spec.layers, tensors, x), _general(spec, tensors, x, monkeypatch))
    x[5, 0] = np.inf
    assert plan.run(x) is None
    assert np.array_equal(simmlp.simulate(spec.input_type, spec.layers, tensors, x), _general(spec, tensors, x, monkeypatch))
    x[7, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        simmlp.simulate(spec.input_type, spec.layers, tensors, x)


def test_plan_follows_changed_weights(monkeypatch):
    for seed in range(5, 50):  # a spec whose output is not constant, so changed weights show
        spec, _ = random_spec(seed, narrow=False)
        tensors = spec.tensors()  # writable arrays: compared with the plan's snapshot every call
        rng = np.random.default_rng(seed)
        x = _plan_inputs(rng, simmlp.plan.PLAN_MAX_ROWS, spec)
        before = _planned(spec, tensors, x, monkeypatch)
        if np.unique(before).size > 20:
            break
    name = [k for k in tensors if k.endswith(".weight")][-1]
    wt = FixedType.parse(spec.tensor_types()[name])
    tensors[name][...] = rng.integers(wt.min_raw, wt.max_raw, size=tensors[name].shape, endpoint=True)  # in place
    after = _planned(spec, tensors, x, monkeypatch)
    assert not np.array_equal(before, after)
    assert np.array_equal(after, _general(spec, tensors, x, monkeypatch))
    tensors[name] = np.full_like(tensors[name], wt.min_raw)  # a new array under the same name
    assert np.array_equal(_planned(spec, tensors, x, monkeypatch), _general(spec, tensors, x, monkeypatch))
    # Read-only arrays that own their memory (the sim device's resident copies) are kept by identity.
    frozen = {k: np.array(v, copy=True) for k, v in spec.tensors().items()}
    for v in frozen.values():
        v.setflags(write=False)
    assert np.array_equal(_planned(spec, frozen, x, monkeypatch), before)
    assert simmlp.plan.plan_for(spec.input_type, spec.layers, frozen).arrays[0][2] is None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("seed", [11, 12])  # batchnorm, leaky_relu, int64 dense steps; per-product wrap
def test_plan_matches_hls4ml_directly(seed, tmp_path):
    """The plan against hls4ml's compiled C-simulation itself, on rows that stay on the plan."""
    from offload.hls.mlp import build_model

    spec, floats = random_spec(seed)
    tensors = spec.tensors()
    rng = np.random.default_rng(seed)
    x = _plan_inputs(rng, 20_000, spec)
    plan = simmlp.plan.plan_for(spec.input_type, spec.layers, tensors)
    y = plan.run(x)
    assert y is not None
    model = build_model(spec, tmp_path, float_weights=floats)
    model.compile()
    want = np.asarray(model.predict(np.ascontiguousarray(x))).reshape(len(x), -1)
    assert np.array_equal(y, want), f"{int((y != want).sum())} mismatches"
    for i in range(0, 20_000, 997):  # batch 1
        assert np.array_equal(simmlp.simulate(spec.input_type, spec.layers, tensors, x[i : i + 1]), want[i : i + 1])


def _edge_type(rng, wmax: int) -> str:
    """Types at the plan's limits: widths up to ``wmax``, I beyond W or negative, N saturation bits,
    every rounding and overflow mode."""
    w = int(rng.integers(2, wmax + 1))
    i = int(rng.integers(-6, w + 7))
    q, o = str(rng.choice(ROUNDING)), str(rng.choice(OVERFLOW))
    n = int(rng.integers(1, w + 1)) if o == "AP_WRAP" and rng.random() < 0.3 else 0
    return str(FixedType(w, i, bool(rng.random() < 0.8), q, o, n))


def test_plan_equals_general_path_at_type_edges(monkeypatch):
    """Wide accumulators and results (the plan's float limits), I > W and I < 0, AP_WRAP with N,
    tables of any size over inputs with F <= 0: each case either runs exactly or falls back."""
    rng = np.random.default_rng(99)
    done = 0
    kinds = collections.Counter()
    for trial in range(400):
        nf, hid = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        layers = [
            MlpLayer("fc0", "dense", nf, hid, _edge_type(rng, 54), weight=_edge_type(rng, 20),
                     bias=_edge_type(rng, 20), accum=_edge_type(rng, 62)),
            MlpLayer("act1", str(rng.choice(["relu", "leaky_relu", "sigmoid", "tanh"])), hid, hid, _edge_type(rng, 30),
                     param=_edge_type(rng, 12), alpha=float(rng.choice([0.01, 0.3, -0.5])),
                     table=_edge_type(rng, 18), table_size=int(rng.integers(2, 3000))),
            MlpLayer("fc2", "dense", hid, 1, _edge_type(rng, 40), weight=_edge_type(rng, 16), accum=_edge_type(rng, 50), use_bias=False),
        ]
        consts = {}
        for layer in layers:
            for role, shape in (("weight", (layer.n_in, layer.n_out)), ("bias", (layer.n_out,))):
                if layer.op == "dense" and (role == "weight" or layer.use_bias):
                    t = FixedType.parse(getattr(layer, role))
                    consts[f"{layer.name}.{role}"] = rng.integers(t.min_raw, t.max_raw, size=shape, endpoint=True)
        try:
            spec = MlpSpec(nf, _edge_type(rng, 40), tuple(layers), consts)
        except ValueError:
            continue  # a product or table index wider than the spec allows
        tensors = spec.tensors()
        x = _plan_inputs(rng, 64, spec)
        plan = simmlp.plan.plan_for(spec.input_type, spec.layers, tensors)
        y = None if plan is None else plan.run(x)
        if y is None:
            continue
        done += 1
        kinds.update(getattr(s, "__name__", "") for s in plan.steps)
        assert np.array_equal(y, _general(spec, tensors, x, monkeypatch)), (trial, spec.input_type, spec.layers)
    assert done >= 100 and all(kinds[k] for k in ("gemm", "wrapsum", "lookup", "leaky", "step"))

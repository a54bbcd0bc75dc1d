"""Shared cases for the MLP tests: random specs with adversarial types, adversarial inputs."""

from __future__ import annotations

import numpy as np

from offload.kernels.mlp import MlpSpec
from offload.sim.fixed import FixedType
from offload.sim.mlp import MlpLayer, quantize_like_hls4ml

ROUNDING = ("AP_TRN", "AP_TRN_ZERO", "AP_RND", "AP_RND_ZERO", "AP_RND_MIN_INF", "AP_RND_INF", "AP_RND_CONV")
OVERFLOW = ("AP_WRAP", "AP_SAT", "AP_SAT_ZERO", "AP_SAT_SYM")


def rand_type(rng, wmin=4, wmax=14, imin=-1, imax=6, signed=True) -> str:
    w = int(rng.integers(wmin, wmax + 1))
    i = int(rng.integers(imin, imax + 1))
    return str(FixedType(w, i, signed, str(rng.choice(ROUNDING)), str(rng.choice(OVERFLOW))))


def random_spec(seed: int, n_features: int | None = None, *, narrow: bool = True) -> tuple[MlpSpec, dict]:
    """A random MLP with random (often saturating / wrapping / rounding) types.

    Returns the spec and the float weights it was quantized from (layout [n_in, n_out]).
    ``narrow=False`` gives accumulators wide enough that the simulator's fast path applies.
    """
    rng = np.random.default_rng(seed)
    nf = n_features or int(rng.integers(2, 12))
    layers, floats, consts = [], {}, {}
    width = nf
    if rng.random() < 0.5:
        name = "bn0"
        layers.append(MlpLayer(name, "batchnorm", width, width, rand_type(rng), scale=rand_type(rng), bias=rand_type(rng)))
        floats[f"{name}.scale"] = rng.normal(size=width) * 2
        floats[f"{name}.bias"] = rng.normal(size=width)
    n_dense = int(rng.integers(2, 4))
    for k in range(n_dense):
        out = 1 if k == n_dense - 1 else int(rng.integers(2, 10))
        name = f"fc{len(layers)}"
        use_bias = bool(rng.random() < 0.8)
        wt = rand_type(rng, 4, 10, -1, 3)
        if narrow:
            accum = rand_type(rng, 6, 18, 2, 8)
        else:
            accum = "ap_fixed<48,20>"
        layers.append(MlpLayer(name, "dense", width, out, rand_type(rng), weight=wt,
                               bias=rand_type(rng, 4, 10, -1, 4) if use_bias else None, accum=accum, use_bias=use_bias))
        # Weights large enough that pre-activations leave the sigmoid/tanh table ranges.
        floats[f"{name}.weight"] = rng.normal(size=(width, out)) * 1.5
        if use_bias:
            floats[f"{name}.bias"] = rng.normal(size=out)
        width = out
        op = str(rng.choice(["relu", "leaky_relu", "sigmoid", "tanh"]))
        aname = f"{op.replace('_', '')}{len(layers)}"
        if op == "relu":
            layers.append(MlpLayer(aname, op, width, width, rand_type(rng, signed=bool(rng.random() < 0.5))))
        elif op == "leaky_relu":
            layers.append(MlpLayer(aname, op, width, width, rand_type(rng), param=rand_type(rng, 6, 12, -2, 2),
                                   alpha=float(rng.choice([0.01, 0.1, 0.2, 0.3]))))
        else:
            layers.append(MlpLayer(aname, op, width, width, rand_type(rng, 4, 12, -1, 2, signed=bool(rng.random() < 0.7)),
                                   table=rand_type(rng, 8, 18, 1, 4), table_size=int(rng.choice([128, 512, 1024, 2048]))))
    types = {}
    for layer in layers:
        for role in ("weight", "bias", "scale"):
            if getattr(layer, role) is not None:
                types[f"{layer.name}.{role}"] = getattr(layer, role)
    for k, v in floats.items():
        consts[k] = quantize_like_hls4ml(v, types[k])
    it = rand_type(rng, 6, 14, 2, 6)
    return MlpSpec(nf, it, tuple(layers), consts), floats


def adversarial_inputs(rng, rows: int, nf: int, input_type: str) -> np.ndarray:
    """Gaussian rows, rows far outside any calibration range, exact rounding ties of the input type,
    values at and just beyond the type's limits, and huge magnitudes."""
    t = FixedType.parse(input_type)
    x = rng.normal(size=(rows, nf)) * 3
    q = rows // 8
    x[:q] *= 1e3  # far outside
    lsb = t.lsb
    ties = (rng.integers(-(1 << (t.width - 1)), 1 << (t.width - 1), size=(q, nf)) + 0.5) * lsb
    x[q : 2 * q] = ties
    edges = np.array([t.max_float, t.min_float, t.max_float + lsb / 2, t.min_float - lsb / 2, t.max_float + lsb,
                      t.min_float - lsb, 0.0, -0.0, 1e300, -1e300, lsb / 4, -lsb / 4])
    x[2 * q : 3 * q] = rng.choice(edges, size=(q, nf))
    return x

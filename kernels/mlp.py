"""Kernel kind ``mlp``: a small scoring MLP in hls4ml's io_parallel datapath.

The spec lists the layers with their ap_types types (:class:`offload.sim.mlp.MlpLayer`); the
resident tensors are the raw fixed-point weights (``"<layer>.weight"`` [n_in, n_out] in hls4ml's
order, ``"<layer>.bias"``, ``"<layer>.scale"``), int64. Inputs are ``{"x": float64 [B, F]}``,
outputs ``{"y": float64 [B, n_out]}``; the reference is :func:`offload.sim.mlp.simulate` (step by
step). The fast entries (:func:`run_rows`, :func:`run_checked`, :func:`bind_rows`) run the
simulator's fused program where numba is present and the model fits its int64 bounds, else the
reference: this module is the one place that chooses. Everything here is JSON and NumPy: a saved
bundle is served without torch.

Example::

    from offload.kernels import get_kind
    kind = get_kind("mlp")
    kind.validate(spec, tensors, {"x": x})
    y = kind.reference(spec, tensors, {"x": x})["y"]
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np

from offload.kernels.registry import KernelKind, register_kind
from offload.sim.errors import FormatError, InputError, InputKeyError, InputTypeError
from offload.sim.fixed import FixedType, mul_type
from offload.sim import mlp as _sim
from offload.sim.mlp import OPS, MlpLayer
from offload.sim.mlp.strategy import DA, LATENCY, STRATEGIES, check_da_constant, exact_accum

__all__ = ["MlpSpec", "MlpLayer", "validate", "reference", "run_rows", "run_checked", "bind_rows", "check_tensors", "KIND", "MAX_FEATURES", "MAX_BATCH"]

MAX_FEATURES = 4096
MAX_BATCH = 1 << 22
_ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh")


@dataclass(frozen=True)
class MlpSpec:
    """A scoring MLP: input type, layers (in order), raw weights, reuse factor.

    ``n_features`` is the input width; the output width is the last layer's ``n_out``.
    ``constants`` holds the raw weights (name -> flattened ints): hls4ml bakes weights into the
    firmware as constants, so the generated C++ depends on them and the spec must carry them.
    The kernel's resident tensors are the same arrays (:meth:`tensors`), used by the sim device.
    ``input_type`` (and every layer type) is a :class:`FixedType`; text is parsed once, here.

    ``strategy`` is hls4ml's Dense strategy, ``"latency"`` or ``"distributed_arithmetic"``
    (:mod:`offload.sim.mlp.strategy`). Under DA accumulation is exact: a dense layer's ``accum``
    may be omitted (None) and is then set to the exact type; any other value is refused, as are
    reuse factors above 1 and weight/bias types da4ml cannot read exactly.
    """

    n_features: int
    input_type: FixedType
    layers: tuple[MlpLayer, ...]
    constants: tuple[tuple[str, tuple[int, ...]], ...] = ()
    reuse_factor: int = 1
    kind: str = field(default="mlp")
    strategy: str = LATENCY

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "input_type", FixedType.parse(self.input_type))
        except (TypeError, ValueError) as e:
            raise FormatError(f"input_type {self.input_type!r}: {e}") from None
        object.__setattr__(self, "layers", tuple(self.layers))
        consts = self.constants.items() if isinstance(self.constants, Mapping) else self.constants
        object.__setattr__(
            self, "constants", tuple(sorted((str(k), tuple(int(v) for v in np.asarray(a).ravel())) for k, a in consts))
        )
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {self.strategy!r}")
        if self.strategy == DA:
            object.__setattr__(self, "layers", _da_layers(self))
        _check_spec(self)

    def tensors(self) -> dict[str, np.ndarray]:
        """The raw weights as int64 arrays of their shapes (the kernel's resident tensors)."""
        shapes = self.tensor_shapes()
        return {k: np.asarray(v, dtype=np.int64).reshape(shapes[k]) for k, v in self.constants}

    @property
    def n_outputs(self) -> int:
        return self.layers[-1].n_out if self.layers else self.n_features

    @property
    def output_type(self) -> FixedType:
        return self.layers[-1].result if self.layers else self.input_type

    def to_json(self) -> dict:
        d = {
            "kind": self.kind,
            "n_features": self.n_features,
            "input_type": str(self.input_type),
            "reuse_factor": self.reuse_factor,
            "layers": [layer.to_json() for layer in self.layers],
            "constants": {k: list(v) for k, v in self.constants},
        }
        # Only written when not the default: latency specs keep the JSON (and so the digest, the
        # generated names and the golden vectors) they had before strategies existed.
        if self.strategy != LATENCY:
            d["strategy"] = self.strategy
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "MlpSpec":
        if d.get("kind", "mlp") != "mlp":
            raise ValueError(f"spec kind {d.get('kind')!r} is not 'mlp'")
        return cls(
            n_features=int(d["n_features"]),
            input_type=str(d["input_type"]),
            layers=tuple(MlpLayer.from_json(x) for x in d["layers"]),
            constants=tuple((k, tuple(v)) for k, v in dict(d.get("constants", {})).items()),
            reuse_factor=int(d.get("reuse_factor", 1)),
            strategy=str(d.get("strategy", LATENCY)),  # bundles from before strategies are latency
        )

    def digest(self) -> str:
        """Short content hash of the spec (names generated sources and caches)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every resident tensor this spec needs."""
        out: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            if layer.op == "dense":
                out[f"{layer.name}.weight"] = (layer.n_in, layer.n_out)
                if layer.use_bias:
                    out[f"{layer.name}.bias"] = (layer.n_out,)
            elif layer.op == "batchnorm":
                out[f"{layer.name}.scale"] = (layer.n_in,)
                out[f"{layer.name}.bias"] = (layer.n_in,)
        return out

    def tensor_types(self) -> dict[str, FixedType]:
        """Name -> ap_types type of every resident tensor."""
        out = {}
        for layer in self.layers:
            if layer.op == "dense":
                out[f"{layer.name}.weight"] = layer.weight
                if layer.use_bias:
                    out[f"{layer.name}.bias"] = layer.bias
            elif layer.op == "batchnorm":
                out[f"{layer.name}.scale"] = layer.scale
                out[f"{layer.name}.bias"] = layer.bias
        return out


# The JSON Schema of MlpSpec.to_json() (KernelKind.spec_schema). Widths and counts are C++ ``int``
# in hls4ml's generated code; constants are the raw int64 weights; layer names become C++ names.
_INT_MAX = (1 << 31) - 1
_TYPE_TEXT = {"type": "string", "maxLength": 128, "pattern": r"^ap_u?(fixed|int)<[0-9A-Z_, +-]+>\Z"}
_WIDTH = {"type": "integer", "minimum": 1, "maximum": _INT_MAX}
SPEC_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["n_features", "input_type", "layers"],
    "properties": {
        "kind": {"const": "mlp"},
        "n_features": {"type": "integer", "minimum": 1, "maximum": MAX_FEATURES},
        "input_type": _TYPE_TEXT,
        "reuse_factor": _WIDTH,
        "strategy": {"enum": list(STRATEGIES)},
        "layers": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1024,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "op", "n_in", "n_out", "result"],
                "properties": {
                    "name": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z"},
                    "op": {"enum": list(OPS)},
                    "n_in": _WIDTH,
                    "n_out": _WIDTH,
                    **{role: _TYPE_TEXT for role in ("result", "weight", "bias", "accum", "scale", "param", "table")},
                    "alpha": {"type": "number"},
                    "table_size": {"type": "integer", "minimum": 2, "maximum": 1 << 16},
                    "use_bias": {"type": "boolean"},
                },
            },
        },
        "constants": {
            "type": "object",
            "maxProperties": 2048,
            "propertyNames": {"type": "string", "maxLength": 256},
            "additionalProperties": {"type": "array", "int64Items": True},
        },
    },
}


def _type(layer: MlpLayer, role: str) -> FixedType:
    t = getattr(layer, role)
    if t is None:
        raise ValueError(f"layer {layer.name!r} ({layer.op}): missing {role} type")
    if t.width > 62:
        raise ValueError(f"layer {layer.name!r}: {role} type {t} is wider than 62 bits (raw int64 arithmetic)")
    return t


def _da_layers(spec: MlpSpec) -> tuple[MlpLayer, ...]:
    """The layers with every dense ``accum`` set to the exact type (DA accumulates exactly)."""
    if spec.reuse_factor != 1:
        raise ValueError(f"reuse_factor must be 1 under strategy {DA!r} (hls4ml refuses rf > 1), got {spec.reuse_factor}")
    raw = dict(spec.constants)
    out, prev = [], spec.input_type
    for layer in spec.layers:
        if layer.op == "dense" and all(getattr(layer, r) is not None for r in ("weight", "result")):
            check_da_constant(_type(layer, "weight"), f"layer {layer.name!r}: weight")
            if layer.use_bias and layer.bias is not None:
                check_da_constant(_type(layer, "bias"), f"layer {layer.name!r}: bias")
            w = raw.get(f"{layer.name}.weight")
            b = raw.get(f"{layer.name}.bias") if layer.use_bias else None
            if w is not None and len(w) == layer.n_in * layer.n_out and (b is not None or not layer.use_bias):
                try:
                    acc = exact_accum(prev, layer.weight, layer.bias if layer.use_bias else None,
                                      np.asarray(w, dtype=np.int64).reshape(layer.n_in, layer.n_out), b)
                except ValueError as e:
                    raise ValueError(f"layer {layer.name!r}: {e}") from None
                if layer.accum is not None and layer.accum != acc:
                    raise ValueError(
                        f"layer {layer.name!r}: accum {layer.accum} under strategy {DA!r}: hls4ml/da4ml accumulate "
                        f"exactly and ignore accum_t; omit it (it becomes {acc})"
                    )
                layer = replace(layer, accum=acc)
        out.append(layer)
        prev = layer.result or prev
    return tuple(out)


def _check_spec(spec: MlpSpec) -> None:
    if not isinstance(spec.n_features, int) or not 1 <= spec.n_features <= MAX_FEATURES:
        raise ValueError(f"n_features must be 1..{MAX_FEATURES}, got {spec.n_features!r}")
    if not isinstance(spec.reuse_factor, int) or spec.reuse_factor < 1:
        raise ValueError(f"reuse_factor must be an int >= 1, got {spec.reuse_factor!r}")
    if not spec.layers:
        raise ValueError("an MLP needs at least one layer")
    prev = spec.input_type
    width = spec.n_features
    names = set()
    for layer in spec.layers:
        if layer.name in names or not layer.name.isidentifier():
            raise ValueError(f"layer name {layer.name!r} must be a unique identifier")
        names.add(layer.name)
        if layer.op not in OPS:
            raise ValueError(f"layer {layer.name!r}: op {layer.op!r} unsupported; supported: {', '.join(OPS)}")
        if layer.n_in != width:
            raise ValueError(f"layer {layer.name!r}: n_in={layer.n_in} but the previous layer gives {width}")
        if layer.op != "dense" and layer.n_out != layer.n_in:
            raise ValueError(f"layer {layer.name!r} ({layer.op}): n_out must equal n_in")
        if layer.n_out < 1:
            raise ValueError(f"layer {layer.name!r}: n_out must be >= 1")
        res = _type(layer, "result")
        if layer.op == "dense":
            wt = _type(layer, "weight")
            _type(layer, "accum")
            if layer.use_bias:
                _type(layer, "bias")
            if mul_type(prev, wt).width > 62:
                raise ValueError(f"layer {layer.name!r}: input {prev} x weight {wt} is wider than 62 bits")
        elif layer.op == "batchnorm":
            st = _type(layer, "scale")
            _type(layer, "bias")
            if mul_type(prev, st).width > 61:
                raise ValueError(f"layer {layer.name!r}: input {prev} x scale {st} is wider than 61 bits")
        elif layer.op == "leaky_relu":
            pt = _type(layer, "param")
            if layer.alpha is None or not np.isfinite(layer.alpha):
                raise ValueError(f"layer {layer.name!r}: leaky_relu needs a finite alpha")
            if mul_type(prev, pt).width > 62:
                raise ValueError(f"layer {layer.name!r}: input {prev} x param {pt} is wider than 62 bits")
        elif layer.op in ("sigmoid", "tanh"):
            _type(layer, "table")
            n = layer.table_size
            if not isinstance(n, int) or not 2 <= n <= (1 << 16):
                raise ValueError(f"layer {layer.name!r}: table_size must be an int in 2..65536, got {n!r}")
            if prev.width + n.bit_length() > 62:
                raise ValueError(f"layer {layer.name!r}: input type {prev} too wide for the table index")
        prev = res
        width = layer.n_out
    shapes = spec.tensor_shapes()
    types = spec.tensor_types()
    got = dict(spec.constants)
    if set(got) != set(shapes):
        raise ValueError(f"constants must be exactly {sorted(shapes)}, got {sorted(got)}")
    for name, shape in shapes.items():
        if len(got[name]) != int(np.prod(shape)):
            raise ValueError(f"constant {name!r} must hold {int(np.prod(shape))} values for shape {list(shape)}, got {len(got[name])}")
        types[name].check_raw(np.asarray(got[name], dtype=np.int64), name)


# -- the kind ------------------------------------------------------------------------------------
_SHAPES: dict[int, tuple[MlpSpec, dict[str, tuple[int, ...]]]] = {}


def _tensor_shapes(spec: MlpSpec) -> dict[str, tuple[int, ...]]:
    """``spec.tensor_shapes()``, kept per spec object: validate() runs on every request."""
    hit = _SHAPES.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    shapes = spec.tensor_shapes()
    if len(_SHAPES) >= 64:
        _SHAPES.pop(next(iter(_SHAPES)), None)
    _SHAPES[id(spec)] = (spec, shapes)
    return shapes


def validate(spec: MlpSpec, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> None:
    """Check ``inputs["x"]`` (float [B, n_features], finite) and the resident tensors.

    Raises the hierarchy's types (each also the builtin it once was): :class:`InputKeyError` for a
    missing input or resident tensor, :class:`InputTypeError` for a wrong dtype, :class:`InputError`
    for a wrong shape or a NaN / infinite feature (naming the first such row and column).
    """
    validate_inputs(spec, inputs)
    for name, shape in _tensor_shapes(spec).items():
        if name not in tensors:
            raise InputKeyError(f"mlp resident tensor {name!r} missing")
        a = np.asarray(tensors[name])
        if tuple(a.shape) != shape:
            raise InputError(f"mlp resident tensor {name!r} must have shape {list(shape)}, got {list(a.shape)}")
        if a.dtype.kind not in "iu":
            raise InputTypeError(f"mlp resident tensor {name!r} must hold raw integers, got dtype {a.dtype}")


def validate_inputs(spec: MlpSpec, inputs: Mapping[str, np.ndarray]) -> None:
    """The input half of :func:`validate`, same errors: for a caller whose resident tensors were
    checked once already (the scoring service checks every request, before queueing)."""
    if "x" not in inputs:
        raise InputKeyError(f"mlp input 'x' missing; got {sorted(inputs)}")
    x = inputs["x"]
    if type(x) is not np.ndarray:  # np.asarray is a NumPy call even for an array (a cold one per request)
        x = np.asarray(x)
    if x.dtype.kind != "f":
        raise InputTypeError(f"mlp input 'x' must be floating point (float32/float64), got dtype {x.dtype}")
    if x.ndim != 2 or x.shape[1] != spec.n_features:
        raise InputError(f"mlp input 'x' must have shape [batch, {spec.n_features}], got {list(x.shape)}")
    if x.shape[0] > MAX_BATCH:
        raise InputError(f"mlp input 'x': batch {x.shape[0]} exceeds the limit {MAX_BATCH}")
    # One reduction decides for the whole batch: the sum of squares is finite when every feature
    # is (NaN and infinities propagate); only a non-finite sum (or a huge finite feature that
    # overflows it) pays for the element-wise search. math.isfinite: np.isfinite on the scalar
    # costs more than the reduction itself.
    if not math.isfinite(np.vdot(x, x)):
        bad = ~np.isfinite(x)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise InputError(f"mlp input 'x' row {int(r)} column {int(c)} is {x[r, c]!r}: features must be finite")


def check_tensors(spec: MlpSpec, tensors: Mapping[str, np.ndarray]) -> None:
    """Refuse resident tensors that differ from the spec's constants (checked once, at load).

    hls4ml compiles the weights into the firmware from ``spec.constants`` while the reference reads
    ``tensors``: if the two differed, sim and the C++ devices would silently disagree.
    """
    want = spec.tensors()
    if set(tensors) != set(want):
        raise ValueError(f"mlp resident tensors must be exactly {sorted(want)}, got {sorted(tensors)}")
    for name, w in want.items():
        a = np.asarray(tensors[name])
        if a.dtype.kind not in "iu":
            raise InputTypeError(f"mlp resident tensor {name!r} must hold raw integers, got dtype {a.dtype}")
        if a.shape != w.shape or not np.array_equal(a, w):
            raise ValueError(f"mlp resident tensor {name!r} differs from the spec's constants (the weights compiled into the kernel)")


def reference(spec: MlpSpec, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{"y": float64 [B, n_out]}``: the exact fixed-point outputs, step by step
    (:func:`offload.sim.mlp.simulate`; validated inputs assumed)."""
    x = np.asarray(inputs["x"], dtype=np.float64)
    return {"y": _sim.simulate(spec.input_type, spec.layers, tensors, x)}


# The fused path (offload.sim.mlp.fused) imports numba: loaded at a device's first load or the first
# fast call, not by every `import offload.kernels`.
_FUSED: list = []


def _fused():
    """The fused module, imported once."""
    if not _FUSED:
        from offload.sim.mlp import fused

        _FUSED.append(fused)
    return _FUSED[0]


def run_rows(input_type: FixedType, layers: tuple[MlpLayer, ...], tensors: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Float64 outputs [B, n_out] of float rows ``x``, bit for bit :func:`offload.sim.mlp.simulate`'s:
    the fused program (built once per ``layers`` tuple and ``tensors`` mapping, rebuilt if either
    changes) where numba is present and the model fits its int64 bounds, else the reference. Rows
    whose values the program's float quantization cannot take (``|x * 2**F| >= 2**62``, inf, NaN)
    take the reference too.

    Example::

        y = run_rows(spec.input_type, spec.layers, tensors, x)
    """
    xf = np.asarray(x, dtype=np.float64)
    if xf.ndim == 2 and xf.shape[0] and layers and xf.shape[1] == layers[0].n_in:
        prog = _fused().program_for(input_type, layers, tensors)
        if prog is not None:
            y = prog.run(xf)
            if y is not None:
                return y
    return _sim.simulate(input_type, layers, tensors, xf)


def run_checked(spec: MlpSpec, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`validate` then :func:`reference`'s outputs, through :func:`run_rows`."""
    validate(spec, tensors, inputs)
    return {"y": run_rows(spec.input_type, spec.layers, tensors, inputs["x"])}


def bind_rows(spec: MlpSpec, tensors: Mapping[str, np.ndarray], *, fp32: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """:func:`reference`'s ``y`` for these (from now on constant) tensors as one prepared call
    on the rows ``x`` (an ndarray), :func:`run_rows` with the program looked up once; ``fp32``: rows
    of FP32 values in, ``y`` as float32, rounded inside the compiled kernel where it runs (see the
    registry's ``bind_rows``)."""
    input_type, layers = spec.input_type, spec.layers
    prog = _fused().program_for(input_type, layers, tensors)
    if fp32:
        def general_fp32(x: np.ndarray) -> np.ndarray:
            return run_rows(input_type, layers, tensors, x).astype(np.float32)

        # The compiled pass with no frame of ours above it (Program.bind_fp32).
        return general_fp32 if prog is None else prog.bind_fp32(general_fp32)
    n_in = layers[0].n_in

    def rows(x: np.ndarray) -> np.ndarray:
        if prog is not None and x.ndim == 2 and x.shape[0] > 0 and x.shape[1] == n_in:
            y = prog.run(x)
            if y is not None:
                return y
        return _sim.simulate(input_type, layers, tensors, np.asarray(x, dtype=np.float64))

    return rows


def golden_inputs(spec: MlpSpec, rng: np.random.Generator, case: int) -> dict[str, np.ndarray]:
    """Golden case ``case``: rows beyond the input type's range, extremes and rounding ties."""
    t = spec.input_type
    lo, hi, lsb = t.min_float, t.max_float, t.lsb
    B = 4 + 2 * case
    # Beyond the input type's range by a quarter on each side: quantization's overflow mode is exercised.
    x = rng.uniform(lo - 0.25 * (hi - lo), hi + 0.25 * (hi - lo), size=(B, spec.n_features))
    if case == 0:  # extremes, out-of-range values and exact rounding ties (k + 1/2 LSB)
        edge = np.array([lo, hi, hi + lsb, lo - lsb, 2 * hi - lo, 0.5 * lsb, -0.5 * lsb, 1.5 * lsb, -2.5 * lsb, 0.0])
        flat = x.reshape(-1)
        flat[: min(edge.size, flat.size)] = edge[: flat.size]
    elif case % 2 == 0:  # ties everywhere
        x = (np.floor(x / lsb) + 0.5) * lsb
    return {"x": x}


def prepare(spec: MlpSpec, tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """The resident arrays unchanged, with the simulator's fused program built for them and its
    kernel compiled (or loaded from numba's disk cache), so no request pays the JIT."""
    fused = _fused()
    out = dict(tensors)
    jit = fused.warm_up()
    fused.program_for(spec.input_type, spec.layers, out)  # the device passes this same mapping
    return out, jit


KIND = register_kind(KernelKind("mlp", MlpSpec.from_json, validate, reference, check_tensors, golden_inputs=golden_inputs,
                                tensor_shapes=MlpSpec.tensor_shapes, prepare=prepare, run_checked=run_checked, bind_rows=bind_rows,
                                spec_schema=SPEC_SCHEMA))

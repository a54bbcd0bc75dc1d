"""Calibrated post-training quantization of scoring MLPs into hls4ml fixed-point types.

``choose_precision`` takes the float layers and a calibration set and returns the ap_types of
every layer:

- integer bits from the calibration ranges (one bit of headroom on activations; weights, biases
  and BatchNorm scales from their own maxima) and, for accumulators, from the worst case over the
  input type's whole range, so accumulators never overflow (and never round: their fraction bits
  are the product's);
- fraction bits by a greedy search that lowers each layer's bits as far as the constraints allow,
  largest cost first: every layer's output keeps a cosine similarity to the float model of at
  least ``cos_threshold`` on the calibration set AND the end-to-end metric stays within
  ``budget`` (max absolute score error; AUC drop when labels are given). Candidates are scored
  with the bit-exact simulator (:mod:`offload.sim.mlp`), never by compiling hls4ml.
- the cost minimised is total bits: weight x input bits of every multiplier plus the widths of
  every stored value, a proxy for DSPs/LUTs and latency.

Example::

    input_type, types, report = choose_precision(layers, X_calib)
    print(report)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from offload.kernels.mlp import MlpSpec
from offload.quant.drift import check_drift
from offload.quant.metrics import auc
from offload.quant.report import LayerRow, QuantReport
from offload.sim.errors import FormatError, InputError, InputKeyError, InputTypeError
from offload.sim.fixed import FixedType
from offload.sim.mlp import MlpLayer, forward, quantize_like_hls4ml
from offload.sim.mlp.strategy import DA, LATENCY, with_exact_accum

__all__ = [
    "DEFAULT_TABLE",
    "DEFAULT_TYPE",
    "FloatLayer",
    "QuantReport",
    "QuantizationBudgetWarning",
    "build_layers",
    "choose_precision",
    "fixed_precision",
    "float_forward",
    "quant_report",
]

DEFAULT_TYPE = "ap_fixed<16,6>"
DEFAULT_TABLE = "ap_fixed<18,8>"  # hls4ml's default table_t
_ROLES = {
    "dense": ("weight", "bias", "accum", "result"),
    "batchnorm": ("scale", "bias", "result"),
    "relu": ("result",),
    "leaky_relu": ("param", "result"),
    "sigmoid": ("table", "result"),
    "tanh": ("table", "result"),
}
_MAX_CALIB_ROWS = 4096
_F_MAX = 18
_MAX_TABLE = 16384
_F_MIN = 0


class QuantizationBudgetWarning(UserWarning):
    """Even the widest candidate types miss the cosine threshold or the end-to-end budget."""


@dataclass
class FloatLayer:
    """One inference layer of the float model: op, sizes, float32 parameters (layout [n_in, n_out])."""

    name: str
    op: str
    n_in: int
    n_out: int
    params: dict[str, np.ndarray] = field(default_factory=dict)
    alpha: float | None = None
    source: str = ""


# -- float reference -----------------------------------------------------------------------------
def float_forward(layers: Sequence[FloatLayer], x: np.ndarray) -> list[np.ndarray]:
    """Every layer's float64 output for inputs ``x`` (the float model the types approximate)."""
    outs = []
    v = np.asarray(x, dtype=np.float64)
    for fl in layers:
        p = fl.params
        if fl.op == "dense":
            v = v @ p["weight"].astype(np.float64)
            if "bias" in p:
                v = v + p["bias"].astype(np.float64)
        elif fl.op == "batchnorm":
            v = v * p["scale"].astype(np.float64) + p["bias"].astype(np.float64)
        elif fl.op == "relu":
            v = np.maximum(v, 0.0)
        elif fl.op == "leaky_relu":
            v = np.where(v > 0, v, fl.alpha * v)
        elif fl.op == "sigmoid":
            v = 0.5 * (1.0 + np.tanh(0.5 * v))
        elif fl.op == "tanh":
            v = np.tanh(v)
        outs.append(v)
    return outs


# -- types ---------------------------------------------------------------------------------------
def _int_bits(m: float, signed: bool) -> int:
    """Fewest integer bits I whose range holds magnitude ``m`` (values below 2**(I-1) signed)."""
    if m <= 0 or not math.isfinite(m):
        return 1 if signed else 0
    i = math.floor(math.log2(m)) + 1
    return i + 1 if signed else i


def _fx(i: int, f: int, signed: bool = True, q: str = "AP_RND", o: str = "AP_SAT") -> FixedType:
    # AP_RND (ties up) rather than AP_RND_CONV: one adder on the card, no tie detection.
    w = max(1, i + f)
    return FixedType(w, i if w == i + f else w - f, signed, q, o)


def _check_type(text: Any) -> None:
    """Refuse a type string ap_types cannot parse (sim.fixed raises plain ValueError/TypeError)."""
    try:
        FixedType.parse(text)
    except ValueError as e:
        raise FormatError(str(e)) from e
    except TypeError as e:
        raise InputTypeError(str(e)) from e


def fixed_precision(layers: Sequence[FloatLayer], precision: str | Mapping[str, Any], *, table_size: int = 1024) -> tuple[str, dict[str, dict]]:
    """Types from a user choice: one type string for all, or ``{layer: {role: type} | type}``."""
    names = [fl.name for fl in layers]
    if isinstance(precision, str):
        _check_type(precision)
        default, per = precision, {}
    elif isinstance(precision, Mapping):
        unknown = set(precision) - set(names) - {"input", "default"}
        if unknown:
            raise InputKeyError(f"precision has unknown keys {sorted(unknown)}; layer names are {names} (plus 'input', 'default')")
        default, per = precision.get("default", DEFAULT_TYPE), precision
    else:
        raise InputTypeError(f"precision must be 'auto', a type string or a dict, got {type(precision).__name__}")
    input_type = str(per.get("input", default))
    _check_type(input_type)
    types: dict[str, dict] = {}
    for fl in layers:
        roles = _ROLES[fl.op]
        t: dict[str, Any] = {r: (DEFAULT_TABLE if r == "table" else default) for r in roles}
        if fl.op in ("sigmoid", "tanh"):
            t["table_size"] = table_size
        given = per.get(fl.name)
        if isinstance(given, str):
            t.update({r: given for r in roles})
        elif isinstance(given, Mapping):
            bad = set(given) - set(roles) - {"table_size"}
            if bad:
                raise InputKeyError(f"precision[{fl.name!r}]: unknown roles {sorted(bad)}; a {fl.op} layer has {list(roles)}")
            t.update(given)
        elif given is not None:
            raise InputTypeError(f"precision[{fl.name!r}] must be a type string or a dict of roles")
        for r in roles:
            _check_type(t[r])
        types[fl.name] = t
    return input_type, types


def build_layers(layers: Sequence[FloatLayer], types: Mapping[str, Mapping[str, Any]], *, input_type: str | None = None,
                 strategy: str = LATENCY) -> tuple[list[MlpLayer], dict[str, np.ndarray]]:
    """Simulator layers and raw weights (quantized the way hls4ml's firmware reads them).

    Under ``strategy="distributed_arithmetic"`` (which needs ``input_type``) every dense layer's
    accumulator is the exact one (:func:`offload.sim.mlp.strategy.exact_accum`); ``types``'s
    ``accum`` entries are not used.
    """
    out, consts = [], {}
    for fl in layers:
        t = types[fl.name]
        if fl.op == "dense":
            has_bias = "bias" in fl.params
            out.append(MlpLayer(fl.name, "dense", fl.n_in, fl.n_out, t["result"], weight=t["weight"],
                                bias=t["bias"] if has_bias else None, accum=t["accum"], use_bias=has_bias))
            consts[f"{fl.name}.weight"] = quantize_like_hls4ml(fl.params["weight"], t["weight"])
            if has_bias:
                consts[f"{fl.name}.bias"] = quantize_like_hls4ml(fl.params["bias"], t["bias"])
        elif fl.op == "batchnorm":
            out.append(MlpLayer(fl.name, "batchnorm", fl.n_in, fl.n_out, t["result"], scale=t["scale"], bias=t["bias"]))
            consts[f"{fl.name}.scale"] = quantize_like_hls4ml(fl.params["scale"], t["scale"])
            consts[f"{fl.name}.bias"] = quantize_like_hls4ml(fl.params["bias"], t["bias"])
        elif fl.op == "leaky_relu":
            out.append(MlpLayer(fl.name, "leaky_relu", fl.n_in, fl.n_out, t["result"], param=t["param"], alpha=float(fl.alpha)))
        elif fl.op in ("sigmoid", "tanh"):
            out.append(MlpLayer(fl.name, fl.op, fl.n_in, fl.n_out, t["result"], table=t["table"], table_size=int(t["table_size"])))
        else:
            out.append(MlpLayer(fl.name, fl.op, fl.n_in, fl.n_out, t["result"]))
    if strategy == DA:
        out = with_exact_accum(input_type, out, consts)
    return out, consts


# -- evaluation ----------------------------------------------------------------------------------
def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    # Element-wise sums, not BLAS dot: on a busy machine OpenBLAS threads spin for milliseconds.
    a, b = a.ravel(), b.ravel()
    na, nb = math.sqrt(float(np.sum(a * a))), math.sqrt(float(np.sum(b * b)))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.sum(a * b)) / (na * nb)


def _run(layers, input_type, types, x, strategy=LATENCY):
    """Every layer's output under ``types`` as floats, from the bit-exact simulator."""
    sim_layers, consts = build_layers(layers, types, input_type=input_type, strategy=strategy)
    _, steps = forward(input_type, sim_layers, consts, x, trace=True)
    return [(name, t.to_float(raw), t) for name, raw, t in steps]


def _metric(y_fixed, y_float, labels):
    """The end-to-end error: AUC drop with labels, else max absolute score error."""
    if labels is not None:
        return auc(labels, y_float[:, 0]) - auc(labels, y_fixed[:, 0])
    return float(np.max(np.abs(y_fixed - y_float))) if y_fixed.size else 0.0


def quant_report(layers, input_type, types, x, labels=None, *, metric_budget=None, cos_threshold=None, search=None,
                 strategy: str = LATENCY) -> QuantReport:
    """Per-layer ranges, types, cosine similarity and saturation share on ``x``; end-to-end metric.

    Under DA the accumulator shown is the exact one the kernel uses."""
    x = np.asarray(x, dtype=np.float64)
    flo = float_forward(layers, x)
    steps = _run(layers, input_type, types, x, strategy)
    if strategy == DA:
        sim_layers, _ = build_layers(layers, types, input_type=input_type, strategy=strategy)
        types = {fl.name: {**types[fl.name], **({"accum": str(sl.accum)} if sl.op == "dense" else {})} for fl, sl in zip(layers, sim_layers)}
    rows = []
    it = FixedType.parse(input_type)
    rows.append(LayerRow("input", "input", float(x.min()), float(x.max()), {"result": str(it)},
                         _cosine(steps[0][1], x), _sat_share(x, it)))
    for fl, f, (name, fx, t) in zip(layers, flo, steps[1:]):
        shown = {k: str(v) for k, v in types[fl.name].items() if k != "table_size"}
        if fl.op == "dense" and "bias" not in fl.params:
            shown.pop("bias", None)
        rows.append(LayerRow(fl.name, fl.op, float(f.min()), float(f.max()), shown, _cosine(fx, f), _sat_share(f, t)))
    y_fixed, y_float = steps[-1][1], flo[-1]
    if labels is not None:
        name, before, after = "auc", auc(labels, y_float[:, 0]), auc(labels, y_fixed[:, 0])
    else:
        name, before, after = "max_abs_error", 0.0, _metric(y_fixed, y_float, None)
    return QuantReport(rows, name, before, after, metric_budget, cos_threshold, len(x), search or {})


def _sat_share(f: np.ndarray, t: FixedType) -> float:
    if f.size == 0:
        return 0.0
    return float(np.mean((f > t.max_float) | (f < t.min_float)))


def _total_bits(layers, input_type: FixedType, types) -> int:
    """Cost proxy: multiplier operand bits (x bits times weight bits per MAC) plus stored widths
    (types as :func:`_types_for` gives them)."""
    prev = input_type.width
    cost = prev * layers[0].n_in
    for fl in layers:
        t = types[fl.name]
        if fl.op == "dense":
            cost += fl.n_in * fl.n_out * (prev + t["weight"].width)
            cost += fl.n_out * t["accum"].width
        elif fl.op == "batchnorm":
            cost += fl.n_in * (prev + t["scale"].width)
        res = t["result"].width
        cost += fl.n_out * res
        prev = res
    return cost


# -- the search ----------------------------------------------------------------------------------
@dataclass
class _Plan:
    """Integer bits and signedness fixed from calibration; fraction bits are the search variables."""

    in_i: int
    res: list[tuple[int, bool]]  # per layer: result integer bits, signed
    par: list[dict[str, tuple[int, bool]]]  # per layer: role -> (integer bits, signed) for weights etc.


def _plan(layers, x, flo) -> _Plan:
    """Integer bits and signedness of every value from the calibration ranges: one bit of headroom on
    the input and the results, weights and parameters from their own maxima, fixed ranges for
    sigmoid and tanh."""
    in_i = _int_bits(float(np.abs(x).max()), True) + 1
    res, par = [], []
    for fl, f in zip(layers, flo):
        p: dict[str, tuple[int, bool]] = {}
        if fl.op == "dense":
            p["weight"] = (_int_bits(float(np.abs(fl.params["weight"]).max()), True), True)
            if "bias" in fl.params:
                p["bias"] = (_int_bits(float(np.abs(fl.params["bias"]).max()), True), True)
        elif fl.op == "batchnorm":
            p["scale"] = (_int_bits(float(np.abs(fl.params["scale"]).max()), True), True)
            p["bias"] = (_int_bits(float(np.abs(fl.params["bias"]).max()), True), True)
        elif fl.op == "leaky_relu":
            p["param"] = (_int_bits(abs(float(fl.alpha)), True), True)
        if fl.op == "sigmoid":
            res.append((0, False))  # [0, 1): saturates at 1 - lsb, as the table never reaches 1 exactly
        elif fl.op == "tanh":
            res.append((1, True))
        elif fl.op == "relu":
            res.append((_int_bits(float(np.abs(f).max()), False) + 1, False))
        else:
            res.append((_int_bits(float(np.abs(f).max()), True) + 1, True))
        par.append(p)
    return _Plan(in_i, res, par)


def _types_for(layers, plan: _Plan, f_in: int, f_par: list[int], f_res: list[int], table_size: int) -> tuple[FixedType, dict]:
    """The ap_types of the input and of every layer for given fraction bits, integer bits from ``plan``."""
    prev = input_type = _fx(plan.in_i, f_in)
    types: dict[str, dict] = {}
    for k, fl in enumerate(layers):
        ri, rs = plan.res[k]
        rt = _fx(ri, f_res[k], rs)
        t: dict[str, Any] = {"result": rt}
        if fl.op == "dense":
            wi, _ = plan.par[k]["weight"]
            t["weight"] = wt = _fx(wi, f_par[k])
            bi = plan.par[k].get("bias", (1, True))[0]
            t["bias"] = _fx(bi, f_par[k])
            # Accumulator: the products' fraction bits (no rounding) and the integer bits of the
            # worst case over the input type's range (no overflow), so only result_t quantizes.
            w = np.abs(fl.params["weight"]).astype(np.float64)
            xmax = max(abs(prev.min_float), abs(prev.max_float))
            worst = float((xmax * w.sum(axis=0) + (np.abs(fl.params["bias"]) if "bias" in fl.params else 0.0)).max())
            acc_f = prev.F + wt.F
            acc_i = _int_bits(worst, True) + 1
            t["accum"] = _fx(acc_i, acc_f, True, "AP_TRN", "AP_WRAP")
        elif fl.op == "batchnorm":
            t["scale"] = _fx(plan.par[k]["scale"][0], f_par[k])
            t["bias"] = _fx(plan.par[k]["bias"][0], f_par[k])
        elif fl.op == "leaky_relu":
            t["param"] = _fx(plan.par[k]["param"][0], 16)
        elif fl.op in ("sigmoid", "tanh"):
            t["table"] = _fx(2, max(f_res[k] + 2, 8))
            t["table_size"] = table_size
        types[fl.name] = t
        prev = rt
    return input_type, types


def _widest_valid(layers, plan: _Plan, table_size: int, n_features: int, strategy: str = LATENCY) -> int:
    """The most fraction bits (<= _F_MAX) for which every width stays within the 62-bit datapath
    (huge calibration ranges need many integer bits, leaving fewer for fractions)."""

    n = len(layers)
    for f in range(_F_MAX, -1, -1):
        input_type, types = _types_for(layers, plan, f, [f] * n, [f] * n, table_size)
        try:
            sim_layers, consts = build_layers(layers, types, input_type=input_type, strategy=strategy)
            MlpSpec(n_features, input_type, tuple(sim_layers), consts, strategy=strategy)
        except ValueError:
            continue
        return f
    raise InputError("quantization: the calibration ranges need more than 62 bits in some layer")


@dataclass(frozen=True)
class _Fractions:
    """The search variables: fraction bits of the input, of each layer's parameters and of its result."""

    inp: int
    par: tuple[int, ...]
    res: tuple[int, ...]

    @classmethod
    def uniform(cls, f: int, n: int) -> _Fractions:
        return cls(f, (f,) * n, (f,) * n)

    def get(self, kind: str, k: int) -> int:
        return self.inp if kind == "in" else getattr(self, kind)[k]

    def with_(self, kind: str, k: int, f: int) -> _Fractions:
        if kind == "in":
            return replace(self, inp=f)
        bits = list(getattr(self, kind))
        bits[k] = f
        return replace(self, **{kind: tuple(bits)})

    def types(self, layers, plan: _Plan, table_size: int) -> tuple[FixedType, dict]:
        return _types_for(layers, plan, self.inp, list(self.par), list(self.res), table_size)


@dataclass
class _Constraints:
    """The search's test of a candidate: every output's cosine to the float model (the input's
    included) at least ``cos_threshold``, and the end-to-end metric within ``budget``, simulated
    bit-exactly on the calibration rows. Counts its evaluations for the report."""

    layers: Sequence[FloatLayer]
    plan: _Plan
    x: np.ndarray
    flo: list[np.ndarray]
    labels: np.ndarray | None
    cos_threshold: float
    budget: float
    strategy: str
    evaluations: int = 0

    def met(self, fr: _Fractions, table_size: int) -> bool:
        self.evaluations += 1
        it, ty = fr.types(self.layers, self.plan, table_size)
        steps = _run(self.layers, it, ty, self.x, self.strategy)
        if _cosine(steps[0][1], self.x) < self.cos_threshold:
            return False
        for f, (_, fx, _) in zip(self.flo, steps[1:]):
            if _cosine(fx, f) < self.cos_threshold:
                return False
        return _metric(steps[-1][1], self.flo[-1], self.labels) <= self.budget


def _calibration_rows(x: np.ndarray, labels, max_rows: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Check the labels and keep at most ``max_rows`` rows (a fixed subsample: the search
    must be reproducible)."""
    if labels is not None and len(labels) != len(x):
        raise ValueError(f"labels has {len(labels)} rows, calib has {len(x)}")
    if len(x) <= max_rows:
        return x, labels
    idx = np.random.default_rng(0).choice(len(x), max_rows, replace=False)
    idx.sort()
    return x[idx], (None if labels is None else labels[idx])


def _default_budget(y_float: np.ndarray, labels) -> float:
    """An AUC drop of 0.002 with labels, else 0.01 x max(1, range of the float outputs) as
    max absolute error."""
    if labels is not None:
        return 0.002
    return 0.01 * max(1.0, float(np.ptp(y_float)) if y_float.size else 1.0)


def _fit_tables(layers, meets: _Constraints, widest: _Fractions, table_size: int) -> tuple[int, bool]:
    """Whether the widest types meet the constraints, doubling the lookup tables (up to
    ``_MAX_TABLE``) while they do not; returns ``(table_size, feasible)``."""
    feasible = meets.met(widest, table_size)
    has_tables = any(fl.op in ("sigmoid", "tanh") for fl in layers)
    while not feasible and has_tables and table_size < _MAX_TABLE:
        # The lookup tables' step (16 / table_size for sigmoid) bounds the error whatever the
        # types: sensitive models get finer tables.
        table_size *= 2
        feasible = meets.met(widest, table_size)
    return table_size, feasible


def _search_order(layers, plan: _Plan) -> list[tuple[str, int]]:
    """The search variables, most expensive first: weights of big layers, then results, then the input."""
    n = len(layers)
    variables: list[tuple[float, str, int]] = []
    for k, fl in enumerate(layers):
        if plan.par[k] and fl.op in ("dense", "batchnorm"):
            variables.append((fl.n_in * fl.n_out, "par", k))
        variables.append((fl.n_out * (layers[k + 1].n_out if k + 1 < n and layers[k + 1].op == "dense" else 1), "res", k))
    variables.append((layers[0].n_in * layers[0].n_out, "in", -1))
    variables.sort(key=lambda v: -v[0])
    return [(kind, k) for _, kind, k in variables]


def _lowest_feasible(meets: _Constraints, fr: _Fractions, kind: str, k: int, table_size: int) -> int:
    """The fewest fraction bits of one variable that still meet the constraints, the others held,
    by bisection between ``_F_MIN`` and its current (feasible) value."""
    lo, hi = _F_MIN, fr.get(kind, k)
    while lo < hi:
        mid = (lo + hi) // 2
        if meets.met(fr.with_(kind, k, mid), table_size):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _lower_fractions(layers, plan: _Plan, meets: _Constraints, widest: _Fractions, table_size: int) -> _Fractions:
    """Greedy descent from the widest feasible types, each variable in turn lowered as far as
    the constraints allow; a second pass only if the first changed something."""
    fr = widest
    order = _search_order(layers, plan)
    for _ in range(2):
        changed = False
        for kind, k in order:
            f = _lowest_feasible(meets, fr, kind, k, table_size)
            if f != fr.get(kind, k):
                changed = True
                fr = fr.with_(kind, k, f)
        if not changed:
            break
    return fr


def _search_summary(layers, plan: _Plan, meets: _Constraints, widest: _Fractions, input_type: FixedType, types: dict,
                    table_size: int, feasible: bool, strategy: str) -> dict[str, Any]:
    """What the report says of the search."""
    has_tables = any(fl.op in ("sigmoid", "tanh") for fl in layers)
    return {
        "evaluations": meets.evaluations,
        "calibration_rows_searched": int(len(meets.x)),
        "total_bits": _total_bits(layers, input_type, types),
        "total_bits_widest": _total_bits(layers, *widest.types(layers, plan, table_size)),
        "feasible": bool(feasible),
        "strategy": strategy,
        "table_size": table_size if has_tables else None,
    }


def choose_precision(
    layers: Sequence[FloatLayer],
    x: np.ndarray,
    *,
    labels: np.ndarray | None = None,
    reference: np.ndarray | None = None,
    cos_threshold: float = 0.999,
    budget: float | None = None,
    table_size: int = 1024,
    drift_threshold: float = 0.2,
    max_rows: int = _MAX_CALIB_ROWS,
    strategy: str = LATENCY,
) -> tuple[str, dict[str, dict], QuantReport]:
    """Search the cheapest types meeting the cosine threshold and the end-to-end budget.

    Candidates are simulated with ``strategy``'s datapath: under ``"distributed_arithmetic"``
    accumulation is exact, so accumulators are no search variable (they follow the other types).

    ``budget`` defaults to 0.01 x max(1, range of the float outputs) as max absolute error, or an
    AUC drop of 0.002 when ``labels`` are given. Returns ``(input_type, types, report)``.

    Example::

        input_type, types, report = choose_precision(layers, X_calib, labels=y_calib)
    """
    x = np.asarray(x, dtype=np.float64)
    if reference is not None:  # here, not in a step: the warning names the caller's line
        check_drift(x, reference, threshold=drift_threshold)
    xs, ls = _calibration_rows(x, labels, max_rows)
    flo = float_forward(layers, xs)
    if budget is None:
        budget = _default_budget(flo[-1], ls)
    # Integer bits from the calibration ranges, then the most fraction bits the datapath holds.
    plan = _plan(layers, xs, flo)
    widest = _Fractions.uniform(_widest_valid(layers, plan, table_size, xs.shape[1], strategy), len(layers))
    meets = _Constraints(layers, plan, xs, flo, ls, cos_threshold, budget, strategy)
    table_size, feasible = _fit_tables(layers, meets, widest, table_size)
    if feasible:
        chosen = _lower_fractions(layers, plan, meets, widest, table_size)
    else:
        warnings.warn(
            f"quantization: even {widest.inp} fraction bits everywhere miss cosine >= {cos_threshold} or the "
            f"budget {budget:g}; keeping the widest types",
            QuantizationBudgetWarning,
            stacklevel=3,
        )
        chosen = widest
    # The types of the chosen fraction bits, then the report on every calibration row.
    input_type, types = chosen.types(layers, plan, table_size)
    search = _search_summary(layers, plan, meets, widest, input_type, types, table_size, feasible, strategy)
    report = quant_report(layers, input_type, types, x, labels, metric_budget=budget, cos_threshold=cos_threshold, search=search,
                          strategy=strategy)
    return str(input_type), _as_text(types), report


def _as_text(types: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
    """Types by layer and role as ap_types text (``table_size`` kept), the form callers and reports take."""
    return {name: {r: v if r == "table_size" else str(v) for r, v in t.items()} for name, t in types.items()}

"""The compiled plan: the MLP reference's small-batch fast path, bit-identical to
:func:`offload.sim.mlp.datapath.forward` (``tests/sim/test_mlp_plan.py`` proves it on random specs
at the types' edges)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from offload.sim import _fixed_core as _core
from offload.sim.fixed import FixedType, add_type, mul_type
from offload.sim.mlp.datapath import (
    _ROW_BLOCK_ELEMS,
    _TABLE_SPAN,
    OPS,
    MlpLayer,
    _activation,
    _batchnorm,
    _cast,
    _dense,
    _ftype,
    activation_table,
)

__all__ = ["plan_for", "PLAN_MAX_ROWS"]

# -- compiled plan: the small-batch fast path ----------------------------------------------------
# A batch-1 call through forward() spends ~120 us in per-call Python and NumPy overhead (type
# lookups, generic casts, range checks, int64 <-> float conversions) for a few hundred products.
# A plan does everything that depends only on the spec once: weights as float64 matrices with the
# accumulator and result scalings folded in, biases with the rounding offset folded in, tables
# already cast into the result type, and the saturations that the types' ranges prove can never
# trigger dropped. The per-call path is then a short sequence of NumPy ops on float64 arrays that
# hold raw integers: every step is exact because every value (and every partial sum of a GEMM)
# stays an integer times a power of two below _EXACT, where float64 arithmetic is exact whatever
# order BLAS adds in. A layer that does not meet those bounds runs its general int64 step.
_EXACT = 1 << 51  # raw magnitudes (and partial sums) below this are exact in float64 arithmetic
_TABLE_PAD_MAX = 1 << 16  # widest padded lookup table (indices out of range map to the clamps)
_PLAN_CACHE_SIZE = 64
# Batches up to this many rows take the plan. Larger ones take forward(), whose float32 GEMMs
# (when the batch's own bound allows) and int32 cache-blocked product passes win once the
# per-call overhead no longer dominates (bench/bench_mlp.py; crossover measured at 256-4096 rows).
PLAN_MAX_ROWS = 128
# Models with more resident values than this get no plan: a plan holds float64 copies of the
# weights (and a snapshot of writable ones), and their batch-1 GEMMs outweigh the overhead anyway.
_PLAN_MAX_VALUES = 1 << 20


def _ceil_shift(v: int, s: int) -> int:
    return -((-v) >> s)


def _scales_ok(*types: FixedType) -> bool:
    """Fraction bits small enough that every power-of-two scaling between these types keeps
    values of magnitude >= 1 (and < 2**102) normal doubles: no underflow, no overflow."""
    return all(-400 < t.F < 400 for t in types)


def _fround(mode: str, s: int):
    """In-place rounding of exact ``v * 2**-s`` (|v| < _EXACT, s >= 1) to an integer with ``mode``."""
    scale = 2.0**-s
    if mode == "AP_RND" and s <= 52:
        # floor(y + 1/2) is exact here: y + 1/2 = (v + 2**(s-1)) * 2**-s, an integer below 2**53
        # scaled by a power of two.
        def rnd(v):
            np.multiply(v, scale, out=v)
            np.add(v, 0.5, out=v)
            return np.floor(v, out=v)

        return rnd
    fn = {"AP_TRN": np.floor, "AP_TRN_ZERO": np.trunc, "AP_RND_CONV": np.rint}.get(mode)
    if fn is not None:
        return lambda v: fn(np.multiply(v, scale, out=v), out=v)
    return lambda v: _core.round_float(np.multiply(v, scale, out=v), mode, inplace=True)


def _ffit(t: FixedType, lo: int, hi: int):
    """(in-place step or None, lo, hi): integer-valued ``v`` in [lo, hi] fitted into ``t``."""
    tlo, thi = t.min_raw, t.max_raw
    if tlo <= lo and hi <= thi:
        return None, lo, hi
    o = t.overflow
    if o in ("AP_SAT", "AP_SAT_SYM"):
        if o == "AP_SAT_SYM" and t.signed and t.width > 1:
            tlo += 1
        a, b = float(tlo), float(thi)
        if lo < tlo and hi > thi:
            return (lambda v: np.minimum(np.maximum(v, a, out=v), b, out=v)), tlo, thi
        if hi > thi:
            return (lambda v: np.minimum(v, b, out=v)), max(lo, tlo), thi
        return (lambda v: np.maximum(v, a, out=v)), tlo, min(hi, thi)
    if o == "AP_SAT_ZERO":
        a, b = float(tlo), float(thi)

        def zero(v):
            v[(v < a) | (v > b)] = 0.0
            return v

        return zero, min(max(lo, tlo), 0), max(min(hi, thi), 0)
    if o == "AP_WRAP" and not t.sat_bits and max(-lo, hi) + (1 << t.width) < _EXACT:
        m, inv = float(1 << t.width), 2.0**-t.width
        off = float(1 << (t.width - 1)) if t.signed else 0.0

        def wrap(v):  # v - 2**W * floor((v - min) / 2**W): every step exact below _EXACT
            k = np.floor((v + off) * inv)
            v -= k * m
            return v

        return wrap, tlo, thi

    def fit_int(v):  # AP_WRAP with saturation bits: the int64 primitive
        return _core.fit_int64(v.astype(np.int64), t, inplace=True).astype(np.float64)

    return fit_int, tlo, thi


def _chain(*steps):
    steps = [s for s in steps if s is not None]
    if len(steps) <= 1:
        return steps[0] if steps else None

    def run(v):
        for s in steps:
            v = s(v)
        return v

    return run


def _fcast(t: FixedType, src: FixedType, lo: int, hi: int):
    """(in-place step or None, lo, hi) for ``_cast(t, v, src)`` on integer-valued float64 ``v`` in
    [lo, hi]; False where the float path does not apply (then use the int64 step)."""
    if t.is_int or src.is_int or t.width > 50 or not _scales_ok(t, src):
        return False
    s = src.F - t.F
    if s > 0:
        rnd = _fround(t.rounding, s)
        lo, hi = lo >> s, _ceil_shift(hi, s)
    elif s < 0:
        if max(-lo, hi) << -s >= _EXACT:
            return False
        scale = 2.0**-s
        rnd = lambda v: np.multiply(v, scale, out=v)  # noqa: E731
        lo, hi = lo << -s, hi << -s
    else:
        rnd = None
    fit, lo, hi = _ffit(t, lo, hi)
    return _chain(rnd, fit), lo, hi


def _int_step(fn, t: FixedType):
    """A layer's general int64 step inside a float plan (values below _EXACT convert exactly)."""
    def step(v):
        return fn(v.astype(np.int64)).astype(np.float64)

    return step, t.min_raw, t.max_raw


def _plan_dense(layer: MlpLayer, xt: FixedType, lo: int, hi: int, tensors: Mapping[str, np.ndarray]):
    wt, at, rt = _ftype(layer.weight), _ftype(layer.accum), _ftype(layer.result)
    general = _int_step(lambda v: _dense(v, xt, layer, tensors), rt)
    w = np.asarray(tensors[f"{layer.name}.weight"], dtype=np.int64)
    if layer.use_bias:
        acc0 = at.cast(np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64), _ftype(layer.bias))
    else:
        acc0 = np.zeros(layer.n_out, dtype=np.int64)
    types = (wt, at, rt, xt) + ((_ftype(layer.bias),) if layer.use_bias else ())
    if any(t.is_int for t in types) or at.width > 62 or not w.size or not _scales_ok(*types, mul_type(xt, wt)):
        return general
    wabs = int(np.abs(w).max())
    if wabs * layer.n_in >= _EXACT:  # also keeps the int64 column sums below from overflowing
        return general
    pt = mul_type(xt, wt)
    shift = at.F - pt.F
    xabs = max(-lo, hi)
    bias_abs = int(np.abs(acc0).max(initial=0))
    sums = int(np.abs(w).sum(axis=0).max()) * xabs  # bound on any partial sum of products
    if shift >= 0 and at.signed and (sums << shift) + bias_abs <= at.max_raw and (sums << shift) + bias_abs < _EXACT:
        # No product is rounded and no partial sum can leave accum_t: the accumulation is one
        # exact GEMM. The cast into result_t's grid is folded into the weights and the bias.
        m = (sums << shift) + bias_abs
        s = at.F - rt.F
        if rt.width > 50:
            return general
        wf = np.ldexp(w.astype(np.float64), shift - s)
        if s > 0 and rt.rounding in ("AP_TRN", "AP_TRN_ZERO", "AP_RND_CONV") or (rt.rounding == "AP_RND" and 0 < s <= 52):
            rnd = {"AP_TRN": np.floor, "AP_RND": np.floor, "AP_TRN_ZERO": np.trunc, "AP_RND_CONV": np.rint}[rt.rounding]
            bf = np.ldexp(acc0.astype(np.float64), -s) + (0.5 if rt.rounding == "AP_RND" else 0.0)
            lo2, hi2 = (-m) >> s, _ceil_shift(m, s)
        elif s > 0:
            mode = rt.rounding
            bf = np.ldexp(acc0.astype(np.float64), -s)
            rnd = lambda v, out=None: _core.round_float(v, mode, inplace=True)  # noqa: E731
            lo2, hi2 = (-m) >> s, _ceil_shift(m, s)
        else:
            if m << -s >= _EXACT:
                return general
            bf = np.ldexp(acc0.astype(np.float64), -s)
            rnd = None
            lo2, hi2 = -(m << -s), m << -s
        fit, lo2, hi2 = _ffit(rt, lo2, hi2)

        def gemm(v):
            y = v @ wf
            y += bf
            if rnd is not None:
                y = rnd(y, out=y)
            return y if fit is None else fit(y)

        return gemm, lo2, hi2
    if at.overflow == "AP_WRAP" and not at.sat_bits:
        # Wrapping every product and every partial sum into W bits is the total modulo 2**W.
        if shift >= 0:
            m = (sums << shift) + bias_abs
            if m + (1 << at.width) >= _EXACT:
                return general
            wf = np.ldexp(w.astype(np.float64), shift)
            terms = None
        else:
            # Each product rounded onto accum_t's grid on its own, then summed (B x n_in x n_out).
            if xabs * wabs >= _EXACT:
                return general
            m = layer.n_in * _ceil_shift(xabs * wabs, -shift) + bias_abs
            if m + (1 << at.width) >= _EXACT:
                return general
            wf = w.astype(np.float64)
            terms = _fround(at.rounding, -shift)
        b0 = acc0.astype(np.float64)
        wrap, wlo, whi = _ffit(at, -m, m)
        cast = _fcast(rt, at, wlo, whi)
        if cast is False:
            return general
        cast_fn, lo2, hi2 = cast
        limit = _ROW_BLOCK_ELEMS // max(1, w.size)

        def wrapsum(v):
            if terms is None:
                y = v @ wf
            elif v.shape[0] > limit:
                return general[0](v)
            else:
                y = terms(v[:, :, None] * wf[None, :, :]).sum(axis=1)
            y += b0
            if wrap is not None:
                y = wrap(y)
            return y if cast_fn is None else cast_fn(y)

        return wrapsum, lo2, hi2
    return general


def _plan_batchnorm(layer: MlpLayer, xt: FixedType, lo: int, hi: int, tensors):
    st, bt, rt = _ftype(layer.scale), _ftype(layer.bias), _ftype(layer.result)
    general = _int_step(lambda v: _batchnorm(v, xt, layer, tensors), rt)
    scale = np.asarray(tensors[f"{layer.name}.scale"], dtype=np.int64)
    bias = np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64)
    if any(t.is_int for t in (xt, st, bt)) or not scale.size or not _scales_ok(xt, st, bt):
        return general
    pt = mul_type(xt, st)
    sumt = add_type(pt, bt)
    if sumt.width > 64 or sumt.is_int:
        return general
    up_p, up_b = sumt.F - pt.F, sumt.F - bt.F
    m = (max(-lo, hi) * int(np.abs(scale).max()) << up_p) + (int(np.abs(bias).max()) << up_b)
    if m >= _EXACT:
        return general
    sc = np.ldexp(scale.astype(np.float64), up_p)
    bb = np.ldexp(bias.astype(np.float64), up_b)
    cast = _fcast(rt, sumt, -m, m)
    if cast is False:
        return general
    cast_fn, lo2, hi2 = cast

    def bn(v):
        y = v * sc
        y += bb
        return y if cast_fn is None else cast_fn(y)

    return bn, lo2, hi2


def _plan_activation(layer: MlpLayer, xt: FixedType, lo: int, hi: int, out_scale: float | None):
    rt = _ftype(layer.result)
    general = _int_step(lambda v: _activation(v, xt, layer), rt)
    if layer.op == "relu":
        cast = _fcast(rt, xt, max(lo, 0), max(hi, 0))
        if cast is False:
            return general
        cast_fn, lo2, hi2 = cast
        if lo >= 0:
            return cast_fn, lo2, hi2
        return _chain(lambda v: np.maximum(v, 0.0, out=v), cast_fn), lo2, hi2
    if layer.op == "leaky_relu":
        ptype = _ftype(layer.param)
        alpha = int(ptype.quantize(np.float64(layer.alpha)))
        pt = mul_type(ptype, xt)
        am = abs(alpha) * max(-lo, hi)
        if pt.is_int or am >= _EXACT:
            return general
        pos = _fcast(rt, xt, lo, hi)
        neg = _fcast(rt, pt, -am, am)
        if pos is False or neg is False:
            return general
        (pos_fn, plo, phi), (neg_fn, nlo, nhi) = pos, neg
        a = float(alpha)

        def leaky(v):
            keep = v > 0
            n = v * a
            if neg_fn is not None:
                n = neg_fn(n)
            p = v if pos_fn is None else pos_fn(v)
            return np.where(keep, p, n)

        return leaky, min(plo, nlo), max(phi, nhi)
    # sigmoid / tanh: index = int(x * N / span) + N / 2, clamped; the value is table[index] cast.
    n, span, f = int(layer.table_size), _TABLE_SPAN[layer.op], xt.F
    tt = _ftype(layer.table)
    if rt.is_int or tt.is_int or max(-lo, hi) * n >= _EXACT or not _scales_ok(xt, rt):
        return general
    table = _cast(rt, activation_table(layer.op, n, layer.table).astype(np.int64), tt)
    tlo, thi = int(table.min()), int(table.max())
    table = table.astype(np.float64)
    if out_scale is not None:  # the last layer: the table holds the output floats directly
        table = table * out_scale
    # int(data * N / span) then to_int() truncate toward zero in turn; for F > 0 both are
    # divisions of integers by positive powers of two, whose truncations compose into one.
    if span & (span - 1):
        return general
    lg = span.bit_length() - 1
    offset = (span // 2) * n // span
    if f > 0:
        d = _ceil_shift(max(-lo, hi) * n, lg + f)
        c1, c2, post = float(n), 2.0 ** -(lg + f), 1.0
    else:
        d = _ceil_shift(max(-lo, hi) * n, lg) << -f
        c1, c2, post = float(n), 2.0**-lg, 2.0**-f
    if d + offset >= (1 << 31) or 2 * d + 1 > _TABLE_PAD_MAX:
        return general  # the int32 wrap-around could matter, or the padded table would be large
    # padded[j] = table[clamp(j - d + offset)]: one gather does the offset and both clamps.
    padded = table[np.clip(np.arange(-d, d + 1) + offset, 0, n - 1)]

    if n & (n - 1) == 0:  # N a power of two: one exact scaling instead of two
        c1, c2 = c1 * c2, 1.0

    def lookup(v):
        v *= c1
        if c2 != 1.0:
            v *= c2
        np.trunc(v, out=v)
        if post != 1.0:
            v *= post
        v += float(d)
        return padded[v.astype(np.intp)]

    if out_scale is not None:
        return lookup, None, None
    return lookup, tlo, thi


class _Plan:
    """The compiled per-call path of one (input type, layers, tensors); see the section comment."""

    __slots__ = ("input_type", "layers", "tensors", "arrays", "steps", "in_scale", "in_lim2", "in_round", "in_fit", "out_scale")

    def current(self, input_type: str, layers, tensors) -> bool:
        if self.layers is not layers or self.tensors is not tensors or self.input_type != input_type:
            return False
        for name, arr, snap in self.arrays:
            if tensors.get(name) is not arr:
                return False
            # A read-only array that owns its memory (the sim device's resident copies) is taken
            # as constant; anything else is compared with the contents the plan was built from.
            if snap is not None and arr.tobytes() != snap:
                return False
        return True

    def run(self, x: np.ndarray) -> np.ndarray | None:
        """Float64 outputs, or None where the input needs the general path (not finite, or too
        large for the float steps: those take the bit-level quantization)."""
        if not np.vdot(x, x) < self.in_lim2:  # also False for NaN
            return None
        v = self.in_round(x * self.in_scale)
        if self.in_fit is not None:
            v = self.in_fit(v)
        for step in self.steps:
            v = step(v)
        if self.out_scale is not None:
            v *= self.out_scale
        return v


def _compile(input_type: str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray]) -> _Plan | None:
    t = _ftype(input_type)
    if t.is_int or t.width > 50 or not 0 <= t.F < 400 or any(layer.op not in OPS for layer in layers):
        return None
    if any(_ftype(layer.result).width > 50 for layer in layers):
        return None
    p = _Plan()
    p.input_type, p.layers, p.tensors = input_type, layers, tensors
    if sum(int(np.size(tensors[n])) for n in tensors) > _PLAN_MAX_VALUES:
        return None
    p.arrays = []
    for name in sorted(n for layer in layers for n in (f"{layer.name}.weight", f"{layer.name}.bias", f"{layer.name}.scale") if n in tensors):
        a = tensors[name]
        if not isinstance(a, np.ndarray):
            return None
        frozen = not a.flags.writeable and a.flags.owndata
        p.arrays.append((name, a, None if frozen else a.tobytes()))
    # Input: x * 2**F and its rounding are exact for any double; the per-call check keeps
    # |x * 2**F| below 2**49 (a factor 2 of margin for the rounded sum of squares), the bound
    # assumed here is 2**50.
    lim = 2.0 ** (49 - t.F)
    p.in_scale, p.in_lim2 = 2.0**t.F, lim * lim
    mode = t.rounding
    p.in_round = lambda y: _core.round_float(y, mode, inplace=True)
    p.in_fit, lo, hi = _ffit(t, -(1 << 50), 1 << 50)
    p.steps = []
    last = _ftype(layers[-1].result if layers else input_type)
    if not _scales_ok(last):
        return None
    p.out_scale = 2.0**-last.F
    for i, layer in enumerate(layers):
        is_last = i == len(layers) - 1
        if layer.op == "dense":
            step, lo, hi = _plan_dense(layer, t, lo, hi, tensors)
        elif layer.op == "batchnorm":
            step, lo, hi = _plan_batchnorm(layer, t, lo, hi, tensors)
        else:
            step, lo, hi = _plan_activation(layer, t, lo, hi, p.out_scale if is_last and layer.op in _TABLE_SPAN else None)
            if lo is None:  # the table already holds the output floats
                p.out_scale = None
        if step is not None:
            p.steps.append(step)
        t = _ftype(layer.result)
    return p


_PLANS: dict[tuple[int, int], _Plan] = {}


def plan_for(input_type: str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray]) -> _Plan | None:
    """The cached plan of this (layers tuple, tensors mapping), rebuilt when either changed."""
    if not isinstance(layers, tuple) or not layers:
        return None  # a list may change under the cache; compiling per call would cost more than it saves
    key = (id(layers), id(tensors))
    plan = _PLANS.get(key)
    if plan is not None and plan.current(input_type, layers, tensors):
        return plan
    plan = _compile(input_type, layers, tensors)
    if plan is None:
        return None
    if len(_PLANS) >= _PLAN_CACHE_SIZE:
        _PLANS.pop(next(iter(_PLANS)), None)
    _PLANS[key] = plan
    return plan

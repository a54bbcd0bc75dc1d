"""Bit-exact reference of hls4ml's io_parallel datapath for small scoring MLPs (Vitis backend).

Every rule below is read from the C++ hls4ml generates and compiles (``nnet_utils`` in the
installed hls4ml, ``firmware/parameters.h`` / ``defines.h`` of a written project); the proof is
``tests/test_mlp_hls4ml.py``, which compares against hls4ml's own compiled C-simulation.

- Input: ``input_t(double)`` (the ``myproject_double`` bridge converts each feature that way).
- Dense (``nnet_dense_latency.h``): ``mult = (accum_t)(x * w)`` with the full-precision product,
  ``acc = (accum_t)bias``, then ``acc += mult`` input by input in index order (each step assigned
  back into ``accum_t``), finally ``res = (result_t)acc``.
- BatchNorm (``nnet_batchnorm.h``, ``normalize``): ``res = (result_t)(x * scale + bias)`` with the
  exact product and sum.
- ReLU: ``x > 0 ? (result_t)x : 0``. LeakyReLU: ``x > 0 ? (result_t)x : (result_t)(alpha * x)``
  with ``alpha = (param_t)(double)negative_slope``.
- Sigmoid / Tanh (``nnet_activation.h``): a ``table_size``-entry table built at first call in
  float (``1.0 / (1 + std::exp(-x))`` returned as float; ``tanh`` resolves to ``tanhf``) over
  [-8, 8) / [-4, 4) and stored in ``table_t``; the index is
  ``int(x * table_size / 16) + table_size / 2`` (``/ 8`` for tanh), clamped to the table.
  The float functions come from this machine's libm (``expf`` / ``tanhf`` through ctypes): NumPy's
  own float32 ``exp`` differs from glibc's in the last bit for some inputs, which can move a table
  entry by one LSB after rounding into ``table_t``.
- Output: ``double(result_t)``.

Weights reach the C++ as decimal text: hls4ml prints each float with ``F`` decimals (``F`` = the
weight type's fraction bits, at least 0) and the firmware converts that text to the type;
:func:`quantize_like_hls4ml` reproduces that path.

Example::

    from offload.sim.mlp import MlpLayer, simulate
    layers = [MlpLayer("fc0", "dense", 4, 1, "ap_fixed<16,6>", weight="ap_fixed<8,2>",
                       bias="ap_fixed<8,2>", accum="ap_fixed<24,10>")]
    y = simulate("ap_fixed<16,6>", layers, {"fc0.weight": w_raw, "fc0.bias": b_raw}, x)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np

from offload.sim import _fixed_core as _core
from offload.sim.fixed import FixedType, accumulate, add, add_type, mul, mul_type

__all__ = [
    "OPS",
    "MlpLayer",
    "activation_table",
    "forward",
    "quantize_like_hls4ml",
    "simulate",
]

OPS = ("dense", "batchnorm", "relu", "leaky_relu", "sigmoid", "tanh")
# Fraction of the table range: sigmoid's table spans [-8, 8), tanh's [-4, 4) (nnet_activation.h).
_TABLE_SPAN = {"sigmoid": 16, "tanh": 8}
_ROW_BLOCK_ELEMS = 1 << 18  # products per block on the exact dense path: blocks stay in cache
# Tests turn the exact-GEMM shortcuts off (this one and the compiled plan below, whose dense steps
# are GEMMs) to check them against the step-by-step path.
_FAST_DENSE = True


@dataclass(frozen=True)
class MlpLayer:
    """One layer of the datapath with its ap_types type strings.

    ``op`` is one of :data:`OPS`. Dense layers use ``weight``/``bias``/``accum``; batchnorm
    ``scale``/``bias``; leaky_relu ``param`` (the type of ``alpha``); sigmoid/tanh ``table`` and
    ``table_size``. ``result`` is every layer's output type. ``use_bias=False`` is a Linear without
    bias (hls4ml then adds a zero ``ap_uint<1>`` bias, which changes nothing).
    """

    name: str
    op: str
    n_in: int
    n_out: int
    result: str
    weight: str | None = None
    bias: str | None = None
    accum: str | None = None
    scale: str | None = None
    param: str | None = None
    alpha: float | None = None
    table: str | None = None
    table_size: int | None = None
    use_bias: bool = True

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: Mapping) -> "MlpLayer":
        return cls(**dict(d))

    def types(self) -> dict[str, str]:
        """The layer's type strings by role (only the roles it has)."""
        roles = ("weight", "bias", "accum", "scale", "param", "table", "result")
        out = {r: getattr(self, r) for r in roles if getattr(self, r) is not None}
        if self.op == "dense" and not self.use_bias:
            out.pop("bias", None)
        return out


@functools.lru_cache(maxsize=4096)
def _ftype(text: str) -> FixedType:
    """Parsed type, cached: a batch-1 call would otherwise spend most of its time in the parser."""
    return FixedType.parse(text)


# -- weights -------------------------------------------------------------------------------------
def quantize_like_hls4ml(values: np.ndarray, t: FixedType | str) -> np.ndarray:
    """Raw values the hls4ml firmware holds for float weights ``values`` in type ``t``.

    hls4ml writes ``'{:.Nf}'.format(v)`` with ``N = max(0, F)`` into the weight headers; the C++
    then converts that decimal text (a double literal, or ``istream >> double`` for .txt weights)
    into ``t``. Python's float formatting and parsing are correctly rounded like the C library's.
    """
    t = FixedType.parse(t)
    v = np.asarray(values, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError(f"weights for {t} must be finite")
    decimals = max(0, t.F)
    flat = [float(f"{x:.{decimals}f}") for x in v.ravel().tolist()]
    return t.quantize(np.asarray(flat, dtype=np.float64).reshape(v.shape))


# -- activation tables ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _libm() -> ctypes.CDLL:
    name = ctypes.util.find_library("m") or "libm.so.6"
    lib = ctypes.CDLL(name)
    for fn in ("expf", "tanhf"):
        f = getattr(lib, fn)
        f.restype = ctypes.c_float
        f.argtypes = [ctypes.c_float]
    return lib


def _float_table(op: str, n: int) -> np.ndarray:
    """The float32 values nnet_activation.h computes before storing them in table_t."""
    ii = np.arange(n, dtype=np.float64)
    span = float(_TABLE_SPAN[op])
    # float in_val = 2 * 8.0 * (ii - float(N) / 2.0) / float(N): double arithmetic, stored as float.
    x = (span * (ii - n / 2.0) / float(n)).astype(np.float32)
    lib = _libm()
    if op == "sigmoid":
        e = np.array([lib.expf(float(-v)) for v in x], dtype=np.float32)
        # 1.0 / (1 + expf(-x)): float sum, double quotient, returned as float.
        return (1.0 / (np.float32(1) + e).astype(np.float64)).astype(np.float32)
    return np.array([lib.tanhf(float(v)) for v in x], dtype=np.float32)


@functools.lru_cache(maxsize=64)
def _table_raw(op: str, n: int, table: str) -> np.ndarray:
    raw = _ftype(table).quantize(_float_table(op, n).astype(np.float64))
    raw.setflags(write=False)
    return raw


def activation_table(op: str, table_size: int, table: str) -> np.ndarray:
    """Raw ``table_t`` contents of hls4ml's sigmoid/tanh lookup table."""
    if op not in _TABLE_SPAN:
        raise ValueError(f"op {op!r} has no lookup table (sigmoid, tanh do)")
    return _table_raw(op, int(table_size), str(_ftype(table)))


def _wrap32(v: np.ndarray) -> np.ndarray:
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _trunc_div(a: np.ndarray, d: int) -> np.ndarray:
    """C integer division (toward zero) of int64 ``a`` by a positive int."""
    q = np.abs(a) // d
    return np.where(a < 0, -q, q)


def _table_index(x: np.ndarray, xt: FixedType, op: str, n: int) -> np.ndarray:
    """``int index = int(data * table_size / span) + span/2 * table_size / span``, clamped."""
    span = _TABLE_SPAN[op]
    if xt.width + int(n).bit_length() > 62:
        raise OverflowError(f"{op}: input type {xt} is too wide for the exact index computation")
    # data * table_size is exact; '/ span' is ap_fixed / int: an exact sdiv of the raw values
    # (dividend scaled by 2**0), i.e. truncation toward zero on the raw grid.
    q = _trunc_div(x.astype(np.int64) * n, span)
    # to_int(): truncation toward zero of the value (Cnative), then the low 32 bits.
    if xt.F > 0:
        data_round = _trunc_div(q, 1 << xt.F)
    else:
        data_round = q << (-xt.F)
    offset = (span // 2) * n // span  # unsigned arithmetic in C++; same value here
    index = _wrap32(_wrap32(data_round) + offset)
    return np.clip(index, 0, n - 1)


# -- layers --------------------------------------------------------------------------------------
def _round_grid(t: FixedType, raw: np.ndarray, src: FixedType) -> np.ndarray | None:
    """``raw`` (int64, or int32 for sources of <= 30 bits, type ``src``) rounded onto ``t``'s grid
    with ``t``'s mode, before overflow handling; None where the integer shortcut does not apply
    (then use FixedType.cast). The result keeps int32 only on the two-pass path."""
    if raw.dtype not in (np.int64, np.int32) or t.raw_dtype != np.int64 or t.is_int or src.is_int:
        return None
    shift = src.F - t.F
    if shift == 0:
        return raw
    narrow = raw.dtype == np.int32
    if 1 <= shift <= (30 if narrow else 62):
        if t.rounding in ("AP_RND", "AP_TRN") and src.width <= (30 if narrow else 62):
            # floor(raw / 2**s + 1/2) == (raw + 2**(s-1)) >> s exactly (no overflow for W <= 62,
            # or W <= 30 in int32): two passes instead of the general rounding's four.
            one = raw.dtype.type
            q = raw + one(1 << (shift - 1)) if t.rounding == "AP_RND" else raw.copy()
            q >>= one(shift)
            return q
    raw = raw.astype(np.int64, copy=False)
    if 1 <= shift <= 62:
        return _core.round_shift_int64(raw, shift, t.rounding)
    if shift < 0 and src.width - shift <= 63:
        return raw << np.int64(-shift)
    return None


def _cast(t: FixedType, raw: np.ndarray, src: FixedType) -> np.ndarray:
    """``t.cast(raw, src)`` for int64 raws already known to lie in ``src``'s range.

    The hot path of every layer: it skips FixedType.cast's range check and sign/magnitude split
    (the values come from this module's own exact arithmetic) and goes straight to the int64
    shift-rounding and overflow primitives FixedType.cast itself uses for these cases.
    """
    q = _round_grid(t, raw, src)
    if q is None:
        return t.cast(raw, src)
    return _core.fit_int64(q.astype(np.int64, copy=False), t, inplace=q is not raw)


def _dense(x: np.ndarray, xt: FixedType, layer: MlpLayer, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    wt = _ftype(layer.weight)
    at = _ftype(layer.accum)
    rt = _ftype(layer.result)
    w = np.asarray(tensors[f"{layer.name}.weight"], dtype=np.int64)  # [n_in, n_out]
    if layer.use_bias:
        bt = _ftype(layer.bias)
        acc0 = at.cast(np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64), bt)  # checked once
    else:
        acc0 = np.zeros(layer.n_out, dtype=np.int64)
    pt = mul_type(xt, wt)
    x = x.astype(np.int64, copy=False)
    shift = at.F - pt.F
    if _FAST_DENSE and shift >= 0 and at.signed and not at.is_int and pt.width <= 62 and at.width <= 62 and x.size:
        # Fast path: each product lands on the accumulator grid without rounding; when no partial
        # sum can leave accum_t's range (bound taken from this batch's own inputs) the saturating /
        # wrapping steps are all identities and the result is an exact integer matrix product.
        xmax = np.abs(x).max(axis=0).astype(np.float64)  # per input feature
        prod_bound = float((xmax @ np.abs(w).astype(np.float64)).max(initial=0.0))
        if prod_bound < 2.0**52 and (int(prod_bound) << shift) + int(np.abs(acc0).max(initial=0)) <= at.max_raw:
            # Every partial sum of integers is an integer no larger than prod_bound, so a float
            # matrix product is exact whatever order BLAS adds in: float32 below 2**24, else float64.
            ft = np.float32 if prod_bound < 2.0**24 else np.float64
            s = x.astype(ft) @ w.astype(ft)
            acc = s.astype(np.int64)
            if shift:
                acc <<= np.int64(shift)
            acc += acc0
            return _cast(rt, acc, at)
    # Exact path: cast every product into accum_t, accumulate input by input.
    n_in, n_out = w.shape
    rows = max(1, _ROW_BLOCK_ELEMS // max(1, n_in * n_out))
    out = np.empty((x.shape[0], n_out), dtype=rt.raw_dtype)
    wrap = at.overflow == "AP_WRAP" and not at.sat_bits
    # Products of <= 30 bits are computed in int32: half the memory traffic of the B x n_in x n_out pass.
    xw, ww = (x.astype(np.int32), w.astype(np.int32)) if pt.width <= 30 else (x, w)
    for r0 in range(0, x.shape[0], rows):
        xb = x[r0 : r0 + rows]
        prod = xw[r0 : r0 + rows, :, None] * ww[None, :, :]  # exact: the spec keeps x * w within 62 bits
        grid = _round_grid(at, prod, pt)
        if grid is not None and wrap:
            # Wrapping each product and every partial sum into W bits is the total modulo 2**W.
            acc = _core.fit_int64(grid.sum(axis=1, dtype=np.int64) + acc0, at, inplace=True)
        elif grid is not None:
            grid = grid.astype(np.int64, copy=False)
            terms = _core.fit_int64(grid, at, inplace=grid is not prod)  # mult[i] = (accum_t)(x * w)
            acc = np.array(np.broadcast_to(acc0, (xb.shape[0], n_out)))
            for i in range(n_in):  # acc += mult[i], saturating after every step
                acc += terms[:, i]
                acc = _core.fit_int64(acc, at, inplace=True)
        else:
            prod, _ = mul(xb[:, :, None], xt, w[None, :, :], wt)
            terms = at.cast(prod, pt)
            acc = accumulate(terms, at, at, axis=1, init=np.broadcast_to(acc0, (xb.shape[0], n_out)))
        out[r0 : r0 + rows] = _cast(rt, acc, at)
    return out


def _batchnorm(x, xt, layer, tensors):
    st = _ftype(layer.scale)
    bt = _ftype(layer.bias)
    rt = _ftype(layer.result)
    prod, pt = mul(x, xt, np.asarray(tensors[f"{layer.name}.scale"], dtype=np.int64), st)
    s, sumt = add(prod, pt, np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64), bt)
    return _cast(rt, s, sumt)


def _activation(x, xt, layer):
    rt = _ftype(layer.result)
    if layer.op == "relu":
        # (result_t)0 is 0 in every mode, so clamping first and casting once is the same.
        return _cast(rt, np.maximum(x, 0), xt)
    if layer.op == "leaky_relu":
        ptype = _ftype(layer.param)
        alpha = ptype.quantize(np.float64(layer.alpha))
        prod, pt = mul(np.broadcast_to(alpha, x.shape), ptype, x, xt)
        return np.where(x > 0, _cast(rt, x, xt), _cast(rt, prod, pt)).astype(rt.raw_dtype, copy=False)
    n = int(layer.table_size)
    table = activation_table(layer.op, n, layer.table)
    idx = _table_index(x, xt, layer.op, n)
    return _cast(rt, table[idx], _ftype(layer.table))


def forward(
    input_type: str,
    layers: Sequence[MlpLayer],
    tensors: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    trace: bool = False,
) -> np.ndarray | tuple[np.ndarray, list[tuple[str, np.ndarray, FixedType]]]:
    """Raw output of the last layer for float64 inputs ``x`` [B, F] (finite values assumed).

    With ``trace=True`` also returns ``[(layer name, raw output, type), ...]`` for every layer,
    the input quantization first (named ``"input"``).
    """
    t = _ftype(input_type)
    v = t.quantize(np.asarray(x, dtype=np.float64))
    steps = [("input", v, t)] if trace else []
    for layer in layers:
        if layer.op == "dense":
            v = _dense(v, t, layer, tensors)
        elif layer.op == "batchnorm":
            v = _batchnorm(v, t, layer, tensors)
        elif layer.op in ("relu", "leaky_relu", "sigmoid", "tanh"):
            v = _activation(v, t, layer)
        else:
            raise ValueError(f"layer {layer.name!r}: unknown op {layer.op!r}; supported: {', '.join(OPS)}")
        t = _ftype(layer.result)
        if trace:
            steps.append((layer.name, v, t))
    return (v, steps) if trace else v


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
_PLAN_MAX_ROWS = 128
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


def _plan_for(input_type: str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray]) -> _Plan | None:
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


def simulate(input_type: str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Float64 outputs [B, n_out], bit for bit what hls4ml's C-simulation ``predict`` returns.

    Small batches run the compiled plan of ``(layers, tensors)`` (built at the first call, reused
    while the same tuple and arrays are passed) when the rows allow it; the rest run :func:`forward`.
    """
    if (
        _FAST_DENSE
        and isinstance(x, np.ndarray)
        and x.ndim == 2
        and 0 < x.shape[0] <= _PLAN_MAX_ROWS
        and layers
        and x.shape[1] == layers[0].n_in
    ):
        plan = _plan_for(input_type, layers, tensors)
        if plan is not None:
            y = plan.run(x if x.dtype == np.float64 else x.astype(np.float64))
            if y is not None:
                return y
    raw = forward(input_type, layers, tensors, x)
    last = _ftype(layers[-1].result if layers else input_type)
    return last.to_float(raw)

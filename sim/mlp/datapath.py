"""The general (step-by-step) datapath of the MLP reference: layer specs, weights as hls4ml
writes them, activation tables, and :func:`forward` over raw integers. The rules it follows are
listed in :mod:`offload.sim.mlp`."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np

from offload.sim import _fixed_core as _core
from offload.sim.fixed import FixedType, accumulate, add, mul, mul_type

__all__ = ["OPS", "MlpLayer", "activation_table", "forward", "quantize_like_hls4ml"]

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

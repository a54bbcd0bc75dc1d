"""Bit-exact reference of hls4ml's io_parallel datapath for small scoring MLPs (Vitis backend),
step by step over raw integers.

Every rule below is read from the C++ hls4ml generates and compiles (``nnet_utils`` in the
installed hls4ml, ``firmware/parameters.h`` / ``defines.h`` of a written project); the proof is
``tests/hls/test_mlp_hls4ml.py``, which compares against hls4ml's own compiled C-simulation.

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

The code is that list, nothing faster: exact products with :func:`~offload.sim.fixed.mul`, every
assignment through :meth:`FixedType.cast`, the dense sum with :func:`~offload.sim.fixed.accumulate`
(one ``acc += mult`` at a time). The fast path is :mod:`offload.sim.mlp.fused`; the ``mlp`` kernel
kind chooses between the two.

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
from dataclasses import dataclass, fields
from typing import Mapping, Sequence

import numpy as np

from offload.sim.errors import FormatError
from offload.sim.fixed import FixedType, accumulate, add, mul

__all__ = ["OPS", "TABLE_SPAN", "TYPE_ROLES", "MlpLayer", "activation_table", "forward", "simulate", "quantize_like_hls4ml"]

OPS = ("dense", "batchnorm", "relu", "leaky_relu", "sigmoid", "tanh")
# Width of the table's input range: sigmoid's table spans [-8, 8), tanh's [-4, 4) (nnet_activation.h).
TABLE_SPAN = {"sigmoid": 16, "tanh": 8}
# The roles a layer's types play (hls4ml's Precision keys), in the order hls4ml lists them.
TYPE_ROLES = ("weight", "bias", "accum", "scale", "param", "table", "result")
# Products per block of rows in a dense layer: bounds the B x n_in x n_out product array's memory.
_ROW_BLOCK_ELEMS = 1 << 18


@dataclass(frozen=True)
class MlpLayer:
    """One layer of the datapath with its ap_types types (:class:`FixedType`; text such as
    ``"ap_fixed<16,6>"`` is parsed once, when the layer is built).

    ``op`` is one of :data:`OPS`. Dense layers use ``weight``/``bias``/``accum``; batchnorm
    ``scale``/``bias``; leaky_relu ``param`` (the type of ``alpha``); sigmoid/tanh ``table`` and
    ``table_size``. ``result`` is every layer's output type. ``use_bias=False`` is a Linear without
    bias (hls4ml then adds a zero ``ap_uint<1>`` bias, which changes nothing).
    """

    name: str
    op: str
    n_in: int
    n_out: int
    result: FixedType
    weight: FixedType | None = None
    bias: FixedType | None = None
    accum: FixedType | None = None
    scale: FixedType | None = None
    param: FixedType | None = None
    alpha: float | None = None
    table: FixedType | None = None
    table_size: int | None = None
    use_bias: bool = True

    def __post_init__(self) -> None:
        for role in TYPE_ROLES:
            v = getattr(self, role)
            if v is not None and not isinstance(v, FixedType):
                try:
                    t = FixedType.parse(v)
                except (TypeError, ValueError) as e:
                    raise FormatError(f"layer {self.name!r}: {role} type {v!r}: {e}") from None
                object.__setattr__(self, role, t)

    def to_json(self) -> dict:
        """The layer as JSON, each type as its ap_types text."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = str(v) if isinstance(v, FixedType) else v
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "MlpLayer":
        return cls(**dict(d))

    def types(self) -> dict[str, FixedType]:
        """The layer's types by role (only the roles it has)."""
        out = {r: getattr(self, r) for r in TYPE_ROLES if getattr(self, r) is not None}
        if self.op == "dense" and not self.use_bias:
            out.pop("bias", None)
        return out


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
    span = float(TABLE_SPAN[op])
    # float in_val = 2 * 8.0 * (ii - float(N) / 2.0) / float(N): double arithmetic, stored as float.
    x = (span * (ii - n / 2.0) / float(n)).astype(np.float32)
    lib = _libm()
    if op == "sigmoid":
        e = np.array([lib.expf(float(-v)) for v in x], dtype=np.float32)
        # 1.0 / (1 + expf(-x)): float sum, double quotient, returned as float.
        return (1.0 / (np.float32(1) + e).astype(np.float64)).astype(np.float32)
    return np.array([lib.tanhf(float(v)) for v in x], dtype=np.float32)


@functools.lru_cache(maxsize=64)
def _table_raw(op: str, n: int, table: FixedType) -> np.ndarray:
    raw = table.quantize(_float_table(op, n).astype(np.float64))
    raw.setflags(write=False)
    return raw


def activation_table(op: str, table_size: int, table: FixedType | str) -> np.ndarray:
    """Raw ``table_t`` contents of hls4ml's sigmoid/tanh lookup table."""
    if op not in TABLE_SPAN:
        raise ValueError(f"op {op!r} has no lookup table (sigmoid, tanh do)")
    return _table_raw(op, int(table_size), FixedType.parse(table))


def _wrap32(v: np.ndarray) -> np.ndarray:
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _trunc_div(a: np.ndarray, d: int) -> np.ndarray:
    """C integer division (toward zero) of int64 ``a`` by a positive int."""
    q = np.abs(a) // d
    return np.where(a < 0, -q, q)


def _table_index(x: np.ndarray, xt: FixedType, op: str, n: int) -> np.ndarray:
    """``int index = int(data * table_size / span) + span/2 * table_size / span``, clamped."""
    span = TABLE_SPAN[op]
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
def _dense(x: np.ndarray, xt: FixedType, layer: MlpLayer, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    wt, at, rt = layer.weight, layer.accum, layer.result
    w = np.asarray(tensors[f"{layer.name}.weight"], dtype=np.int64)  # [n_in, n_out]
    if layer.use_bias:
        acc0 = at.cast(np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64), layer.bias)  # acc = (accum_t)bias
    else:
        acc0 = np.zeros(layer.n_out, dtype=np.int64)
    n_in, n_out = w.shape
    rows = max(1, _ROW_BLOCK_ELEMS // max(1, n_in * n_out))
    out = np.empty((x.shape[0], n_out), dtype=rt.raw_dtype)
    for r0 in range(0, x.shape[0], rows):
        xb = x[r0 : r0 + rows]
        prod, pt = mul(xb[:, :, None], xt, w[None, :, :], wt)  # exact x * w (the spec keeps it within 62 bits)
        terms = at.cast(prod, pt)  # mult[i] = (accum_t)(x * w)
        acc = accumulate(terms, at, at, axis=1, init=np.broadcast_to(acc0, (xb.shape[0], n_out)))  # acc += mult[i]
        out[r0 : r0 + rows] = rt.cast(acc, at)  # res = (result_t)acc
    return out


def _batchnorm(x, xt, layer, tensors):
    st, bt, rt = layer.scale, layer.bias, layer.result
    prod, pt = mul(x, xt, np.asarray(tensors[f"{layer.name}.scale"], dtype=np.int64), st)
    s, sumt = add(prod, pt, np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64), bt)
    return rt.cast(s, sumt)


def _activation(x, xt, layer):
    rt = layer.result
    if layer.op == "relu":
        return np.where(x > 0, rt.cast(x, xt), 0).astype(rt.raw_dtype, copy=False)
    if layer.op == "leaky_relu":
        ptype = layer.param
        alpha = ptype.quantize(np.float64(layer.alpha))
        prod, pt = mul(np.broadcast_to(alpha, x.shape), ptype, x, xt)
        return np.where(x > 0, rt.cast(x, xt), rt.cast(prod, pt)).astype(rt.raw_dtype, copy=False)
    n = int(layer.table_size)
    table = activation_table(layer.op, n, layer.table)
    idx = _table_index(x, xt, layer.op, n)
    return rt.cast(table[idx], layer.table)


def forward(
    input_type: FixedType | str,
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
    t = FixedType.parse(input_type)
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
        t = layer.result
        if trace:
            steps.append((layer.name, v, t))
    return (v, steps) if trace else v


def simulate(input_type: FixedType | str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Float64 outputs [B, n_out] of float64 rows ``x``: :func:`forward`'s last raw values as
    doubles, bit for bit what hls4ml's C-simulation ``predict`` returns."""
    last = layers[-1].result if layers else FixedType.parse(input_type)
    return last.to_float(forward(input_type, layers, tensors, x))

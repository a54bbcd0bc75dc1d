"""The fused, compiled MLP datapath: every layer of every row in one numba call, bit-identical to
:func:`offload.sim.mlp.reference.forward` (the step-by-step definition, and the oracle in
``tests/sim/test_mlp_fused.py``).

Why: accumulators that round or saturate every product (``ap_fixed<16,6>`` everywhere) cannot be
folded into one GEMM; NumPy then materialises a B x n_in x n_out product array and walks it with
four or five passes. Here each product is rounded, fitted and accumulated in registers, vectorised
across the layer's outputs.

Why numba and not a g++-built helper: the same reasons as :mod:`offload.sim.embedding.fused`
(no compiler needed where the wheel is installed, machine code cached on disk with
``cache=True``, one Python source); and one kernel serves every model: a spec becomes a
:class:`Program` (an int64 instruction vector; the weights, biases and tables in one int64 array), so
the kernel compiles once per machine, never per model, for its two signatures (float64 rows and
outputs, :meth:`Program.run`; FP32 both ways, :meth:`Program.run_fp32`). (The int32 weights of the
layers that take int32 lanes are a third array.)

Integer arithmetic throughout. Every cast ``T dst = (T)src`` (product into ``accum_t``, ``accum_t``
into ``result_t``, ...) is one branch-free rounding step and one fit::

    v <<= ls;  q = (v + c0 + ((v >> 63) & c1) + ((v >> s) & conv)) >> s;  fit(q)

``c0`` / ``c1`` / ``conv`` encode the seven quantization modes (floor of ``v / 2**s`` plus a bias:
``2**(s-1)`` for ties up, ``2**(s-1) - 1`` for ties down, the sign or the parity of the floor to
pick the others). Building a program bounds every intermediate value from the types' ranges and the
weights and drops fits that can never trigger; a layer whose bounds leave int64 (``W > 62``,
``ap_int`` targets, ``AP_WRAP`` with saturation bits, a table index past 62 bits) makes the whole
model unsupported: :func:`program_for` returns None and the ``mlp`` kernel kind runs the reference
(same results, its speed): the one fallback.

Dense layers run one of four inner loops: ``plain`` (products exact on the accumulator grid, no
partial sum can leave it: one exact dot product, shifted once), ``rounded`` (each product rounded,
the sum provably in range, or wrapped once at the end: wrapping every product and every partial sum
into W bits is the total modulo 2**W), ``sat`` (``AP_SAT`` / ``AP_SAT_SYM``: clamp every product
and every partial sum), ``satz`` (``AP_SAT_ZERO``). A layer whose accumulator is ignored (exact
accumulation, as a distributed-arithmetic strategy does) is a ``plain`` layer with a wide enough
``accum_t``. Each loop runs in int32 lanes (16 to an AVX-512 vector, the weights stored once as
int32 in :attr:`Program.data32`) where the program's bounds prove every product and partial sum
exact in int32, or the accumulator wraps into at most 32 bits (int32's own wrap is then exact), and
in int64 lanes otherwise: :func:`_lane` decides, in one place. Rows go through the layers in blocks
of four, so each weight loaded serves four rows; the last rows of a batch go one at a time.

Threads: one (hls4ml's C-simulation is single-threaded, and the service already runs requests
in parallel). JIT: one kernel for every model; :func:`warm_up` compiles both its signatures or loads them from numba's
disk cache (``__pycache__`` beside this file, or numba's user-wide cache directory where that is not
writable) and returns the seconds; :func:`jit_seconds` totals them. The ``mlp`` kernel kind's
``prepare`` calls it, so a device's ``load()`` (the service's model load among them) pays the JIT,
never a request.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from offload.sim.fixed import FixedType, add_type, mul_type
from offload.sim.mlp.reference import TABLE_SPAN, MlpLayer, activation_table

try:  # a core dependency; missing only in a broken install, where the reference still works
    import numba
except ImportError:  # pragma: no cover - exercised through _NUMBA
    numba = None

__all__ = ["Program", "compile_program", "program_for", "warm_up", "jit_seconds", "available"]

# Replaced by None in tests to force the reference.
_NUMBA = numba
_warned = False
_jit_total = [0.0]

_LIM = 1 << 61  # every intermediate value is proven below this: sums of two stay inside int64
_ROUND = {"AP_TRN": 0, "AP_TRN_ZERO": 1, "AP_RND": 2, "AP_RND_MIN_INF": 3, "AP_RND_ZERO": 4, "AP_RND_INF": 5, "AP_RND_CONV": 6}

# One cast block: left shift, right shift, rounding constants, fit kind and its constants.
_LS, _S, _C0, _C1, _CONV, _OVF, _LO, _HI, _OFF, _MASK = range(10)
_CAST_LEN = 10
_FIT_NONE, _FIT_WRAP, _FIT_SAT, _FIT_SATZ = range(4)
# One layer record: op, sizes, offsets, dense loop, five op-specific values (a dense layer's
# product rounding LS, S, C0, C1, CONV), a dense layer's lanes (_LANE32: its weights at _R_W in
# ``data32`` and its loop in int32; _LANE64: in ``data``, int64), then up to two cast blocks (A, B).
_R_OP, _R_NIN, _R_NOUT, _R_W, _R_B, _R_MODE, _R_K0, _R_K1, _R_K2, _R_K3, _R_K4, _R_LANE = range(12)
_R_A = 12
_R_B2 = _R_A + _CAST_LEN
_REC = _R_B2 + _CAST_LEN
_OP_DENSE, _OP_BN, _OP_RELU, _OP_LEAKY, _OP_TABLE = range(5)
_D_PLAIN, _D_ROUNDED, _D_SAT, _D_SATZ = range(4)
_LANE64, _LANE32 = range(2)
_LIM32 = 1 << 31  # a value below this in magnitude is exact in an int32 lane
# The kernel's row blocks (tuples: their length is a compile-time constant, see the dense loops).
_BLOCK, _ONE = (0, 1, 2, 3), (0,)
# Header: layer count, input rounding mode, widest layer, then the input fit block.
_H_N, _H_RMODE, _H_WIDE = range(3)
_H_FIT = 3
_HEAD = _H_FIT + _CAST_LEN


def available() -> bool:
    """Whether the compiled path can run (numba importable)."""
    return _NUMBA is not None


def jit_seconds() -> float:
    """Seconds spent so far compiling the kernel or loading it from numba's disk cache."""
    return _jit_total[0]


class _Unsupported(Exception):
    pass


# ------------------------------------------------------------------------------ building programs
def _bits_ok(*values: int) -> None:
    for v in values:
        if abs(v) >= _LIM:
            raise _Unsupported(f"an intermediate value reaches {abs(v)} >= 2**61")


def _type_ok(t: FixedType) -> None:
    if t.is_int or t.width > 62 or (t.overflow == "AP_WRAP" and t.sat_bits):
        raise _Unsupported(f"{t}: outside the compiled path's int64 casts")


def _fit_block(t: FixedType, lo: int, hi: int) -> tuple[list[int], int, int]:
    """Fit part of a cast block for integers in [lo, hi]; (fields OVF..MASK, new lo, new hi)."""
    tlo, thi = t.min_raw, t.max_raw
    if tlo <= lo and hi <= thi:
        return [_FIT_NONE, tlo, thi, 0, 0], lo, hi
    o = t.overflow
    if o == "AP_WRAP":
        off = 1 << (t.width - 1) if t.signed else 0
        return [_FIT_WRAP, tlo, thi, off, (1 << t.width) - 1], tlo, thi
    if o == "AP_SAT_SYM" and t.signed and t.width > 1:
        tlo += 1
    if o in ("AP_SAT", "AP_SAT_SYM"):
        return [_FIT_SAT, tlo, thi, 0, 0], max(lo, tlo), min(hi, thi)
    return [_FIT_SATZ, tlo, thi, 0, 0], min(max(lo, tlo), 0), max(min(hi, thi), 0)


def _round_block(mode: str, ls: int, s: int) -> list[int]:
    """Rounding part (LS, S, C0, C1, CONV): ``floor((v + bias) / 2**s)`` equals ``mode``'s rounding
    of ``v / 2**s`` with bias ``c0 + (c1 if v < 0) + (conv & floor(v / 2**s))``."""
    if s == 0:
        return [ls, 0, 0, 0, 0]
    half = 1 << (s - 1)
    c0, c1, conv = {
        "AP_TRN": (0, 0, 0),
        "AP_TRN_ZERO": (0, (1 << s) - 1, 0),  # negatives: ceiling
        "AP_RND": (half, 0, 0),  # ties up
        "AP_RND_MIN_INF": (half - 1, 0, 0),  # ties down
        "AP_RND_ZERO": (half - 1, 1, 0),  # ties down, up for negatives
        "AP_RND_INF": (half, -1, 0),  # ties up, down for negatives
        "AP_RND_CONV": (half - 1, 0, 1),  # ties up from odd floors only
    }[mode]
    return [ls, s, c0, c1, conv]


def _cast_block(dst: FixedType, src: FixedType, lo: int, hi: int) -> tuple[list[int], int, int]:
    """``_cast(dst, v, src)`` for integers v in [lo, hi]: (block, new lo, new hi)."""
    _type_ok(dst)  # the source matters only through its fraction bits and the bounds
    shift = src.F - dst.F
    ls, s = max(-shift, 0), max(shift, 0)
    if s > 62 or ls > 62:
        raise _Unsupported(f"{src} -> {dst}: shift {shift}")
    _bits_ok(lo << ls, hi << ls, (max(-lo, hi) << ls) + (1 << s))
    rnd = _round_block(dst.rounding, ls, s)
    lo2, hi2 = (lo << ls) >> s, ((hi << ls) >> s) + (1 if s else 0)
    fit, lo2, hi2 = _fit_block(dst, lo2, hi2)
    return rnd + fit, lo2, hi2


_F32 = np.dtype(np.float32)  # native byte order


@dataclass(frozen=True)
class Program:
    """One (input type, layers, tensors) as the kernel's instruction vector and data."""

    prog: np.ndarray  # int64: header, then one record per layer
    data: np.ndarray  # int64: biases, tables, scales, the weights of int64-lane layers, concatenated
    in_scale: float  # 2**F of the input type
    out_scale: float  # 2**-F of the last type
    n_out: int
    arrays: tuple  # (name, array, snapshot or None): see _current
    n_in: int  # features a row: the kernel's buffers are sized from the program, not from x
    data32: np.ndarray  # int32: the weights of int32-lane layers, concatenated

    def __post_init__(self) -> None:
        # The compiled entry points take these as their signature says, unchecked (see _ENTRY).
        for name, dt in (("prog", np.int64), ("data", np.int64), ("data32", np.int32)):
            a = getattr(self, name)
            if not (isinstance(a, np.ndarray) and a.dtype == dt and a.ndim == 1 and a.flags.c_contiguous and a.flags.aligned):
                raise TypeError(f"Program.{name}: expected a C-contiguous 1-D {np.dtype(dt).name} array")

    def run(self, x: np.ndarray) -> np.ndarray | None:
        """Float64 outputs of float64 rows ``x`` [B, F]; None where a value needs the bit-level
        quantization (|x * 2**F| >= 2**62, inf, NaN): then take the reference."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_in:
            raise ValueError(f"x: expected rows [B, {self.n_in}], got shape {x.shape}")
        if not (x.flags.writeable and x.flags.aligned):
            x = x.copy()  # a read-only or misaligned array is another numba type: a compile, on a request
        out = np.empty((x.shape[0], self.n_out), dtype=np.float64)
        if not _ENTRY.get("d", _run_rows)(x, self.prog, self.data, self.data32, self.in_scale, self.out_scale, out):
            return None
        return out

    def run_fp32(self, x: np.ndarray) -> np.ndarray | None:
        """:meth:`run` of rows holding FP32 values, its outputs rounded to FP32 (float32 [B, n_out],
        bit for bit ``run(x).astype(np.float32)``) in the kernel's own pass; None as run.

        For a server whose wire type is FP32 both ways: a writable, aligned, C-contiguous native float32 ``x`` is read as it
        is (each value widens exactly to the float64 that ``run`` would quantize) and the float64
        output of each row is rounded as it is stored, so the two NumPy conversions a batch of one
        row otherwise costs are gone. Any other ``x`` takes :meth:`run` and a conversion: only these two signatures are compiled.
        The rows' checks are :meth:`bind_fp32`'s, the one place they are written.
        """

        def general(rows: np.ndarray) -> np.ndarray | None:
            # Another dtype (a byte-swapped float32 among them: numba refuses it), a read-only or
            # misaligned array (another numba type, another compile), or values past the float
            # quantization: run(), exact for any values (None for those), and it refuses a wrong shape.
            y = self.run(rows)
            return None if y is None else y.astype(np.float32)

        return self.bind_fp32(general)(x)

    def bind_fp32(self, general: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        """:meth:`run_fp32` as one prepared call that always answers, for a caller with an exact
        path of its own: the rows the compiled pass does not take (another dtype, layout or shape,
        no rows, values past the float quantization) go to ``general(x)``, which must give what the
        compiled pass would. ``x`` is an ndarray.

        One frame between the caller and the compiled kernel, its arguments held in the closure:
        a scoring service's one-row call pays for every frame, attribute and check on its way.

        Example::

            score = prog.bind_fp32(lambda x: simulate(t, layers, tensors, x.astype(np.float64)).astype(np.float32))
            y = score(rows)
        """
        prog, data, data32, in_scale, out_scale, n_in, n_out = self.prog, self.data, self.data32, self.in_scale, self.out_scale, self.n_in, self.n_out
        entry = _ENTRY.get("f", _run_rows)  # warm_up ran at the kind's prepare; else the dispatcher
        empty, f32 = np.empty, _F32

        def run(x: np.ndarray) -> np.ndarray:
            # The rows the FP32 signature takes, cheapest test first; "is": a native float32
            # array's dtype is NumPy's one instance (an equal dtype that is not takes the general
            # path: same answer).
            if x.dtype is f32 and x.ndim == 2 and x.shape[1] == n_in and x.shape[0]:
                flags = x.flags
                if flags.c_contiguous and flags.writeable and flags.aligned:
                    out = empty((x.shape[0], n_out), f32)
                    if entry(x, prog, data, data32, in_scale, out_scale, out):
                        return out
            return general(x)

        return run


def compile_program(input_type: FixedType | str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray]) -> Program | None:
    """The program of a model, or None where the compiled path does not apply (see the module doc)."""
    try:
        return _compile(FixedType.parse(input_type), layers, tensors)
    except _Unsupported:
        return None


def _compile(input_type: FixedType, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray]) -> Program:
    if not layers:
        raise _Unsupported("no layers")
    t = input_type
    _type_ok(t)
    if not 0 <= t.F <= 1000 or not -1000 <= layers[-1].result.F <= 1000:
        raise _Unsupported("fraction bits out of range")
    head = np.zeros(_HEAD, dtype=np.int64)
    head[_H_N] = len(layers)
    head[_H_RMODE] = _ROUND[t.rounding]
    fit, lo, hi = _fit_block(t, -(1 << 62), 1 << 62)
    head[_H_FIT + _OVF:_H_FIT + _CAST_LEN] = fit
    wide = layers[0].n_in
    data: list[np.ndarray] = []
    data32: list[np.ndarray] = []
    size = [0, 0]

    def put(a: np.ndarray, lane: int = _LANE64) -> int:
        """Offset of ``a`` in ``data`` (_LANE64) or ``data32`` (_LANE32, every value checked)."""
        store, dt = (data32, np.int32) if lane == _LANE32 else (data, np.int64)
        off = size[lane]
        a = np.ascontiguousarray(a, dtype=np.int64).ravel()
        if lane == _LANE32 and a.size and int(np.abs(a).max()) >= _LIM32:
            raise AssertionError("an int32-lane weight does not fit int32")  # _lanes is wrong
        store.append(a.astype(dt))
        size[lane] += a.size
        return off

    recs = []
    for layer in layers:
        r = np.zeros(_REC, dtype=np.int64)
        r[_R_NIN], r[_R_NOUT] = layer.n_in, layer.n_out
        wide = max(wide, layer.n_in, layer.n_out)
        if layer.op == "dense":
            lo, hi = _dense(r, layer, t, lo, hi, tensors, put)
        elif layer.op == "batchnorm":
            lo, hi = _batchnorm(r, layer, t, lo, hi, tensors, put)
        elif layer.op in ("relu", "leaky_relu"):
            lo, hi = _rect(r, layer, t, lo, hi)
        elif layer.op in TABLE_SPAN:
            lo, hi = _table(r, layer, t, lo, hi, put)
        else:
            raise _Unsupported(f"op {layer.op!r}")
        recs.append(r)
        t = layer.result
    head[_H_WIDE] = wide
    arrays = []
    names = (f"{layer.name}.{role}" for layer in layers for role in ("weight", "bias", "scale"))
    for name in sorted(n for n in names if n in tensors):
        a = tensors[name]
        if not isinstance(a, np.ndarray):
            raise _Unsupported(f"{name} is not an ndarray")
        arrays.append((name, a, None if _frozen(a) else a.tobytes()))
    return Program(
        np.concatenate([head, *recs]),
        np.concatenate(data) if data else np.zeros(1, dtype=np.int64),
        float(2.0 ** input_type.F),
        float(2.0 ** -t.F),  # t: the last layer's result type
        layers[-1].n_out,
        tuple(arrays),
        layers[0].n_in,
        np.concatenate(data32) if data32 else np.zeros(1, dtype=np.int32),
    )


def _dense(r, layer: MlpLayer, xt: FixedType, lo: int, hi: int, tensors, put) -> tuple[int, int]:
    """A dense record: the weights (pre-shifted onto the accumulator grid where no product is
    rounded), the bias in accum_t, the product rounding (K0..K4), the accumulator's own fit (A) and
    the cast into result_t (B). The loop follows from the bounds: an exact accumulation (no
    rounding, no fit: what a strategy that ignores accum_t computes) is ``_D_PLAIN`` with A's fit
    ``_FIT_NONE`` and B cast from the exact sum's grid."""
    wt, at, rt = layer.weight, layer.accum, layer.result
    for tt in (wt, at, rt) + ((layer.bias,) if layer.use_bias else ()):
        _type_ok(tt)
    w = np.asarray(tensors[f"{layer.name}.weight"], dtype=np.int64)
    if layer.use_bias:
        acc0 = at.cast(np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64), layer.bias)
    else:
        acc0 = np.zeros(layer.n_out, dtype=np.int64)
    pt = mul_type(xt, wt)
    shift = at.F - pt.F  # > 0: products land on the accumulator grid shifted left; < 0: rounded
    ls, s = max(shift, 0), max(-shift, 0)
    if ls > 62 or s > 62:
        raise _Unsupported(f"{layer.name}: product to accumulator shift {shift}")
    xabs = max(-lo, hi)
    wabs = int(np.abs(w).max(initial=0))
    babs = int(np.abs(acc0).max(initial=0))
    pb = xabs * wabs
    _bits_ok(pb, (pb << ls) + (1 << s))
    tb = ((pb << ls) >> s) + 1  # bound on one rounded product
    colsum = int(np.abs(w).sum(axis=0).max(initial=0)) * xabs  # bound on a partial sum of products
    r[_R_OP] = _OP_DENSE
    r[_R_B] = put(acc0)
    rnd = _round_block(at.rounding, ls, s)
    if s == 0:
        _bits_ok(colsum << ls)
        m = (colsum << ls) + babs
    else:
        m = layer.n_in * tb + babs
    _bits_ok(m)
    fit, alo, ahi = _fit_block(at, -m, m)
    if fit[0] == _FIT_NONE or fit[0] == _FIT_WRAP:
        # No partial sum leaves accum_t (no fit at all), or accum_t wraps: then every per-step fit
        # together is one wrap of the total. Products that need no rounding: the weights carry
        # the left shift (sum of shifted products == shifted sum; bounded above).
        r[_R_MODE] = _D_PLAIN if s == 0 else _D_ROUNDED
        if s == 0:
            w = w << ls
            rnd = _round_block(at.rounding, 0, 0)
    else:
        # Saturating accumulators: clamp (or zero) every product and every partial sum.
        r[_R_MODE] = _D_SAT if fit[0] == _FIT_SAT else _D_SATZ
        _bits_ok(at.min_raw * 2, at.max_raw * 2, tb)
        alo, ahi = fit[1], fit[2]
    lane = _lane(int(r[_R_MODE]), fit[0], at.width, alo, ahi, xabs, int(np.abs(w).max(initial=0)), babs, pb, ls, s, m)
    r[_R_LANE] = lane
    r[_R_W] = put(w, lane)
    r[_R_K0:_R_K4 + 1] = rnd
    r[_R_A:_R_A + _CAST_LEN] = [0, 0, 0, 0, 0] + fit  # the accumulator's fit alone
    block, lo2, hi2 = _cast_block(rt, at, alo, ahi)
    r[_R_B2:_R_B2 + _CAST_LEN] = block
    return lo2, hi2


def _lane(mode: int, fit: int, width: int, alo: int, ahi: int, xabs: int, wabs: int, babs: int, pb: int, ls: int, s: int, m: int) -> int:
    """_LANE32 where every value a dense loop forms is exact in int32 arithmetic, else _LANE64.

    Inputs, stored weights (pre-shift included) and biases must fit. A ``plain`` or ``rounded``
    accumulation is then exact if no partial sum can leave int32 (``m``, the bound on any partial
    sum with the bias, below 2**31), or if the accumulator wraps into ``width`` <= 32 bits: int32
    sums wrap modulo 2**32, and the wrap into W <= 32 bits depends on the total modulo 2**W only
    (the ``plain`` products, exact integers, may wrap too). A rounded product is shifted right,
    which does not commute with the wrap, so before its shift it must be exact: ``(pb << ls) +
    2**s`` bounds it with its rounding bias. ``sat`` / ``satz`` clamp every partial sum into
    [alo, ahi], so a clamped sum plus a clamped product, in [2 * alo, 2 * ahi], must fit.
    """
    if max(xabs, wabs, babs) >= _LIM32:
        return _LANE64
    wraps = fit == _FIT_WRAP and width <= 32
    if mode == _D_PLAIN:
        ok = m < _LIM32 or wraps
    else:
        ok = (pb << ls) + (1 << s) < _LIM32
        if mode == _D_ROUNDED:
            ok = ok and (m < _LIM32 or wraps)
        else:
            ok = ok and -_LIM32 <= 2 * alo and 2 * ahi < _LIM32
    return _LANE32 if ok else _LANE64


def _batchnorm(r, layer: MlpLayer, xt: FixedType, lo: int, hi: int, tensors, put) -> tuple[int, int]:
    st, bt, rt = layer.scale, layer.bias, layer.result
    for tt in (st, bt, rt):
        _type_ok(tt)
    scale = np.asarray(tensors[f"{layer.name}.scale"], dtype=np.int64)
    bias = np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64)
    pt = mul_type(xt, st)
    sumt = add_type(pt, bt)
    up_p, up_b = sumt.F - pt.F, sumt.F - bt.F  # both >= 0: the sum has the finer grid
    if up_p > 62 or up_b > 62:
        raise _Unsupported(f"{layer.name}: batchnorm sum type {sumt}")
    pm = max(-lo, hi) * int(np.abs(scale).max(initial=0))
    bm = int(np.abs(bias).max(initial=0))
    _bits_ok(pm << up_p, bm << up_b)
    m = (pm << up_p) + (bm << up_b)
    _bits_ok(m)
    r[_R_OP] = _OP_BN
    r[_R_W] = put(scale)
    r[_R_B] = put(bias << up_b)
    r[_R_K0] = up_p
    block, lo2, hi2 = _cast_block(rt, sumt, -m, m)
    r[_R_B2:_R_B2 + _CAST_LEN] = block
    return lo2, hi2


def _rect(r, layer: MlpLayer, xt: FixedType, lo: int, hi: int) -> tuple[int, int]:
    rt = layer.result
    if layer.op == "relu":
        r[_R_OP] = _OP_RELU
        block, lo2, hi2 = _cast_block(rt, xt, max(lo, 0), max(hi, 0))
        r[_R_B2:_R_B2 + _CAST_LEN] = block
        return lo2, hi2
    ptype = layer.param
    _type_ok(ptype)
    alpha = int(ptype.quantize(np.float64(layer.alpha)))
    pt = mul_type(ptype, xt)
    am = abs(alpha) * max(-lo, hi)
    _bits_ok(am)
    r[_R_OP] = _OP_LEAKY
    r[_R_K0] = alpha
    pos, plo, phi = _cast_block(rt, xt, lo, hi)
    neg, nlo, nhi = _cast_block(rt, pt, -am, am)
    r[_R_A:_R_A + _CAST_LEN] = neg
    r[_R_B2:_R_B2 + _CAST_LEN] = pos
    return min(plo, nlo), max(phi, nhi)


def _table(r, layer: MlpLayer, xt: FixedType, lo: int, hi: int, put) -> tuple[int, int]:
    rt, tt = layer.result, layer.table
    _type_ok(rt)
    _type_ok(tt)
    n, span = int(layer.table_size), TABLE_SPAN[layer.op]
    if xt.width + n.bit_length() > 62:
        raise _Unsupported(f"{layer.name}: table index of {xt}")  # forward raises its OverflowError
    f = xt.F
    # int(x * N / span): x * N exact, then truncation toward zero (span a power of two).
    q = (max(-lo, hi) * n) >> (span.bit_length() - 1)
    if f < 0:
        _bits_ok(q << -f)
    if f > 62:
        raise _Unsupported(f"{layer.name}: {xt} has {f} fraction bits")
    table = rt.cast(activation_table(layer.op, n, layer.table).astype(np.int64), tt)
    r[_R_OP] = _OP_TABLE
    r[_R_W] = put(table)
    r[_R_K0] = n
    r[_R_K1] = span.bit_length() - 1
    r[_R_K2] = f
    r[_R_K3] = (span // 2) * n // span
    return int(table.min()), int(table.max())


# The kernel's two compiled signatures (see warm_up), called without numba's dispatcher. The
# dispatcher types every argument on every call (six here) to pick the overload: ~0.2 us warm,
# ~3 us once its code has left the caches (a server at one connection). An entry point reads its arguments as its signature says, checking neither dtype nor
# rank, so Program's callers pass exactly these types: checked where they are not certain
# (bind_fp32's flags, run's conversion, the program's own vectors when it is made). Filled by
# warm_up; until then the dispatcher serves.
_ENTRY: dict[str, object] = {}


# ---------------------------------------------------------------------------------------- cache
_PROGRAMS: dict[tuple[int, int], tuple] = {}
_CACHE_SIZE = 64


def _frozen(a: np.ndarray) -> bool:
    """No writer can reach ``a``: it and every array down to the one owning the memory are
    read-only (the sim device's resident copies: aligned views of a private read-only buffer)."""
    while True:
        if a.flags.writeable:
            return False
        if a.flags.owndata:
            return True
        if not isinstance(a.base, np.ndarray):
            return False  # memory owned by a foreign object (mmap, buffer): may change under us
        a = a.base


def _current(arrays, tensors) -> bool:
    for name, arr, snap in arrays:
        if tensors.get(name) is not arr:
            return False
        # A read-only array that owns its memory (the sim device's resident copies) is taken as
        # constant; anything else is compared with the contents the program was built from.
        if snap is not None and arr.tobytes() != snap:
            return False
    return True


def program_for(input_type: FixedType | str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray]) -> Program | None:
    """The cached program of this (layers tuple, tensors mapping), rebuilt when either changed;
    None where numba is missing or the model leaves the compiled path."""
    if _NUMBA is None:
        _warn_once()
        return None
    if not isinstance(layers, tuple) or not layers:
        return None  # a list may change under the cache
    key = (id(layers), id(tensors))
    hit = _PROGRAMS.get(key)
    if hit is not None:
        it, lay, ten, prog = hit
        if it == input_type and lay is layers and ten is tensors and (prog is None or _current(prog.arrays, tensors)):
            return prog
    # An unsupported model is remembered as None (the caller runs the reference, which checks
    # the weights itself) until another layers tuple or tensors mapping comes.
    prog = compile_program(input_type, layers, tensors)
    if len(_PROGRAMS) >= _CACHE_SIZE:
        _PROGRAMS.pop(next(iter(_PROGRAMS)), None)
    _PROGRAMS[key] = (input_type, layers, tensors, prog)
    return prog


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn("offload.sim.mlp.fused: numba is not installed; using the reference "
                      "(slower, same results)", RuntimeWarning, stacklevel=3)


def warm_up() -> float:
    """Compile the kernel's two signatures (float64 rows in and out, :meth:`Program.run`; FP32
    both ways, :meth:`Program.run_fp32`), or load them from numba's disk cache, and keep their entry
    points for programs to call without the dispatcher (``_ENTRY``); the seconds it took (0 when
    both were already loaded or numba is missing). One kernel serves every model."""
    if _NUMBA is None:
        return 0.0
    known = len(_run_rows.signatures)
    t0 = time.perf_counter()
    layer = MlpLayer("w", "dense", 1, 1, "ap_fixed<8,4>", weight="ap_fixed<8,4>", bias="ap_fixed<8,4>", accum="ap_fixed<8,4,AP_RND,AP_SAT>")
    p = compile_program("ap_fixed<8,4>", (layer,), {"w.weight": np.ones((1, 1), dtype=np.int64), "w.bias": np.zeros(1, dtype=np.int64)})
    p.run(np.zeros((1, 1)))
    p.run_fp32(np.zeros((1, 1), dtype=np.float32))
    vec, vec32 = numba.types.Array(numba.int64, 1, "C"), numba.types.Array(numba.int32, 1, "C")
    for code, dt in (("d", numba.float64), ("f", numba.float32)):
        rows = numba.types.Array(dt, 2, "C")
        _ENTRY[code] = _run_rows.get_overload((rows, vec, vec, vec32, numba.float64, numba.float64, rows))
    if len(_run_rows.signatures) == known:  # both were there: nothing compiled or loaded
        return 0.0
    dt = time.perf_counter() - t0
    _jit_total[0] += dt
    return dt


# ---------------------------------------------------------------------------------- the kernel
# Module-level functions (not closures): numba's disk cache keys a closure by its pickled cells,
# which differ in every process.
if numba is not None:

    @numba.njit(nogil=True)
    def _cast_into(src, dst, nr, n, p, o):
        """``dst[:nr, :n] = cast(src[:nr, :n])`` with block ``o``: the parameters are read into locals
        first (``p`` is an int64 array like ``dst``, so LLVM could not hoist them out of the loop) and
        each fit kind has its own loop, so every loop vectorises."""
        ls, s, c0, c1, conv = p[o + _LS], p[o + _S], p[o + _C0], p[o + _C1], p[o + _CONV]
        k, lo, hi, off, mask = p[o + _OVF], p[o + _LO], p[o + _HI], p[o + _OFF], p[o + _MASK]
        for r in range(nr):
            a = src[r]
            b = dst[r]
            if k == _FIT_NONE:
                for j in range(n):
                    v = a[j] << ls
                    b[j] = (v + c0 + ((v >> 63) & c1) + ((v >> s) & conv)) >> s
            elif k == _FIT_WRAP:
                for j in range(n):
                    v = a[j] << ls
                    b[j] = (((v + c0 + ((v >> 63) & c1) + ((v >> s) & conv)) >> s) + off & mask) - off
            elif k == _FIT_SAT:
                for j in range(n):
                    v = a[j] << ls
                    b[j] = min(max((v + c0 + ((v >> 63) & c1) + ((v >> s) & conv)) >> s, lo), hi)
            else:
                for j in range(n):
                    v = a[j] << ls
                    q = (v + c0 + ((v >> 63) & c1) + ((v >> s) & conv)) >> s
                    b[j] = 0 if (q < lo or q > hi) else q

    @numba.njit(inline="always")
    def _quantize(y, mode):
        """Integer-valued float: ``y`` (exact, |y| < 2**62) rounded with ``mode`` (fixed.round_float)."""
        if mode == 0:
            return np.floor(y)
        if mode == 1:
            return np.trunc(y)
        r = np.rint(y)
        if mode == 6:
            return r
        d = y - r
        up = d == 0.5
        down = d == -0.5
        if mode == 2:
            return r + 1.0 if up else r
        if mode == 3:
            return r - 1.0 if down else r
        if mode == 4:
            if up and r < 0:
                return r + 1.0
            if down and r > 0:
                return r - 1.0
            return r
        if up and r >= 0:
            return r + 1.0
        if down and r <= 0:
            return r - 1.0
        return r

    # The dense loops: separate functions (numba-level inlining of these into the kernel made
    # LLVM give up on vectorising them), ``w`` a 2-D view so every index is provably non-negative
    # (a flat ``w[base + j]`` keeps numba's negative-index fix-up, which LLVM turns into a gather).
    # Vectorised across the outputs j, for a block of rows at once: ``rows`` is a tuple whose
    # length (a compile-time constant: (0, 1, 2, 3) or (0,)) is the block's row count, so the
    # innermost loop over the rows unrolls and each weight loaded serves every row of the block.
    # ``lane`` (np.int32 or np.int64, the arrays' dtype) is the arithmetic's width: numba computes
    # int32 operands in int64, and wrapping each step back into ``lane`` (exact: the program's
    # bounds, see _lane) lets LLVM keep 16 lanes a vector; ``sm`` (31 or 63, folded to a constant)
    # keeps every shift count provably below the lane's width, which that narrowing needs too.
    # (Skipping the zero inputs a ReLU leaves costs more in mispredicted branches than the
    # products it saves.)
    @numba.njit(nogil=True)
    def _dense_plain(x, w, acc, rows, lane):
        n_in, n_out = w.shape
        for i in range(n_in):
            for j in range(n_out):
                wv = w[i, j]
                for r in range(len(rows)):
                    acc[r, j] += lane(x[r, i] * wv)

    @numba.njit(nogil=True)
    def _dense_rounded(x, w, acc, ls, s, c0, c1, conv, rows, lane):
        n_in, n_out = w.shape
        sm = 31 if lane(4294967296) == 0 else 63
        ls, s = ls & sm, s & sm
        if c1 == 0 and conv == 0:  # AP_TRN, AP_RND, AP_RND_MIN_INF: a constant bias
            for i in range(n_in):
                for j in range(n_out):
                    wv = w[i, j]
                    for r in range(len(rows)):
                        acc[r, j] += lane(lane(lane(x[r, i] * wv) << ls) + c0) >> s
            return
        for i in range(n_in):
            for j in range(n_out):
                wv = w[i, j]
                for r in range(len(rows)):
                    v = lane(lane(x[r, i] * wv) << ls)
                    acc[r, j] += lane(v + c0 + ((v >> sm) & c1) + ((v >> s) & conv)) >> s

    @numba.njit(nogil=True)
    def _dense_sat(x, w, acc, ls, s, c0, c1, conv, lo, hi, rows, lane):
        n_in, n_out = w.shape
        sm = 31 if lane(4294967296) == 0 else 63
        ls, s = ls & sm, s & sm
        for i in range(n_in):
            for j in range(n_out):
                wv = w[i, j]
                for r in range(len(rows)):
                    v = lane(lane(x[r, i] * wv) << ls)
                    t = lane(lane(v + c0 + ((v >> sm) & c1) + ((v >> s) & conv)) >> s)
                    t = min(max(t, lo), hi)
                    acc[r, j] = min(max(lane(acc[r, j] + t), lo), hi)

    @numba.njit(nogil=True)
    def _dense_satz(x, w, acc, ls, s, c0, c1, conv, lo, hi, rows, lane):
        n_in, n_out = w.shape
        sm = 31 if lane(4294967296) == 0 else 63
        ls, s = ls & sm, s & sm
        zero = lane(0)
        for i in range(n_in):
            for j in range(n_out):
                wv = w[i, j]
                for r in range(len(rows)):
                    v = lane(lane(x[r, i] * wv) << ls)
                    t = lane(lane(v + c0 + ((v >> sm) & c1) + ((v >> s) & conv)) >> s)
                    if t < lo or t > hi:
                        t = zero
                    a = lane(acc[r, j] + t)
                    acc[r, j] = zero if (a < lo or a > hi) else a

    # One output: a dot product per row, vectorised over the inputs i.
    @numba.njit(nogil=True)
    def _dot_plain(x, w, n, lane):
        t = lane(0)
        for i in range(n):
            t = lane(t + lane(x[i] * w[i]))
        return t

    @numba.njit(nogil=True)
    def _dot_rounded(x, w, n, ls, s, c0, c1, conv, lane):
        sm = 31 if lane(4294967296) == 0 else 63
        ls, s = ls & sm, s & sm
        t = lane(0)
        for i in range(n):
            v = lane(lane(x[i] * w[i]) << ls)
            t = lane(t + (lane(v + c0 + ((v >> sm) & c1) + ((v >> s) & conv)) >> s))
        return t

    @numba.njit(nogil=True)
    def _loop(x, w, acc, mode, ls, s, c0, c1, conv, lo, hi, rows, lane):
        if mode == _D_PLAIN:
            _dense_plain(x, w, acc, rows, lane)
        elif mode == _D_ROUNDED:
            _dense_rounded(x, w, acc, ls, s, c0, c1, conv, rows, lane)
        elif mode == _D_SAT:
            _dense_sat(x, w, acc, ls, s, c0, c1, conv, lo, hi, rows, lane)
        else:
            _dense_satz(x, w, acc, ls, s, c0, c1, conv, lo, hi, rows, lane)

    @numba.njit(nogil=True)
    def _products(x, w, acc, n_in, n_out, p, o, nr, lane):
        """acc[r, :n_out] += the dense products of x[r, :n_in] and ``w`` (flat, n_in x n_out) for
        the block's ``nr`` rows (4 or 1), in ``lane`` arithmetic, with the record's loop."""
        mode = p[o + _R_MODE]
        # In ``lane`` (exact: see _lane), so that LLVM can keep the loops' arithmetic in it.
        ls, s, c0, c1, conv = lane(p[o + _R_K0]), lane(p[o + _R_K1]), lane(p[o + _R_K2]), lane(p[o + _R_K3]), lane(p[o + _R_K4])
        if n_out == 1 and mode <= _D_ROUNDED:
            for r in range(nr):
                if mode == _D_PLAIN:
                    acc[r, 0] += _dot_plain(x[r], w, n_in, lane)
                else:
                    acc[r, 0] += _dot_rounded(x[r], w, n_in, ls, s, c0, c1, conv, lane)
            return
        w2 = w.reshape((n_in, n_out))
        A = o + _R_A
        lo, hi = lane(p[A + _LO]), lane(p[A + _HI])
        if nr == 4:
            _loop(x, w2, acc, mode, ls, s, c0, c1, conv, lo, hi, _BLOCK, lane)
        else:
            _loop(x, w2, acc, mode, ls, s, c0, c1, conv, lo, hi, _ONE, lane)

    @numba.njit(nogil=True)
    def _layer(p, o, d, d32, cur, nxt, acc, cur32, acc32, nr):
        """One layer for the block's ``nr`` rows: ``cur`` [nr, n_in] to ``nxt`` [nr, n_out]."""
        op = p[o + _R_OP]
        n_in = p[o + _R_NIN]
        n_out = p[o + _R_NOUT]
        A = o + _R_A
        B = o + _R_B2
        wo = p[o + _R_W]
        bo = p[o + _R_B]
        if op == _OP_DENSE:
            bias = d[bo:bo + n_out]
            if p[o + _R_LANE] == _LANE32:
                for r in range(nr):
                    for i in range(n_in):
                        cur32[r, i] = np.int32(cur[r, i])
                    for j in range(n_out):
                        acc32[r, j] = np.int32(bias[j])
                _products(cur32, d32[wo:wo + n_in * n_out], acc32, n_in, n_out, p, o, nr, np.int32)
                # The wrap of the total, then the cast; ``cur``, read by now, holds the wrapped sums
                # (a cast in place would not vectorise: LLVM's overlap check fails).
                if p[o + _R_MODE] <= _D_ROUNDED and p[A + _OVF] != _FIT_NONE:
                    _cast_into(acc32, cur, nr, n_out, p, A)
                    _cast_into(cur, nxt, nr, n_out, p, B)
                else:
                    _cast_into(acc32, nxt, nr, n_out, p, B)
            else:
                for r in range(nr):
                    for j in range(n_out):
                        acc[r, j] = bias[j]
                _products(cur, d[wo:wo + n_in * n_out], acc, n_in, n_out, p, o, nr, np.int64)
                if p[o + _R_MODE] <= _D_ROUNDED and p[A + _OVF] != _FIT_NONE:
                    _cast_into(acc, cur, nr, n_out, p, A)
                    _cast_into(cur, nxt, nr, n_out, p, B)
                else:
                    _cast_into(acc, nxt, nr, n_out, p, B)
        elif op == _OP_BN:
            scale = d[wo:wo + n_out]
            bias = d[bo:bo + n_out]
            up = p[o + _R_K0]
            for r in range(nr):
                for j in range(n_out):
                    acc[r, j] = ((cur[r, j] * scale[j]) << up) + bias[j]
            _cast_into(acc, nxt, nr, n_out, p, B)
        elif op == _OP_RELU:
            for r in range(nr):
                for j in range(n_out):
                    acc[r, j] = max(cur[r, j], 0)
            _cast_into(acc, nxt, nr, n_out, p, B)
        elif op == _OP_LEAKY:
            alpha = p[o + _R_K0]
            for r in range(nr):
                for j in range(n_out):
                    acc[r, j] = alpha * cur[r, j]
            _cast_into(acc, acc, nr, n_out, p, A)  # both branches everywhere: each block is exact
            _cast_into(cur, nxt, nr, n_out, p, B)  # over the whole input range
            for r in range(nr):
                for j in range(n_out):
                    if cur[r, j] <= 0:
                        nxt[r, j] = acc[r, j]
        else:
            n = p[o + _R_K0]
            lg = p[o + _R_K1]
            f = p[o + _R_K2]
            offset = p[o + _R_K3]
            table = d[wo:wo + n]
            for r in range(nr):
                for j in range(n_out):
                    a = cur[r, j] * n
                    q = (a + ((a >> 63) & ((np.int64(1) << lg) - 1))) >> lg  # / span, toward zero
                    if f > 0:
                        q = (q + ((q >> 63) & ((np.int64(1) << f) - 1))) >> f  # to_int(): toward zero
                    else:
                        q = q << -f
                    # int32 arithmetic of the header: the low 32 bits, then + offset, again 32 bits.
                    q = ((q + 2147483648) & 0xFFFFFFFF) - 2147483648
                    q = ((q + offset + 2147483648) & 0xFFFFFFFF) - 2147483648
                    nxt[r, j] = table[min(max(q, 0), n - 1)]

    @numba.njit(nogil=True, cache=True)
    def _run_rows(x, p, d, d32, in_scale, out_scale, out):
        """All layers for every row of ``x``; False (nothing meaningful in ``out``) when some input
        needs the bit-level quantization. Blocks of four rows share each pass over a layer's
        weights; the last rows go one at a time, so a lone row computes only itself."""
        rows, nf = x.shape
        wide = p[_H_WIDE]
        mode = p[_H_RMODE]
        buf = np.empty((3, 4, wide), dtype=np.int64)  # two allocations, not five: a lone row pays each
        buf32 = np.empty((2, 4, wide), dtype=np.int32)
        cur, nxt, acc, cur32, acc32 = buf[0], buf[1], buf[2], buf32[0], buf32[1]
        lim = 4611686018427387904.0  # 2**62
        b = 0
        while b < rows:
            nr = 4 if rows - b >= 4 else 1
            inside = 0
            for r in range(nr):
                xr = x[b + r]
                c = nxt[r]
                for i in range(nf):  # counted, not an early exit, so that the loop vectorises
                    y = xr[i] * in_scale
                    a = abs(y) < lim  # False for NaN too
                    inside += a
                    c[i] = np.int64(_quantize(y if a else 0.0, mode))
            if inside != nr * nf:
                return False
            _cast_into(nxt, cur, nr, nf, p, _H_FIT)  # the input type's overflow mode
            n = nf
            for k in range(p[_H_N]):
                o = _HEAD + k * _REC
                _layer(p, o, d, d32, cur, nxt, acc, cur32, acc32, nr)
                cur, nxt = nxt, cur
                n = p[o + _R_NOUT]
            for r in range(nr):
                for j in range(n):
                    out[b + r, j] = cur[r, j] * out_scale
            b += nr
        return True

"""Fixed-point types with the exact semantics of ap_types' ``ap_fixed`` / ``ap_ufixed`` / ``ap_int`` / ``ap_uint``.

A :class:`FixedType` describes one C++ type; values live as *raw* integers (``value * 2**F`` with
``F = W - I`` fraction bits) in int64 arrays (uint64 for ``ap_ufixed<64, ...>`` / ``ap_uint<64>``,
whose raw values need the 64th bit). Everything is vectorised integer arithmetic; results are
bit-identical to the C++ headers shipped in hls4ml (proven in tests/test_fixed_point.py).

Example::

    >>> from offload.sim import FixedType
    >>> t = FixedType.parse("ap_fixed<16,6,AP_RND_CONV,AP_SAT>")
    >>> raw = t.quantize([0.1, -3.14159, 1e9])
    >>> raw.tolist(), t.to_float(raw).tolist()
    ([102, -3217, 32767], [0.099609375, -3.1416015625, 31.9990234375])

Arithmetic (:func:`add`, :func:`sub`, :func:`mul`) returns raw results in the full-precision type
ap_fixed gives ``a + b`` / ``a - b`` / ``a * b`` (``RType<...>::plus/minus/mult``);
:func:`accumulate` sums along an axis the way HLS code does ``acc += x`` in an accumulator type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from . import _fixed_core as _c

__all__ = [
    "FixedType",
    "ROUNDING_MODES",
    "OVERFLOW_MODES",
    "add",
    "sub",
    "mul",
    "add_type",
    "sub_type",
    "mul_type",
    "accumulate",
]

ROUNDING_MODES = ("AP_TRN", "AP_TRN_ZERO", "AP_RND", "AP_RND_ZERO", "AP_RND_MIN_INF", "AP_RND_INF", "AP_RND_CONV")
OVERFLOW_MODES = ("AP_WRAP", "AP_SAT", "AP_SAT_ZERO", "AP_SAT_SYM")
MAX_WIDTH = 1024  # ap_types' default AP_INT_MAX_W
RAW_BITS = 64  # widest type whose raw values these arrays hold

_TYPE_RE = re.compile(r"^\s*(ap_fixed|ap_ufixed|ap_int|ap_uint)\s*<(.*)>\s*$")


@dataclass(frozen=True)
class FixedType:
    """One ap_types fixed-point or integer type.

    ``width`` W (1..1024), ``integer`` I (any int, may be negative or exceed W), ``signed``,
    ``rounding`` (quantization mode), ``overflow`` mode, ``sat_bits`` N (ap_fixed's 5th parameter,
    used by AP_WRAP) and ``is_int`` (an ``ap_int``/``ap_uint``: C integer conversion semantics,
    truncation toward zero and wrap-around). Raw arithmetic needs W <= 64.

    Example: ``FixedType(16, 6, rounding="AP_RND_CONV", overflow="AP_SAT")``.
    """

    width: int
    integer: int
    signed: bool = True
    rounding: str = "AP_TRN"
    overflow: str = "AP_WRAP"
    sat_bits: int = 0
    is_int: bool = False

    def __post_init__(self) -> None:
        for name in ("width", "integer", "sat_bits"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"FixedType.{name} must be an int, got {type(v).__name__}")
            object.__setattr__(self, name, int(v))
        object.__setattr__(self, "signed", bool(self.signed))
        if not 1 <= self.width <= MAX_WIDTH:
            raise ValueError(f"W must be 1..{MAX_WIDTH}, got {self.width}")
        if self.rounding not in ROUNDING_MODES:
            raise ValueError(f"unknown rounding mode {self.rounding!r} (expected one of {', '.join(ROUNDING_MODES)})")
        if self.overflow == "AP_WRAP_SM":
            raise ValueError("overflow mode 'AP_WRAP_SM' is not supported (sign-magnitude wrap)")
        if self.overflow not in OVERFLOW_MODES:
            raise ValueError(f"unknown overflow mode {self.overflow!r} (expected one of {', '.join(OVERFLOW_MODES)})")
        if not 0 <= self.sat_bits <= self.width:
            raise ValueError(f"N (saturation bits) must be 0..W={self.width}, got {self.sat_bits}")
        if self.is_int and (self.integer != self.width or self.rounding != "AP_TRN_ZERO" or self.overflow != "AP_WRAP" or self.sat_bits):
            raise ValueError("an ap_int/ap_uint type has I == W, AP_TRN_ZERO and AP_WRAP (C integer semantics)")

    # -- text form -------------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> "FixedType":
        """Parse ``ap_fixed<W,I[,Q[,O[,N]]]>``, ``ap_ufixed<...>``, ``ap_int<W>`` or ``ap_uint<W>``."""
        if isinstance(text, FixedType):
            return text
        if not isinstance(text, str):
            raise TypeError(f"fixed-point type must be a str like 'ap_fixed<16,6>', got {type(text).__name__}")
        m = _TYPE_RE.match(text)
        if not m:
            raise ValueError(f"not an ap_types type: {text!r} (expected e.g. 'ap_fixed<16,6,AP_RND,AP_SAT>')")
        kind, body = m.group(1), m.group(2)
        args = [a.strip() for a in body.split(",")]
        if any(a == "" for a in args):
            raise ValueError(f"empty template argument in {text!r}")

        def _int(s: str, what: str) -> int:
            if not re.fullmatch(r"[+-]?\d+", s):
                raise ValueError(f"{what} must be an integer in {text!r}, got {s!r}")
            return int(s)

        if kind in ("ap_int", "ap_uint"):
            if len(args) != 1:
                raise ValueError(f"{kind} takes exactly one parameter W, got {len(args)} in {text!r}")
            w = _int(args[0], "W")
            if not 1 <= w <= MAX_WIDTH:
                raise ValueError(f"W must be 1..{MAX_WIDTH}, got {w} in {text!r}")
            return cls(w, w, kind == "ap_int", "AP_TRN_ZERO", "AP_WRAP", 0, True)
        if not 2 <= len(args) <= 5:
            raise ValueError(f"{kind} takes 2 to 5 parameters <W,I,Q,O,N>, got {len(args)} in {text!r}")
        w = _int(args[0], "W")
        i = _int(args[1], "I")
        q = args[2] if len(args) > 2 else "AP_TRN"
        o = args[3] if len(args) > 3 else "AP_WRAP"
        n = _int(args[4], "N") if len(args) > 4 else 0
        return cls(w, i, kind == "ap_fixed", q, o, n)

    def __str__(self) -> str:
        if self.is_int:
            return f"{'ap_int' if self.signed else 'ap_uint'}<{self.width}>"
        args = [str(self.width), str(self.integer)]
        if self.sat_bits:
            args += [self.rounding, self.overflow, str(self.sat_bits)]
        elif self.overflow != "AP_WRAP":
            args += [self.rounding, self.overflow]
        elif self.rounding != "AP_TRN":
            args += [self.rounding]
        return f"{'ap_fixed' if self.signed else 'ap_ufixed'}<{','.join(args)}>"

    # -- derived attributes ----------------------------------------------------------------------
    @property
    def W(self) -> int:  # noqa: N802 - the C++ template parameter's name
        return self.width

    @property
    def I(self) -> int:  # noqa: N802,E743
        return self.integer

    @property
    def F(self) -> int:  # noqa: N802
        """Fraction bits ``W - I`` (negative when I > W)."""
        return self.width - self.integer

    frac = F

    @property
    def min_raw(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max_raw(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1

    @property
    def lsb(self) -> float:
        """Value of one raw step, ``2**-F``."""
        return float(np.ldexp(1.0, -self.F))

    @property
    def min_float(self) -> float:
        return float(np.ldexp(float(self.min_raw), -self.F))

    @property
    def max_float(self) -> float:
        return float(np.ldexp(float(self.max_raw), -self.F))

    @property
    def raw_dtype(self) -> np.dtype:
        """int64, or uint64 for unsigned 64-bit types."""
        return np.dtype(np.uint64) if (not self.signed and self.width == 64) else np.dtype(np.int64)

    def with_modes(self, rounding: str | None = None, overflow: str | None = None, sat_bits: int | None = None) -> "FixedType":
        """Same W, I and signedness as an ap_fixed type with other modes."""
        return FixedType(
            self.width,
            self.integer,
            self.signed,
            rounding or ("AP_TRN" if self.is_int else self.rounding),
            overflow or self.overflow,
            self.sat_bits if sat_bits is None else sat_bits,
        )

    def _need_raw(self, what: str) -> None:
        if self.width > RAW_BITS:
            raise OverflowError(f"{what}: {self} has W={self.width}, more than the {RAW_BITS} bits a raw int64 array holds")

    def check_raw(self, raw, name: str = "raw") -> np.ndarray:
        """Validate raw values of this type (integer dtype, within [min_raw, max_raw]); return them in raw_dtype."""
        self._need_raw(name)
        a = np.asarray(raw)
        if a.dtype.kind not in "iu":
            if a.dtype.kind == "b" or a.size == 0:
                a = a.astype(np.int64)
            else:
                raise TypeError(f"{name}: raw values of {self} must be integers, got dtype {a.dtype}")
        if a.size:
            lo, hi = a.min(), a.max()
            if int(lo) < self.min_raw or int(hi) > self.max_raw:
                raise ValueError(f"{name}: raw values of {self} must lie in [{self.min_raw}, {self.max_raw}], got [{int(lo)}, {int(hi)}]")
        return a.astype(self.raw_dtype, copy=False)

    # -- conversions -----------------------------------------------------------------------------
    def quantize(self, x) -> np.ndarray:
        """Raw values of ``x`` (float64) exactly as ``T v = (double)x;`` gives them.

        Follows ``ap_fixed_base(double)`` bit for bit: the double's IEEE fields are decoded with the
        hidden bit always set, so subnormals act as ``1.f * 2**-1023`` (matters only when F > ~1000);
        +-0.0 gives 0; +-inf behave as ``+-2**1024`` (saturate under AP_SAT*, wrap to 0 under AP_WRAP),
        as the header does. NaN raises ValueError (the header only warns and returns bits of a
        meaningless +-2**1024-ish value). ``ap_int``/``ap_uint`` follow ``ap_int_base(double)``:
        truncation toward zero and wrap-around, including the header's quirk that a negative value
        with magnitude below 0.5 becomes +1.
        """
        self._need_raw("quantize")
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 1:
            return self.quantize(x.reshape(-1)).reshape(x.shape)
        if self.raw_dtype == np.int64 and 0 <= self.F <= 1000:
            # x * 2**F is exact here (a power-of-two scaling that can neither overflow below 2**62
            # nor lose bits of a subnormal; the header's subnormal decoding only differs below
            # 2**-22 LSB, where every mode rounds both values alike). Larger |y|, inf and NaN
            # take the bit-level path.
            with np.errstate(over="ignore", invalid="ignore"):
                y = np.multiply(x, float(2.0**self.F))
                lim = 2.0**62
                # two reductions decide for the whole array (NaN fails both comparisons)
                slow = None if (y.size == 0 or (y.max() < lim and y.min() > -lim)) else ~(np.abs(y) < lim)
            if slow is not None:
                y[slow] = 0.0
            q = _c.round_float(y, self.rounding, inplace=True)
            if self.is_int:  # ap_int_base(double): negative |x| < 0.5 becomes +1 (see _quantize_bits)
                q[(x < 0) & (x > -0.5)] = 1.0
            out = _c.fit_int64(q.astype(np.int64), self, inplace=True)
            if slow is not None:
                out[slow] = self._quantize_bits(x[slow])
            return out
        return self._quantize_bits(x)

    def _quantize_bits(self, x: np.ndarray) -> np.ndarray:
        """quantize() by decoding the IEEE fields, as ap_fixed_base(double) does (any W, F, input)."""
        bits = x.reshape(-1).view(np.uint64).reshape(x.shape)
        if np.isnan(x).any():
            raise ValueError(f"quantize into {self}: NaN has no fixed-point value (ap_types flags it as unsupported)")
        neg = (bits >> np.uint64(63)).astype(bool)
        expf = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
        mag = (bits & np.uint64((1 << 52) - 1)) | np.uint64(1 << 52)
        zero = (bits << np.uint64(1)) == 0
        if self.is_int:
            rs = 1075 - expf
            q = _c.shr(mag, np.maximum(rs, 0))
            q = np.where(rs < 0, _c.shl(mag, np.maximum(-rs, 0)), q)
            # ap_int_base(double): a magnitude shifted out entirely (>= 54 places) yields -1 before the
            # final negation, so negative |x| < 0.5 becomes +1.
            q = np.where(neg & (rs >= 54), np.uint64(0xFFFFFFFFFFFFFFFF), q)
            pattern = np.where(neg, np.uint64(0) - q, q) & _c.low_mask(self.width)
            pattern = np.where(zero, np.uint64(0), pattern)
            return _c.to_raw(pattern, self)
        rs = 1075 - expf - self.F
        neg, q, big = _c.round_exact(neg, mag, rs, False, self.rounding)
        out = _c.fit(neg & ~zero, np.where(zero, np.uint64(0), q), big & ~zero, self)
        return out

    def to_float(self, raw) -> np.ndarray:
        """Raw values -> float64 ``value = raw * 2**-F`` (exact up to 53 significant bits, else round-half-even as ``to_double()``)."""
        a = np.asarray(raw)
        if a.dtype.kind not in "iu":
            raise TypeError(f"to_float: raw values of {self} must be integers, got dtype {a.dtype}")
        return np.ldexp(a.astype(np.float64), -self.F)

    def cast(self, raw, src: "FixedType | str") -> np.ndarray:
        """Raw values of type ``src`` -> raw values of this type, as the C++ assignment ``T dst = (S)src;``.

        ``ap_int``/``ap_uint`` targets use ``ap_int_base(const ap_fixed_base&)``: truncation toward
        zero and wrap-around; for a source with I == 0 the header's to_ap_int_base() yields -1 for
        every negative value and 0 otherwise, which is reproduced; a source with I < 0 makes the header
        read an uninitialised value, so that cast raises ValueError.
        """
        src = FixedType.parse(src)
        self._need_raw("cast")
        return self._cast_valid(src.check_raw(raw, "cast source"), src)

    def _cast_valid(self, a: np.ndarray, src: "FixedType") -> np.ndarray:
        """cast() of raw values already checked against ``src`` (and in its raw dtype)."""
        if self.is_int and not src.is_int:
            if src.integer < 0:
                raise ValueError(
                    f"cast {src} -> {self}: ap_types' to_ap_int_base() reads an uninitialised value for a source with I < 0; "
                    "cast through an ap_fixed type with I >= 0 first"
                )
            if src.integer == 0:
                neg = (a < 0) if a.dtype == np.int64 else np.zeros(a.shape, bool)
                pattern = np.where(neg, np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64(0)) & _c.low_mask(self.width)
                return _c.to_raw(pattern, self)
            mode = "AP_TRN_ZERO"
        else:
            mode = self.rounding
        shift = src.F - self.F
        if a.dtype == np.int64 and self.raw_dtype == np.int64:
            if shift == 0:
                return _c.fit_int64(a, self)
            if 1 <= shift <= 62:
                return _c.fit_int64(_c.round_shift_int64(a, shift, mode), self)
            if shift < 0 and src.width - shift <= 63:  # raw << -shift cannot leave int64
                return _c.fit_int64(a << np.int64(-shift), self)
        neg, mag = _c.split_raw(a, src)
        rs = np.int64(shift)
        neg, q, big = _c.round_exact(neg, mag, np.full(a.shape, rs), False, mode)
        return _c.fit(neg, q, big, self)


# -- arithmetic ----------------------------------------------------------------------------------
def _as_type(t) -> FixedType:
    return FixedType.parse(t)


def _result(width: int, integer: int, signed: bool, a: FixedType, b: FixedType) -> FixedType:
    if a.is_int and b.is_int:
        return FixedType(width, width, signed, "AP_TRN_ZERO", "AP_WRAP", 0, True)
    return FixedType(width, integer, signed)


def mul_type(a, b) -> FixedType:
    """Type of ``a * b`` (``RType::mult``): W1+W2 bits, I1+I2 integer bits, signed if either is."""
    a, b = _as_type(a), _as_type(b)
    return _result(a.width + b.width, a.integer + b.integer, a.signed or b.signed, a, b)


def _plus_i(a: FixedType, b: FixedType) -> int:
    # An unsigned operand needs one more integer bit when the result is signed.
    return max(a.integer + (b.signed and not a.signed), b.integer + (a.signed and not b.signed)) + 1


def add_type(a, b) -> FixedType:
    """Type of ``a + b`` (``RType::plus``): max fraction bits, max integer bits + 1, signed if either is."""
    a, b = _as_type(a), _as_type(b)
    i = _plus_i(a, b)
    return _result(i + max(a.F, b.F), i, a.signed or b.signed, a, b)


def sub_type(a, b) -> FixedType:
    """Type of ``a - b`` (``RType::minus``): as :func:`add_type`, always signed."""
    a, b = _as_type(a), _as_type(b)
    i = _plus_i(a, b)
    return _result(i + max(a.F, b.F), i, True, a, b)


def _aligned(raw, t: FixedType, f: int, rt: FixedType, name: str) -> np.ndarray:
    a = t.check_raw(raw, name)
    dt = rt.raw_dtype
    return a.astype(dt) << dt.type(f - t.F)


def _need(rt: FixedType, op: str, a: FixedType, b: FixedType) -> None:
    if rt.width > RAW_BITS:
        raise OverflowError(f"{a} {op} {b} has exact type {rt} (W={rt.width}), wider than the {RAW_BITS}-bit raw arrays")


def add(a_raw, a_t, b_raw, b_t) -> tuple[np.ndarray, FixedType]:
    """Exact ``a + b``: ``(raw, add_type(a_t, b_t))``. OverflowError when that type is wider than 64 bits.

    Example: ``add(FixedType.parse("ap_fixed<8,4>").quantize(1.5), "ap_fixed<8,4>", 3, "ap_ufixed<4,2>")``.
    """
    a_t, b_t = _as_type(a_t), _as_type(b_t)
    rt = add_type(a_t, b_t)
    _need(rt, "+", a_t, b_t)
    return _aligned(a_raw, a_t, rt.F, rt, "a") + _aligned(b_raw, b_t, rt.F, rt, "b"), rt


def sub(a_raw, a_t, b_raw, b_t) -> tuple[np.ndarray, FixedType]:
    """Exact ``a - b``: ``(raw, sub_type(a_t, b_t))``. OverflowError when that type is wider than 64 bits."""
    a_t, b_t = _as_type(a_t), _as_type(b_t)
    rt = sub_type(a_t, b_t)
    _need(rt, "-", a_t, b_t)
    return _aligned(a_raw, a_t, rt.F, rt, "a") - _aligned(b_raw, b_t, rt.F, rt, "b"), rt


def mul(a_raw, a_t, b_raw, b_t) -> tuple[np.ndarray, FixedType]:
    """Exact ``a * b``: ``(raw, mul_type(a_t, b_t))``. OverflowError when that type is wider than 64 bits."""
    a_t, b_t = _as_type(a_t), _as_type(b_t)
    rt = mul_type(a_t, b_t)
    _need(rt, "*", a_t, b_t)
    dt = rt.raw_dtype
    return a_t.check_raw(a_raw, "a").astype(dt) * b_t.check_raw(b_raw, "b").astype(dt), rt


def accumulate(x_raw, x_t, acc_t, axis: int = -1, init=None) -> np.ndarray:
    """Sum ``x`` along ``axis`` in accumulator type ``acc_t``, one ``acc += x[k]`` at a time.

    ``acc += x`` in ap_types is ``acc = acc + x``: the exact sum (type :func:`add_type`) is assigned
    back into ``acc_t`` with its rounding and overflow modes after every addition, in index order,
    starting from ``init`` (raw values of ``acc_t``, default 0) - what hls4ml's dense layers do with
    ``acc[i] += mult[j]`` and what an embedding bag does with its rows. When that is associative
    modulo 2**W (AP_WRAP without N, and either no rounding or a shift-invariant mode: AP_TRN,
    AP_RND, AP_RND_MIN_INF) the sum is taken in one vectorised pass; otherwise the loop runs over
    the axis, vectorised across the other axes.

    Example: ``accumulate(table_raw[idx], "ap_fixed<16,6>", "ap_fixed<24,12>", axis=0)``.
    """
    x_t, acc_t = _as_type(x_t), _as_type(acc_t)
    acc_t._need_raw("accumulate")
    x = x_t.check_raw(x_raw, "x")
    x = np.moveaxis(x, axis, -1)
    if init is None:
        acc = np.zeros(x.shape[:-1], dtype=acc_t.raw_dtype)
    else:
        acc = np.broadcast_to(acc_t.check_raw(init, "init"), x.shape[:-1]).copy()
    shift_invariant = x_t.F <= acc_t.F or acc_t.rounding in ("AP_TRN", "AP_RND", "AP_RND_MIN_INF")
    if acc_t.overflow == "AP_WRAP" and acc_t.sat_bits == 0 and shift_invariant and not acc_t.is_int:
        # Each term rounded onto acc's grid (wrapped: only its value modulo 2**W matters).
        term_t = FixedType(RAW_BITS, RAW_BITS - acc_t.F, True, acc_t.rounding)
        terms = term_t.cast(x, x_t).view(np.uint64)
        total = terms.sum(axis=-1, dtype=np.uint64) + acc.astype(np.int64).view(np.uint64)
        return _c.to_raw(total & _c.low_mask(acc_t.width), acc_t)
    st = add_type(acc_t, x_t)
    _need(st, "+", acc_t, x_t)
    dt = st.raw_dtype
    xs = x.astype(dt) << dt.type(st.F - x_t.F)  # every term aligned once
    up = dt.type(st.F - acc_t.F)
    for k in range(x.shape[-1]):
        acc = acc_t._cast_valid((acc.astype(dt) << up) + xs[..., k], st)  # acc = acc + x[k]
    return acc

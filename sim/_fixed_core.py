"""Vectorised integer core of the fixed-point model: exact rounding and overflow on 64-bit words.

Every conversion (double -> fixed, fixed -> fixed) is reduced to one exact value

    value = (-1)**neg * mag * 2**(-rs)      (mag: uint64, rs: int64, both arrays)

which is rounded to an integer number of target LSBs with the target's quantization mode and then
fitted into the target's width with its overflow mode. Magnitudes that no longer fit 64 bits after
a left shift are tracked with a ``big`` flag: they are out of range of every type of width <= 64,
and their low 64 bits (all the wrap-around needs) are still exact.

The rules are the ones ``ap_fixed_base::operator=`` and ``ap_fixed_base(double)`` implement in
hls4ml's ap_types (quantization_adjust / overflow_adjust); the proof is tests/test_fixed_point.py.
"""

from __future__ import annotations

import numpy as np

_U64 = np.uint64
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def shr(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Logical right shift of uint64 ``x`` by ``s`` >= 0 bits, 0 when ``s`` >= 64 (numpy's is UB there)."""
    s = np.asarray(s, dtype=np.int64)
    r = x >> np.clip(s, 0, 63).astype(_U64)
    return np.where(s >= 64, _U64(0), r)


def shl(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Left shift modulo 2**64 of uint64 ``x`` by ``s`` >= 0 bits, 0 when ``s`` >= 64."""
    s = np.asarray(s, dtype=np.int64)
    r = x << np.clip(s, 0, 63).astype(_U64)
    return np.where(s >= 64, _U64(0), r)


def low_mask(k: np.ndarray) -> np.ndarray:
    """``2**k - 1`` as uint64 for k in any range (0 for k <= 0, all ones for k >= 64)."""
    k = np.asarray(k, dtype=np.int64)
    m = (_U64(1) << np.clip(k, 0, 63).astype(_U64)) - _U64(1)
    return np.where(k >= 64, _ALL_ONES, np.where(k <= 0, _U64(0), m))


def round_increment(mode: str, neg, q, qb, sticky):
    """Whether the magnitude ``q`` (value truncated toward zero) goes up by one LSB.

    ``qb`` is the first dropped bit (weight 1/2 LSB), ``sticky`` whether any lower bit is set.
    Derived from quantization_adjust() applied to the two's complement floor value.
    """
    if mode == "AP_TRN":  # floor
        return neg & (qb | sticky)
    if mode == "AP_TRN_ZERO":
        return np.zeros_like(qb)
    if mode == "AP_RND":  # ties toward +inf
        return np.where(neg, qb & sticky, qb)
    if mode == "AP_RND_ZERO":
        return qb & sticky
    if mode == "AP_RND_MIN_INF":
        return np.where(neg, qb, qb & sticky)
    if mode == "AP_RND_INF":  # ties away from zero
        return qb
    if mode == "AP_RND_CONV":  # ties to even
        return qb & (sticky | ((q & _U64(1)) != 0))
    raise ValueError(f"unknown rounding mode {mode!r}")


def round_exact(neg, mag, rs, big, mode):
    """Round ``(-1)**neg * mag * 2**-rs`` to an integer: returns (neg, qmag uint64, big)."""
    rs = np.asarray(rs, dtype=np.int64)
    rpos = np.maximum(rs, 0)
    q = shr(mag, rpos)
    qb = (shr(mag, rpos - 1) & _U64(1)).astype(bool) & (rs >= 1)
    sticky = (mag & low_mask(rpos - 1)) != 0
    inc = round_increment(mode, neg, q, qb, sticky)
    q = q + inc.astype(_U64)
    ls = np.maximum(-rs, 0)
    # A left shift loses bits past 2**64 when mag > (2**64 - 1) >> ls.
    lost = (ls > 0) & (mag > shr(np.full_like(mag, _ALL_ONES), ls))
    q = np.where(rs < 0, shl(mag, ls), q)
    big = np.asarray(big, dtype=bool) | lost
    return neg & ((q != 0) | big), q, big


def fit(neg, qmag, big, t) -> np.ndarray:
    """Fit the integer ``(-1)**neg * qmag`` (``big``: |value| >= 2**64) into type ``t``'s raw range."""
    w = t.width
    maxr = _U64(t.max_raw)
    absmin = _U64(-t.min_raw)
    over = ~neg & (big | (qmag > maxr))
    if t.overflow == "AP_SAT_SYM" and t.signed:
        under = neg & (big | (qmag >= absmin))
    else:
        under = neg & (big | (qmag > absmin))
    pattern = np.where(neg, _U64(0) - qmag, qmag) & low_mask(w)
    o = t.overflow
    if o == "AP_WRAP":
        if t.sat_bits:
            n = t.sat_bits
            hi = low_mask(np.int64(w)) & ~low_mask(np.int64(w - n))  # bits w-n .. w-1
            if t.signed:
                sign_bit = _U64(1) << _U64(w - 1)
                mid = hi & ~sign_bit  # bits w-n .. w-2
                adj = (pattern & ~hi) | np.where(under, sign_bit, mid)
            else:
                adj = pattern | hi
            pattern = np.where(over | under, adj, pattern)
    elif o == "AP_SAT_ZERO":
        pattern = np.where(over | under, _U64(0), pattern)
    else:  # AP_SAT, AP_SAT_SYM
        lo = t.min_raw
        if o == "AP_SAT_SYM" and t.signed and w > 1:
            lo = t.min_raw + 1  # min | 1 in the header; for W == 1 that is min itself
        pattern = np.where(over, maxr, pattern)
        pattern = np.where(under, _U64(lo & ((1 << 64) - 1)), pattern)
        pattern &= low_mask(w)
    return to_raw(pattern, t)


def to_raw(pattern: np.ndarray, t) -> np.ndarray:
    """W-bit two's complement pattern (uint64) -> raw dtype of ``t`` (sign-extended int64, or uint64)."""
    w = t.width
    if not t.signed:
        return pattern if w == 64 else pattern.astype(np.int64)
    if w == 64:
        return pattern.view(np.int64)
    sign = _U64(1) << _U64(w - 1)
    return ((pattern ^ sign) - sign).view(np.int64)  # classic sign extension


def split_raw(raw: np.ndarray, t):
    """Raw values of ``t`` -> (neg, |raw| as uint64)."""
    if raw.dtype == np.uint64:
        return np.zeros(raw.shape, bool), raw
    r = raw.astype(np.int64, copy=False)
    neg = r < 0
    u = r.view(_U64)
    return neg, np.where(neg, _U64(0) - u, u)


# -- fast paths: exact results with fewer passes where the operands allow it ----------------------
def round_float(y: np.ndarray, mode: str, inplace: bool = False) -> np.ndarray:
    """Round float64 ``y`` (already scaled to LSB units, exact) to an integer-valued float64, exactly.

    ``np.rint`` is IEEE round-half-even; ``d = y - rint(y)`` is exact (Sterbenz, or r == 0) and in
    [-1/2, 1/2], so the ties of the other modes are the elements with ``|d| == 1/2``.
    """
    out = y if inplace else None
    if mode == "AP_TRN":
        return np.floor(y, out=out)
    if mode == "AP_TRN_ZERO":
        return np.trunc(y, out=out)
    if mode == "AP_RND_CONV":
        return np.rint(y, out=out)
    r = np.rint(y)
    d = y - r
    up, down = d == 0.5, d == -0.5  # y is a tie just above / below r
    if mode == "AP_RND":
        return r + up
    if mode == "AP_RND_MIN_INF":
        return r - down
    if mode == "AP_RND_ZERO":
        return r + (up & (r < 0)) - (down & (r > 0))
    if mode == "AP_RND_INF":
        return r + (up & (r >= 0)) - (down & (r <= 0))
    raise ValueError(f"unknown rounding mode {mode!r}")


def round_shift_int64(raw: np.ndarray, s: int, mode: str) -> np.ndarray:
    """Exact rounding of ``raw * 2**-s`` (int64 raw, 1 <= s <= 62) to int64 with ``mode``."""
    fl = raw >> np.int64(s)  # arithmetic shift: floor
    if mode == "AP_TRN":
        return fl
    rem = raw & np.int64((1 << s) - 1)  # raw - fl * 2**s, in [0, 2**s)
    half = np.int64(1 << (s - 1))
    if mode == "AP_TRN_ZERO":
        return fl + ((raw < 0) & (rem != 0))
    if mode == "AP_RND":
        return fl + (rem >= half)
    if mode == "AP_RND_MIN_INF":
        return fl + (rem > half)
    tie = rem == half
    if mode == "AP_RND_ZERO":
        return fl + ((rem > half) | (tie & (raw < 0)))
    if mode == "AP_RND_INF":
        return fl + ((rem > half) | (tie & (raw >= 0)))
    if mode == "AP_RND_CONV":
        return fl + ((rem > half) | (tie & ((fl & 1) != 0)))
    raise ValueError(f"unknown rounding mode {mode!r}")


def fit_int64(q: np.ndarray, t, inplace: bool = False) -> np.ndarray:
    """Fit exact int64 integers ``q`` into ``t`` (whose raw dtype is int64) with its overflow mode."""
    w, lo, hi = t.width, t.min_raw, t.max_raw
    o = t.overflow
    if o == "AP_WRAP" and t.sat_bits:
        neg = q < 0
        u = q.view(_U64)
        return fit(neg, np.where(neg, _U64(0) - u, u), np.zeros(q.shape, bool), t)
    if o == "AP_WRAP":
        if w == 64:
            return q if inplace else q.copy()
        p = np.bitwise_and(q, np.int64((1 << w) - 1), out=q if inplace else None)
        if t.signed:
            sign = np.int64(1 << (w - 1))
            p ^= sign
            p -= sign
        return p
    if o == "AP_SAT_ZERO":
        return np.where((q > hi) | (q < lo), np.int64(0), q)
    if o == "AP_SAT_SYM" and t.signed and w > 1:
        lo += 1
    return np.clip(q, lo, hi, out=q if inplace else None)

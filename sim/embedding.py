"""Bit-exact reference model of the embedding lookup kernel (gather + pooled bags).

Everything here works on raw fixed-point integers (``int64``) and mirrors, operation by operation,
what ``hls/src/offload_embedding.h`` does with ap_fixed types, so the two agree bit for bit:

1. **Element value** ``e``: an ``ap_fixed`` table stores ``e`` directly. An ``int8_rowwise`` table
   stores a ``uint8`` code ``c`` and, per row, a scale ``s`` and bias ``b`` in one ap_fixed
   ``param_type``; ``e = c * s + b`` is computed exactly (type ``ap_fixed<Wp+9, Ip+9>``, see
   :func:`rowwise_value_type`), never rounded.
2. **Term** ``t = acc_t(e)``, or with per-sample weights ``t = acc_t(e * w)`` where ``e * w`` is the
   exact product (ap_fixed multiplication never rounds) and the cast to ``acc_t`` applies the
   accumulator's rounding and overflow modes.
3. **Pooling** over the bag's non-padding entries, in order:
   ``sum``: ``acc = acc_t(acc + t)`` per step (the addition is exact, the assignment applies the
   accumulator's overflow mode at every step, as the pipelined HLS loop does);
   ``mean``: the ``sum`` accumulator, then the raw accumulator ``a`` is divided by the count ``n``
   with round-half-away-from-zero integer division: ``sign(a) * ((2|a| + n) // (2n))`` (stays in
   ``acc_t``, whose width is limited to 62 bits so ``2|a|`` fits int64); ``max``: the largest term.
   A bag with no (non-padding) entries gives 0 in every mode, as torch does.
4. **Output** ``out_t(pooled)``: cast with the output type's rounding and overflow modes.

Example::

    from offload.sim.fixed import FixedType
    from offload.sim.embedding import pool_bags
    acc = FixedType.parse("ap_fixed<32,16,AP_RND_CONV,AP_SAT>")
    out = pool_bags(elem_raw, elem_t, offsets, "sum", acc, acc, max_bag_size=64)
"""

from __future__ import annotations

import numpy as np

from offload.sim.fixed import FixedType, add_type, mul_type

_CODE_T = FixedType.parse("ap_uint<8>")

__all__ = [
    "MODES",
    "rowwise_value_type",
    "product_type",
    "drop_padding",
    "gather_values",
    "pool_bags",
    "round_div",
]

MODES = ("sum", "mean", "max")


def _raw_min_max(t: FixedType) -> tuple[int, int]:
    return t.min_raw, t.max_raw


def rowwise_value_type(param_type: FixedType) -> FixedType:
    """Exact type of ``code * scale + bias`` for an ``int8_rowwise`` row.

    ``ap_uint<8> * ap_fixed<Wp,Ip>`` is ``ap_fixed<Wp+8, Ip+8>`` and adding ``ap_fixed<Wp,Ip>``
    gives ``ap_fixed<Wp+9, Ip+9>``: the ap_types result types, so the C++ kernel forms the same
    value without rounding.
    """
    return add_type(mul_type(_CODE_T, param_type), param_type)


def product_type(a: FixedType, b: FixedType) -> FixedType:
    """Exact type of ``a * b`` (ap_types ``RType::mult``)."""
    return mul_type(a, b)


def drop_padding(indices: np.ndarray, offsets: np.ndarray, padding_idx: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Remove entries equal to ``padding_idx``; return (indices, offsets, kept positions or None).

    Padding entries are skipped by the kernel: they neither add to a bag nor count for ``mean``.
    """
    if padding_idx is None:
        return indices, offsets, None
    pad = indices == padding_idx
    if not pad.any():
        return indices, offsets, None
    keep = np.flatnonzero(~pad)
    kept_before = np.concatenate(([0], np.cumsum(~pad, dtype=np.int64)))
    return indices[keep], kept_before[offsets], keep


def gather_values(table: np.ndarray, indices: np.ndarray, params: np.ndarray | None = None) -> np.ndarray:
    """Raw element values of the looked-up rows, shape ``(len(indices), dim)``.

    ``params`` (``int8_rowwise`` only): raw ``(scale, bias)`` per row in ``param_type``; the
    result is then raw ``code * scale + bias`` in :func:`rowwise_value_type` (same frac bits).
    """
    rows = np.take(table, indices, axis=0)
    if params is None:
        return rows
    sb = np.take(params, indices, axis=0).astype(np.int64, copy=False)
    # |code*scale + bias| < 2^(Wp+8): validated Wp <= 54 keeps this exact in int64.
    return rows.astype(np.int64) * sb[:, 0:1] + sb[:, 1:2]


def round_div(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``sign(a) * ((2|a| + n) // (2n))`` (round half away from zero), 0 where ``n == 0``.

    The kernel's ``mean``: an exact integer division of the raw accumulator by the bag count.
    """
    a = np.asarray(a, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    nn = np.maximum(n, 1)
    q = (2 * np.abs(a) + nn) // (2 * nn)
    q = np.where(a < 0, -q, q)
    return np.where(n == 0, 0, q)


def _acc_can_overflow(term_max: int, max_bag_size: int, acc: FixedType) -> bool:
    lo, hi = _raw_min_max(acc)
    return max_bag_size * term_max > min(hi, -lo)


def pool_bags(
    values: np.ndarray,
    value_type: FixedType,
    offsets: np.ndarray,
    mode: str,
    acc_type: FixedType,
    out_type: FixedType,
    *,
    max_bag_size: int,
    weights: np.ndarray | None = None,
    weight_type: FixedType | None = None,
) -> np.ndarray:
    """Pool raw ``values`` (``N x D``, in ``value_type``) over the bags given by ``offsets``.

    ``offsets`` has ``B + 1`` entries, starts at 0, ends at ``N`` and never decreases (validated by
    the caller). ``max_bag_size`` is the declared bound the accumulator was sized for; a longer
    bag is pooled with the same per-step ``acc_t`` arithmetic (the overflow proofs below use the
    longest bag of the call when it passes the declared bound). ``weights`` (raw, in
    ``weight_type``) multiplies each row first (sum mode). Returns raw ``out_type`` ``B x D``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    offsets = np.asarray(offsets, dtype=np.int64)
    nb = offsets.shape[0] - 1
    d = values.shape[1] if values.ndim == 2 else 0
    counts = np.diff(offsets)
    if counts.size:
        max_bag_size = max(int(max_bag_size), int(counts.max()))

    # Terms in acc_t.
    if weights is not None:
        if weight_type is None:
            raise ValueError("weight_type is needed with weights")
        src_t = product_type(value_type, weight_type)
        src = values.astype(np.int64, copy=False) * np.asarray(weights, dtype=np.int64)[:, None]
    else:
        src_t = value_type
        src = values
    shift = acc_type.F - src_t.F
    vlo, vhi = _raw_min_max(src_t)
    alo, ahi = _raw_min_max(acc_type)
    # Fast path: when acc_t has at least src's frac bits and holds src's whole range, the cast is
    # an exact left shift, and shifting commutes with the sum, so it can be done once per bag.
    exact_terms = shift >= 0 and (vlo << shift) >= alo and (vhi << shift) <= ahi
    if exact_terms:
        term_max = max(-vlo, vhi) << shift
    else:
        src = acc_type.cast(np.asarray(src, dtype=np.int64), src_t)
        term_max = max(-alo, ahi)
        shift = 0

    if nb == 0 or d == 0:
        return np.zeros((nb, d), dtype=np.int64)
    # Empty bags (count 0) are handled by the segment reductions and give 0 (0 << shift and every
    # cast of 0 are 0), so no boolean-mask copies and no np.zeros (fresh calloc pages fault on
    # every call here: ~0.5 ms per 2 MB).
    starts = offsets[:-1]
    if mode == "max":
        return _cast(out_type, _segment_reduce(src, starts, counts, np.max) << shift, acc_type)

    if not _acc_can_overflow(term_max, max_bag_size, acc_type):
        # No overflow is possible for any bag up to max_bag_size: |sum| <= max_bag_size *
        # term_max <= the accumulator's range (< 2^62), so each per-step saturation/wrap is a no-op
        # and a plain int64 sum is exact, in any order.
        # int32 partial sums suffice when no bag can reach 2^31 (e.g. 16-bit values, bags <= 2^15).
        small = max_bag_size * max(-vlo, vhi, 1) < 2**31 if exact_terms else False
        # Bound on |src| (before the shift) for the exact float sums. Like the overflow proof and the
        # int32 choice above, it relies on raw values lying in their type's range (make_kernel's
        # quantization guarantees it for tables; validate() for weights; acc_t.cast for the rest).
        src_max = max(-vlo, vhi) if exact_terms else max(-alo, ahi)
        s = _segment_reduce(src, starts, counts, np.sum, np.int32 if small else np.int64, src_max)
        if shift:
            s <<= shift
    else:
        s = _sequential_sum(np.asarray(src, dtype=np.int64) << shift, starts, counts, acc_type)
    if mode == "mean":
        s = round_div(s, counts[:, None])
    return _cast(out_type, s, acc_type)


# Exact float sums: (dtype, limit) such that every integer of magnitude <= limit is representable.
# Tests patch this to () to force the integer path on the same inputs.
_EXACT_FLOAT_SUMS: tuple = ((np.float32, 2**24), (np.float64, 2**53))
# Elements per float chunk: big enough that the per-chunk Python and BLAS call overhead is small,
# small enough that the buffer stays in L2 and off fresh (page-faulting) memory. Measured in the full
# reference at batch 4096: 2^18 best (2^21: 2.8x slower at bag 20, the buffer then faults each call).
_FLOAT_CHUNK = 2**18


def _exact_float_dtype(bag_len: int, src_max: int | None):
    """The narrowest float dtype in which summing ``bag_len`` integers of magnitude <= ``src_max``
    is exact in any order, or None.

    Proof: every partial sum of any subset of the terms, in any association (BLAS may reorder or
    use FMA with the factor 1.0), has magnitude <= sum |t_i| <= bag_len * src_max <= limit, and is
    an integer. All integers of magnitude <= limit (2^24 for float32, 2^53 for float64) are
    representable, and IEEE addition returns the exact result whenever it is representable, so no
    step rounds; the inputs themselves (|t| <= src_max <= limit) convert exactly too.
    """
    if src_max is None:
        return None
    for dt, limit in _EXACT_FLOAT_SUMS:
        if bag_len * src_max <= limit:
            return dt
    return None


def _float_bag_sum(src3: np.ndarray, dt) -> np.ndarray:
    """Exact int64 sums over axis 1 of integer ``(bags, L, D)`` via float BLAS (``dt`` from
    :func:`_exact_float_dtype`): per chunk of bags, one exact int->float conversion into a reused
    buffer and one ``ones(L) @ chunk`` (gemv per bag), which beats einsum's integer reduction."""
    nb, L, d = src3.shape
    out = np.empty((nb, d), dtype=dt)
    step = max(1, _FLOAT_CHUNK // max(1, L * d))
    buf = np.empty((min(step, nb), L, d), dtype=dt)
    ones = np.ones(L, dtype=dt)
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        t = buf[:b1 - b0]
        np.copyto(t, src3[b0:b1], casting="unsafe")  # exact: |src| <= limit (see _exact_float_dtype)
        np.matmul(ones, t, out=out[b0:b1])
    return out.astype(np.int64)  # integer-valued, exact


def _segment_reduce(src: np.ndarray, starts: np.ndarray, counts: np.ndarray, reduce, sum_dtype=np.int64,
                    src_max: int | None = None) -> np.ndarray:
    """``reduce`` (np.sum / np.max, in int64) over rows ``starts[i] : starts[i] + counts[i]``;
    an empty bag (count 0) gives 0.

    Equal-length, back-to-back bags (2-D input, plain lookups) are reduced in place. Otherwise
    bags are grouped by length: each group is one ``(bags, length, D)`` gather and one reduction
    over axis 1, several times faster than ``np.add.reduceat`` over rows. Sums go through exact
    float BLAS when ``src_max`` (a bound on ``|src|``) proves it exact for the group's length.
    (Tried and dropped: padding ragged bags into length buckets with a 0/1 weight mask, slower.)
    """
    nb = starts.shape[0]
    d = src.shape[1]
    if reduce is np.sum:
        def red(a):
            dt = _exact_float_dtype(a.shape[1], src_max)
            if dt is not None and a.shape[1] > 1:
                return _float_bag_sum(a, dt)
            # einsum reduces the middle axis several times faster than ndarray.sum here.
            # casting="unsafe" only narrows int64 values the caller proved to fit sum_dtype.
            return np.einsum("bld->bd", a, dtype=sum_dtype, casting="unsafe")
    else:
        def red(a):
            return reduce(a, axis=1)
    c0 = int(counts[0])
    if c0 > 0 and (counts == c0).all() and int(starts[0]) == 0 and src.shape[0] == c0 * nb:
        if c0 == 1:  # one entry per bag (plain lookups): nothing to reduce
            return src.astype(np.int64)
        return red(src.reshape(nb, c0, d)).astype(np.int64, copy=False)
    out = np.empty((nb, d), dtype=np.int64)
    order = np.argsort(counts, kind="stable")
    cuts = np.flatnonzero(np.diff(counts[order])) + 1
    for grp in np.split(order, cuts):
        n = int(counts[grp[0]])
        if n == 0:
            out[grp] = 0
            continue
        pos = starts[grp][:, None] + np.arange(n)
        out[grp] = red(np.take(src, pos, axis=0))
    return out


def _cast(dst: FixedType, raw: np.ndarray, src: FixedType) -> np.ndarray:
    """``dst.cast(raw, src)``, short-cut to an exact shift when ``dst`` has at least ``src``'s frac
    bits and these values fit (no rounding, no overflow: the cast is then exactly the shift)."""
    if dst == src:
        return raw
    sh = dst.F - src.F
    if sh >= 0 and raw.size and sh < 62:
        lo, hi = int(raw.min()), int(raw.max())
        if (lo << sh) >= dst.min_raw and (hi << sh) <= dst.max_raw:
            return raw << sh if sh else raw
    return dst.cast(raw, src)


def _sequential_sum(terms: np.ndarray, starts: np.ndarray, counts: np.ndarray, acc: FixedType) -> np.ndarray:
    """Per-step ``acc = acc_t(acc + t)``: one vectorised step per bag position (<= max bag size)."""
    wide = add_type(acc, acc)  # exact type of acc + t
    s = np.zeros((starts.shape[0], terms.shape[1]), dtype=np.int64)
    for k in range(int(counts.max())):
        live = np.flatnonzero(counts > k)
        s[live] = acc.cast(s[live] + terms[starts[live] + k], wide)
    return s

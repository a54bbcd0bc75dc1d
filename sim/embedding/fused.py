"""Fused, compiled embedding lookups: gather, pool and finish in one pass, bit-identical to
:mod:`offload.sim.embedding.reference` (the step-by-step definition, and the oracle in the tests).

Why numba and not a g++-built helper: the arithmetic is a handful of int64 operations per element
whose shape (table dtype, index dtype, row-wise or not, weights or not) varies per kernel; numba
specialises one Python source per dtype combination, caches the machine code on disk
(``cache=True``), gives ``prange`` threads and lets us emit ``llvm.prefetch`` through an
``@intrinsic``, all from a PyPI wheel with no compiler on the user's machine. A g++ helper would
need a compiler at run time (the sim device must work where only pip is available), a hand-written
dtype dispatch in C and a ctypes call per table. numba is also what hls4ml[da] already installs.

What runs where: :func:`plan` turns a :class:`~offload.sim.embedding.reference.Pooling` into a
:class:`Plan` once (cast parameters of every fixed-point step, which compiled variant each table
needs); :func:`run` executes a call. A pooling whose casts leave the int64 fast cases of
:meth:`FixedType.cast` (a ``uint64`` raw type, an ``ap_int`` target from a fraction, ``AP_WRAP``
with saturation bits, shifts past 62) gets an unsupported plan, and :func:`run` answers None for
it: the caller (the ``embedding`` kernel kind) then runs the reference. Semantics are the
reference's: per-element term cast to ``acc_t``, per-step accumulator overflow, round-half-away
mean, output cast.

Two shortcuts, each proven from the types and ``max_bag_size`` when the plan is made (and every
call's bags are checked against ``max_bag_size`` before any is pooled): where no bag can overflow
``acc_t`` and every term is an exact left shift, the per-step fits are identities and the shift is
done once per bag (``plain``); and a ``plain`` table accumulates in int32 only while
``max_bag_size * max|raw| < 2**31``, so no partial sum can leave int32.

Threads: single-threaded unless the caller says otherwise with :func:`using_threads` (the torch op
passes ``torch.get_num_threads()``). Only one parallel launch runs at a time (numba's default
``workqueue`` threading layer aborts the process on concurrent launches); a second concurrent call
runs serially instead of waiting. Numba picks its threading layer at the first parallel compile
(here GNU OpenMP, ``omp``, where libgomp is present): a process that forks after loading a kernel
should start its children with ``spawn``, as GNU OpenMP is not fork-safe once its pool exists.

JIT: :func:`warm_up` compiles (or loads from the on-disk cache) every variant a plan needs and
returns the seconds spent; the ``embedding`` kind calls it at a device's ``load()`` so no request
pays for it. :func:`jit_seconds` reports the total so far.

Example::

    p = plan(pooling)
    out = run(p, [table0], [None], indices, offsets)   # == reference.lookup(...), or None
"""

from __future__ import annotations

import contextvars
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from offload.sim.embedding.reference import MODES, Pooling, product_type
from offload.sim.fixed import FixedType

try:  # a core dependency; missing only in a broken install, where the reference still works
    import numba
except ImportError:  # pragma: no cover - exercised by the fallback test through _NUMBA
    numba = None

__all__ = ["Plan", "plan", "run", "warm_up", "using_threads", "jit_seconds", "available", "acc32_ok", "NativeEntry", "native_entry"]

# Replaced by None in tests to force the reference.
_NUMBA = numba
_warned = False

_ROUND = {"AP_TRN": 0, "AP_TRN_ZERO": 1, "AP_RND": 2, "AP_RND_MIN_INF": 3, "AP_RND_ZERO": 4, "AP_RND_INF": 5, "AP_RND_CONV": 6}
_OVF = {"AP_WRAP": 0, "AP_SAT": 1, "AP_SAT_ZERO": 2, "AP_SAT_SYM": 1}  # SAT_SYM: SAT with lo + 1 (see _cast_params)
# Cast kinds: exact left shift that provably fits (no overflow handling), shift 0 + fit,
# rounding right shift + fit, left shift + fit.
_EXACT, _FIT, _RSHIFT, _LSHIFT = 0, 1, 2, 3
# Layout of one cast's parameter block in the int64 parameter vector.
_C_KIND, _C_SHIFT, _C_ROUND, _C_OVF, _C_WIDTH, _C_SIGNED, _C_LO, _C_HI = range(8)
_CAST_LEN = 8
# Parameter vector: [mode, pad, plain shift, fit acc per step, prefetch distance, weight range, acc fit block,
# term cast block, out cast block]
_P_MODE, _P_PAD, _P_SHIFT, _P_FITACC, _P_AHEAD, _P_WLO, _P_WHI = range(7)
_P_ACC = 7
_P_TERM = _P_ACC + _CAST_LEN
_P_OUT = _P_TERM + _CAST_LEN
_P_LEN = _P_OUT + _CAST_LEN
_MODE = {m: i for i, m in enumerate(MODES)}  # sum 0, mean 1, max 2

# Prefetch distance in lookups (FBGEMM's TBE kernels prefetch a fixed number of rows ahead); read
# when a plan is made, 0 turns prefetching off (bench/bench_embedding.py measures both).
PREFETCH_AHEAD = 16

_threads: contextvars.ContextVar[int] = contextvars.ContextVar("offload_sim_embedding_threads", default=1)
_parallel_lock = threading.Lock()
_jit_total = [0.0]
_pool_started: list = []


def _start_pool() -> None:
    """Start numba's thread pool from a thread of its own, once. Started from the calling thread,
    numba's OpenMP layer leaves that thread's OpenMP thread count at NUMBA_NUM_THREADS, and torch
    reads its intra-op thread count from the same libgomp: a process that had set 1 thread found 2
    after its first kernel load (probed on torch 2.13, numba's omp layer)."""
    if not _pool_started:
        t = threading.Thread(target=_NUMBA.get_num_threads, name="offload-numba-start")
        t.start()
        t.join()
        _pool_started.append(True)


def available() -> bool:
    """Whether the compiled path can run (numba importable)."""
    return _NUMBA is not None


class using_threads:  # noqa: N801  (used like a function: ``with using_threads(n):``)
    """Run fused lookups in this context with up to ``n`` threads (default outside: 1).

    A class rather than a ``contextlib.contextmanager`` generator: the torch op enters it on every
    call, and the generator costs ~1.5 us there against ~0.3 us for this."""

    __slots__ = ("_n", "_tok")

    def __init__(self, n: int) -> None:
        self._n = max(1, int(n))

    def __enter__(self) -> None:
        self._tok = _threads.set(self._n)

    def __exit__(self, *exc: object) -> None:
        _threads.reset(self._tok)


def jit_seconds() -> float:
    """Seconds spent so far compiling or loading compiled variants from the cache."""
    return _jit_total[0]


# ------------------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class _TablePlan:
    params: np.ndarray  # int64 parameter vector (see _P_*), unweighted
    params_w: np.ndarray  # the same for weighted calls (term cast from value x weight)
    plain: bool  # unweighted sum/mean of a non-row-wise table with exact terms and no overflow
    acc32: bool  # plain path may accumulate in int32
    col: int  # first output column


@dataclass(frozen=True)
class Plan:
    """What :func:`run` needs for one pooling; ``supported`` False: :func:`run` answers None."""

    pooling: Pooling
    supported: bool
    reason: str
    tables: tuple[_TablePlan, ...]
    # 2^-F of out_type as a float32 where 0 <= F <= 126, else None: then float32(raw) * scale is
    # raw * 2^-F rounded once to float32 (a power of two scales exactly while results stay normal),
    # the float32 output :func:`run` can write in place of the raw int64 one.
    scale32: np.float32 | None = None


class _Unsupported(Exception):
    pass


def _cast_params(dst: FixedType, src: FixedType, exact_ok: bool) -> np.ndarray:
    """``dst.cast(raw, src)`` as a parameter block (the int64 cases of FixedType._cast_valid)."""
    if dst.raw_dtype != np.int64 or src.raw_dtype != np.int64:
        raise _Unsupported(f"{src} -> {dst}: 64-bit unsigned raw values")
    if dst.is_int and not src.is_int:
        if src.integer <= 0:
            raise _Unsupported(f"{src} -> {dst}: ap_int target from I <= 0")
        mode = "AP_TRN_ZERO"
    else:
        mode = dst.rounding
    if dst.overflow == "AP_WRAP" and dst.sat_bits:
        raise _Unsupported(f"{dst}: AP_WRAP with saturation bits")
    shift = src.F - dst.F
    lo, hi = dst.min_raw, dst.max_raw
    if dst.overflow == "AP_SAT_SYM" and dst.signed and dst.width > 1:
        lo += 1
    if exact_ok and shift <= 0 and -shift < 62 and (src.min_raw << -shift) >= dst.min_raw and (src.max_raw << -shift) <= dst.max_raw:
        kind, sh = _EXACT, -shift
    elif shift == 0:
        kind, sh = _FIT, 0
    elif 1 <= shift <= 62:
        kind, sh = _RSHIFT, shift
    elif shift < 0 and src.width - shift <= 63:
        kind, sh = _LSHIFT, -shift
    else:
        raise _Unsupported(f"{src} -> {dst}: shift {shift}")
    return np.array([kind, sh, _ROUND[mode], _OVF[dst.overflow], dst.width, int(dst.signed), lo, hi], dtype=np.int64)


def acc32_ok(max_bag_size: int, value_type: FixedType) -> bool:
    """Whether a ``plain`` table's partial sums fit int32: ``max_bag_size * max|raw| < 2**31``.

    Proof: a plain term is the raw value itself (the shift to ``acc_t`` is done once per bag), so
    a partial sum of at most ``max_bag_size`` terms has magnitude at most ``max_bag_size * max|raw|``,
    with ``max|raw| = max(-min_raw, max_raw)`` of the value type (tables hold raw values inside
    their type: the kind's ``check_tensors``)."""
    return max_bag_size * max(-value_type.min_raw, value_type.max_raw, 1) < 2**31


def _table_params(p: Pooling, t: int, weighted: bool) -> tuple[np.ndarray, bool, bool]:
    pt = p.tables[t]
    acc, out_t = p.acc_type, p.out_type
    vt = pt.value_type
    src_t = product_type(vt, p.weight_type) if weighted else vt
    term = _cast_params(acc, src_t, exact_ok=True)
    if term[_C_KIND] == _EXACT:
        term_max = max(-src_t.min_raw, src_t.max_raw) << int(term[_C_SHIFT])
    else:
        term_max = max(-acc.min_raw, acc.max_raw)
    # Per-step overflow handling only where a bag of up to max_bag_size terms could overflow.
    fit_acc = p.mode != "max" and p.max_bag_size * term_max > min(acc.max_raw, -acc.min_raw)
    v = np.zeros(_P_LEN, dtype=np.int64)
    v[_P_MODE] = _MODE[p.mode]
    v[_P_PAD] = -1 if pt.padding_idx is None else pt.padding_idx
    v[_P_FITACC] = int(fit_acc)
    v[_P_AHEAD] = PREFETCH_AHEAD
    v[_P_WLO], v[_P_WHI] = p.weight_type.min_raw, p.weight_type.max_raw
    v[_P_ACC:_P_ACC + _CAST_LEN] = _cast_params(acc, acc, exact_ok=False)  # acc_t(acc + t): shift 0, fit
    v[_P_TERM:_P_TERM + _CAST_LEN] = term
    # Pooled values always lie in acc_t's range (no-overflow proof, saturation, or a single term), so
    # an output cast that maps that whole range exactly is a plain shift.
    v[_P_OUT:_P_OUT + _CAST_LEN] = _cast_params(out_t, acc, exact_ok=True)
    plain = bool(not weighted and not pt.rowwise and p.mode != "max" and not fit_acc and term[_C_KIND] == _EXACT)
    v[_P_SHIFT] = term[_C_SHIFT] if plain else 0
    return v, plain, plain and acc32_ok(p.max_bag_size, vt)


def plan(p: Pooling) -> Plan:
    """The fused plan of a pooling (the caller keeps it: it depends on nothing else)."""
    try:
        tables = []
        col = 0
        for t, pt in enumerate(p.tables):
            pu, plain, acc32 = _table_params(p, t, False)
            pw = _table_params(p, t, True)[0] if p.mode == "sum" else pu
            tables.append(_TablePlan(pu, pw, plain, acc32, col))
            col += pt.dim
        F = int(p.out_type.F)
        return Plan(p, True, "", tuple(tables), np.float32(2.0 ** -F) if 0 <= F <= 126 else None)
    except _Unsupported as e:
        return Plan(p, False, str(e), ())


# ---------------------------------------------------------------------------------- the kernels


# Module-level (not closures): numba's disk cache keys a closure by its pickled cells, which differ
# in every process, so closures would recompile on every start.
if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    @intrinsic
    def prefetch_row(typingctx, ary_t, row_t):
        """``llvm.prefetch`` (read, high locality, data cache) of the first 128 bytes of row ``row``."""
        sig = types.void(ary_t, row_t)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            i8p = ir.IntType(8).as_pointer()
            base = builder.bitcast(ary.data, i8p)
            stride0 = cgutils.unpack_tuple(builder, ary.strides, aryty.ndim)[0]
            row = context.cast(builder, args[1], signature.args[1], types.intp)
            p = builder.gep(base, [builder.mul(row, stride0)])
            fnty = ir.FunctionType(ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch")
            i32 = ir.IntType(32)
            builder.call(fn, [p, i32(0), i32(3), i32(1)])
            builder.call(fn, [builder.gep(p, [ir.IntType(64)(64)]), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return sig, codegen

    @numba.njit(inline="always")
    def fit(q, p, o):
        ovf = p[o + _C_OVF]
        w = p[o + _C_WIDTH]
        if ovf == 0:  # AP_WRAP
            if w == 64:
                return q
            r = q & ((np.int64(1) << w) - 1)
            if p[o + _C_SIGNED]:
                sign = np.int64(1) << (w - 1)
                r = (r ^ sign) - sign
            return r
        lo = p[o + _C_LO]
        hi = p[o + _C_HI]
        if ovf == 2:  # AP_SAT_ZERO
            return np.int64(0) if (q > hi or q < lo) else q
        return min(max(q, lo), hi)

    @numba.njit(inline="always")
    def cast(raw, p, o):
        kind = p[o + _C_KIND]
        s = p[o + _C_SHIFT]
        if kind == _EXACT:
            return raw << s
        if kind == _FIT:
            return fit(raw, p, o)
        if kind == _LSHIFT:
            return fit(raw << s, p, o)
        fl = raw >> s
        m = p[o + _C_ROUND]
        if m == 0:
            return fit(fl, p, o)
        rem = raw & ((np.int64(1) << s) - 1)
        half = np.int64(1) << (s - 1)
        if m == 1:
            up = raw < 0 and rem != 0
        elif m == 2:
            up = rem >= half
        elif m == 3:
            up = rem > half
        elif m == 4:
            up = rem > half or (rem == half and raw < 0)
        elif m == 5:
            up = rem > half or (rem == half and raw >= 0)
        else:
            up = rem > half or (rem == half and (fl & 1) != 0)
        return fit(fl + np.int64(up), p, o)

    def store(row, i, v, osc):
        """``row[i] = v`` (raw, int64 rows) or ``float32(v) * osc`` (float32 rows); chosen when compiled."""

    @overload(store)
    def _store(row, i, v, osc):
        if isinstance(row.dtype, types.Integer):
            def impl(row, i, v, osc):
                row[i] = v
        else:
            def impl(row, i, v, osc):
                row[i] = np.float32(v) * osc
        return impl

    @numba.njit(inline="always")
    def finish(acc, dim, sh, n, p, out, b, col, osc):
        """Row ``b`` of ``out`` from the bag's first ``dim`` accumulators (times 2^sh): mean's rounded
        division, then the output cast. Branches sit outside the element loops so the common cases
        vectorise."""
        row = out[b]
        mean = p[_P_MODE] == 1
        if p[_P_OUT + _C_KIND] == _EXACT and not mean:
            s = sh + p[_P_OUT + _C_SHIFT]
            for d in range(dim):
                store(row, col + d, np.int64(acc[d]) << s, osc)
            return
        for d in range(dim):
            v = np.int64(acc[d]) << sh
            if mean:  # round half away from zero, 0 for an empty bag
                if n == 0:
                    v = np.int64(0)
                else:
                    q = (2 * abs(v) + n) // (2 * n)
                    v = -q if v < 0 else q
            store(row, col + d, cast(v, p, _P_OUT), osc)

    @numba.njit(nogil=True, cache=True)
    def bags_plain(table, idx, off, t0, b0, b1, p, acc, out, col, osc):
        """Unweighted sum/mean, exact terms, no overflow possible: acc += row, shift at the end.
        Returns 1 at the first index outside the table (nothing read there), else 0."""
        dim = table.shape[1]
        nrows = table.shape[0]
        pad = p[_P_PAD]
        sh = p[_P_SHIFT]
        ahead = p[_P_AHEAD]
        lim = off[t0 + b1]  # prefetch across bags, through the chunk's whole index stream
        for b in range(b0, b1):
            s = off[t0 + b]
            e = off[t0 + b + 1]
            for d in range(dim):
                acc[d] = 0
            n = 0
            for j in range(s, e):
                if ahead and j + ahead < lim:
                    prefetch_row(table, idx[j + ahead])
                r = idx[j]
                if r < 0 or r >= nrows:
                    return 1
                if r == pad:
                    continue
                n += 1
                for d in range(dim):
                    acc[d] += table[r, d]
            finish(acc, dim, sh, n, p, out, b, col, osc)
        return 0

    @numba.njit(nogil=True, cache=True)
    def bags_general(table, params, rowwise, idx, off, w, weighted, t0, b0, b1, p, acc, out, col, osc):
        """Every other case: per-element term cast, per-step accumulator fit, max. Returns 1 at the
        first index outside the table or weight outside weight_type (nothing read there), else 0."""
        dim = table.shape[1]
        nrows = table.shape[0]
        wlo = p[_P_WLO]
        whi = p[_P_WHI]
        pad = p[_P_PAD]
        mode = p[_P_MODE]
        fitacc = p[_P_FITACC]
        exact = p[_P_TERM + _C_KIND] == _EXACT
        tsh = p[_P_TERM + _C_SHIFT]
        ahead = p[_P_AHEAD]
        lim = off[t0 + b1]  # prefetch across bags, through the chunk's whole index stream
        for b in range(b0, b1):
            s = off[t0 + b]
            e = off[t0 + b + 1]
            for d in range(dim):
                acc[d] = 0
            n = 0
            for j in range(s, e):
                if ahead and j + ahead < lim:
                    prefetch_row(table, idx[j + ahead])
                r = idx[j]
                if r < 0 or r >= nrows:
                    return 1
                wj = np.int64(w[j]) if weighted else np.int64(1)
                if wj < wlo or wj > whi:
                    return 1
                if r == pad:
                    continue
                sc = np.int64(params[r, 0]) if rowwise else np.int64(1)
                bi = np.int64(params[r, 1]) if rowwise else np.int64(0)
                if exact and mode != 2 and not fitacc:
                    for d in range(dim):
                        acc[d] += ((np.int64(table[r, d]) * sc + bi) * wj) << tsh
                else:
                    for d in range(dim):
                        t = cast((np.int64(table[r, d]) * sc + bi) * wj, p, _P_TERM)
                        if mode == 2:
                            if n == 0 or t > acc[d]:
                                acc[d] = t
                        elif fitacc:
                            acc[d] = fit(acc[d] + t, p, _P_ACC)
                        else:
                            acc[d] += t
                n += 1
            finish(acc, dim, 0, n, p, out, b, col, osc)
        return 0

    # One chunk of bags per row of ``scratch`` (_CHUNKS_PER_THREAD per thread); the chunks'
    # accumulator rows never share a cache line (_scratch), so two threads never write one line.
    @numba.njit(nogil=True, cache=True, parallel=True)
    def par_plain(table, idx, off, t0, nb_, p, scratch, out, col, osc):
        nc = scratch.shape[0]
        bad = 0
        for c in numba.prange(nc):
            bad += bags_plain(table, idx, off, t0, c * nb_ // nc, (c + 1) * nb_ // nc, p, scratch[c], out, col, osc)
        return bad

    @numba.njit(nogil=True, cache=True, parallel=True)
    def par_general(table, params, rowwise, idx, off, w, weighted, t0, nb_, p, scratch, out, col, osc):
        nc = scratch.shape[0]
        bad = 0
        for c in numba.prange(nc):
            bad += bags_general(table, params, rowwise, idx, off, w, weighted, t0, c * nb_ // nc, (c + 1) * nb_ // nc,
                                p, scratch[c], out, col, osc)
        return bad

    @numba.njit(nogil=True, cache=True)
    def offsets_ok(off, n, max_bag):
        """``validate()``'s offsets rules (start 0, never decrease, end at n), and bags <= max_bag,
        the bound the plan's overflow proofs assume."""
        if off[0] != 0 or off[off.shape[0] - 1] != n:
            return False
        for i in range(off.shape[0] - 1):
            d = off[i + 1] - off[i]
            if d < 0 or d > max_bag:
                return False
        return True

    @numba.njit(nogil=True, cache=True)
    def inputs_ok(idx, off, rows, nb):
        """``validate()``'s offsets and index rules in one pass: offsets start at 0, never
        decrease and end at ``len(idx)``; table ``t``'s indices (bags ``t*nb`` to ``(t+1)*nb``) lie
        in ``[0, rows[t])``."""
        if not offsets_ok(off, idx.shape[0], idx.shape[0]):
            return False
        for t in range(rows.shape[0]):
            lim = rows[t]
            for j in range(off[t * nb], off[(t + 1) * nb]):
                if idx[j] < 0 or idx[j] >= lim:
                    return False
        return True


# ------------------------------------------------------------------------------------------- run

_EMPTY_PARAMS = np.zeros((0, 2), dtype=np.int64)
_EMPTY_W = np.zeros(0, dtype=np.int64)
_ONE32 = np.float32(1.0)  # the scale argument of a raw (int64) call, which ignores it


def _scratch(nc: int, dim: int, dtype) -> np.ndarray:
    """``nc`` accumulator rows of ``dim`` entries (and padding) no two of which share a 64-byte cache
    line: rows are a whole number of cache lines plus one apart, whatever the buffer's alignment
    (reading the address to align it, ``.ctypes.data``, costs ~2 us)."""
    itemsize = np.dtype(dtype).itemsize
    stride = (-(-dim * itemsize // 64) + 1) * 64 // itemsize
    return np.empty((nc, stride), dtype=dtype)


# Chunks of bags per thread in a parallel call. Measured on the 2 shared cores, 2 threads, best of 40
# windows: 4 per thread against 1, 4096 x 20: 468 against 629 us, 256 x 20: 35 against 43 us,
# 64 x 100: 54 against 60 us (a thread that loses its core for a while leaves less undone).
_CHUNKS_PER_THREAD = 4


def _call_table(tp: _TablePlan, table, params, idx, off, w, t0, B, out, col, osc, nthreads):
    """One table's bags; ``nthreads`` > 1 runs the parallel kernel on that many threads."""
    parallel = nthreads > 1
    nc = min(nthreads * _CHUNKS_PER_THREAD, B) if parallel else 1
    dim = table.shape[1]
    if tp.plain and w is None:
        if not parallel:
            return bags_plain(table, idx, off, t0, 0, B, tp.params, np.empty(dim, np.int32 if tp.acc32 else np.int64), out, col, osc)
        scratch = _scratch(nc, dim, np.int32 if tp.acc32 else np.int64)
        return par_plain(table, idx, off, t0, B, tp.params, scratch, out, col, osc)
    weighted = w is not None
    p = tp.params_w if weighted else tp.params
    rowwise = params is not None
    params = params if rowwise else _EMPTY_PARAMS
    w = w if weighted else _EMPTY_W
    if not parallel:
        return bags_general(table, params, rowwise, idx, off, w, weighted, t0, 0, B, p, np.empty(dim, np.int64), out, col, osc)
    return par_general(table, params, rowwise, idx, off, w, weighted, t0, B, p, _scratch(nc, dim, np.int64), out, col, osc)


_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
# Weight dtypes whose conversion to int64 keeps every value (uint64 could wrap past the range check).
_WEIGHT_DTYPES = tuple(np.dtype(d) for d in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32))


def _shape_ok(p: Pooling, idx, off, w) -> bool:
    """The cheap part of the input checks (types, dtypes, ranks, lengths); the data rules run in the kernels."""
    if type(idx) is not np.ndarray or type(off) is not np.ndarray:
        return False
    if idx.dtype not in _INDEX_DTYPES or off.dtype not in _INDEX_DTYPES or idx.ndim != 1 or off.ndim != 1:
        return False
    if off.shape[0] < 1 or (off.shape[0] - 1) % len(p.tables):
        return False
    if w is not None:
        if p.mode != "sum" or type(w) is not np.ndarray or w.dtype not in _WEIGHT_DTYPES or w.shape != idx.shape:
            return False
    return True


# Below this many gathered elements (lookups x dim) a call runs serially even with threads: a
# parallel launch costs more than it saves (measured: 64 x 20 x 64 ran 0.98x torch on 2 threads
# in parallel against 1.17x torch on 1 thread serially). Like torch's parallel_for grain size.
# Re-measured once the parallel call lost its ~6 us of Python (aligned scratch, no numba thread-count
# calls): 64 x 20 x 64 (81920) parallel 15.6-21.6 us against serial 16.3-19.4 us, 64 x 100 x 64
# 37.5 against 56.6 us, on the 2 shared cores: the crossover is still about here.
PARALLEL_MIN = 1 << 17
# numba.set_num_threads refuses more than its pool (NUMBA_NUM_THREADS, fixed at import).
_MAX_THREADS = numba.config.NUMBA_NUM_THREADS if numba is not None else 1


def run(p: Plan, tables: Sequence[np.ndarray], params: Sequence[np.ndarray | None], indices: np.ndarray,
        offsets: np.ndarray, weights: np.ndarray | None = None, fp32: bool = False) -> np.ndarray | None:
    """Raw ``out_type``, int64, ``B x total_dim``: :func:`~offload.sim.embedding.reference.lookup`
    of the same arguments bit for bit (``fp32``: each raw value ``v`` written as
    ``float32(v) * p.scale32``, float32, for a plan whose ``scale32`` is set), or None where this path does not answer: an unsupported
    plan, numba missing (warned once), or inputs that break a rule (a dtype, a length, offsets that
    do not start at 0, decrease or miss the end, a bag longer than ``max_bag_size``, an index
    outside its table, a weight outside ``weight_type``). Those rules are checked in Python (the
    cheap ones) and in the compiled loops, before any table read they guard; on None the caller
    checks the inputs itself and runs the reference.

    ``tables[t]``/``params[t]``: as ``lookup`` takes them, holding raw values inside their types.
    """
    return _run(p, tables, params, indices, offsets, weights, PARALLEL_MIN, fp32)


def _run(p: Plan, tables, params, idx, off, w, parallel_min: int, fp32: bool = False) -> np.ndarray | None:
    pooling = p.pooling
    if fp32 and p.scale32 is None:
        raise ValueError(f"fp32: out_type {pooling.out_type} has F outside [0, 126]; its float32 output is not a scaled copy")
    if not p.supported or _NUMBA is None:
        if _NUMBA is None:
            _warn_once()
        return None
    if not _shape_ok(pooling, idx, off, w):
        return None
    if not (idx.flags.c_contiguous and idx.dtype.isnative):  # else a new variant would compile mid-request
        idx = np.ascontiguousarray(idx, dtype=idx.dtype.newbyteorder("="))
    if off.dtype != np.int64:
        off = off.astype(np.int64)
    if w is not None and w.dtype != np.int64:
        w = w.astype(np.int64)
    # The plan's overflow and int32 proofs hold for bags up to max_bag_size: checked for every call.
    if not offsets_ok(off, idx.shape[0], pooling.max_bag_size):
        return None
    T = len(pooling.tables)
    B = (off.shape[0] - 1) // T
    total_dim = pooling.total_dim
    out = np.empty((B, total_dim), dtype=np.float32 if fp32 else np.int64)
    osc = p.scale32 if fp32 else _ONE32
    if B == 0:
        return out
    nthreads = min(_threads.get(), _MAX_THREADS)
    if nthreads > 1 and not (B > 1 and idx.shape[0] * total_dim >= parallel_min and _parallel_lock.acquire(blocking=False)):
        nthreads = 1
    bad = 0
    prev = 0
    try:
        if nthreads > 1:
            _start_pool()
            # numba's thread count is per calling thread; setting it costs ~1 us, so only when it differs
            # (set_num_threads inside the compiled code would make the kernels uncacheable).
            prev = _NUMBA.get_num_threads()
            if prev != nthreads:
                _NUMBA.set_num_threads(nthreads)
        for t, tp in enumerate(p.tables):
            bad += _call_table(tp, tables[t], params[t], idx, off, w, t * B, B, out, tp.col, osc, nthreads)
    finally:
        if nthreads > 1:
            if prev != nthreads:
                _NUMBA.set_num_threads(prev)
            _parallel_lock.release()
    return None if bad else out


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn("offload.sim.embedding.fused: numba is not installed; using the reference "
                      "(slower, same results)", RuntimeWarning, stacklevel=4)


def warm_up(p: Plan, tables: Sequence[np.ndarray], params: Sequence[np.ndarray | None]) -> float:
    """Compile (or load from numba's disk cache) every variant ``p`` can call on these arrays, for
    both index dtypes, serial and parallel, raw and (where the plan has ``scale32``) float32 out;
    returns the seconds it took (0 when nothing was left to do)."""
    if not p.supported or _NUMBA is None:
        return 0.0
    t0 = time.perf_counter()
    T = len(p.tables)
    for idx_dt in (np.int64, np.int32):
        for weighted in ((False, True) if p.pooling.mode == "sum" else (False,)):
            for threads in (1, 2):
                for fp32 in ((False, True) if p.scale32 is not None else (False,)):
                    B = 2
                    w = np.zeros(0, dtype=np.int64) if weighted else None
                    with using_threads(threads):
                        _run(p, tables, params, np.zeros(0, dtype=idx_dt), np.zeros(T * B + 1, dtype=np.int64), w, 0, fp32)
        inputs_ok(np.zeros(0, dtype=idx_dt), np.zeros(T * 2 + 1, dtype=np.int64), np.ones(T, dtype=np.int64), 2)
    dt = time.perf_counter() - t0
    _jit_total[0] += dt
    return dt


# --------------------------------------------------------------------------------- native entry

# The same loops behind a C ABI, for a caller that holds raw pointers and no Python (the torch op's
# C++ kernel, offload/ops/native.py): numba.cfunc wrappers that view the caller's memory through
# numba.carray and call bags_plain / bags_general, so the compiled path stays one. The ABI, for
# one table, unweighted, serial, float32 out (``scale32`` set):
#
#   int64_t f(const T* table, const int64_t* ctx, const I* idx, int64_t n, const int64_t* off,
#             int64_t noff, float* out, void* scratch)
#
# ``out`` is ``(noff - 1) x dim``, ``scratch`` holds ``dim`` int64s, ``ctx`` is NativeEntry.ctx.
# 0: ``out`` written; anything else: not answered (a rule broken, the entry closed), nothing to
# trust in ``out``: the caller runs the Python path, which raises the rule's own error.
_N_ALIVE, _N_ROWS, _N_DIM, _N_MAXBAG, _N_F = range(5)
_N_P = 5  # the table's parameter vector follows
_N_LEN = _N_P + _P_LEN

if numba is not None:

    @numba.njit(nogil=True)
    def _native_bags(ctx, off_p, noff, n):
        """The call's bag count, or -1 where the entry declines it (closed, no offsets, offsets
        that break a rule): what both C-ABI bodies check before their loop."""
        if ctx[_N_ALIVE] == 0 or noff < 1 or not offsets_ok(numba.carray(off_p, noff), n, ctx[_N_MAXBAG]):
            return -1
        return noff - 1


def _native_plain(table_p, ctx_p, idx_p, n, off_p, noff, out_p, acc_p):  # pragma: no cover - compiled
    ctx = numba.carray(ctx_p, _N_LEN)
    B = _native_bags(ctx, off_p, noff, n)
    if B <= 0:
        return 0 if B == 0 else 1
    off, dim = numba.carray(off_p, noff), ctx[_N_DIM]
    return bags_plain(numba.carray(table_p, (ctx[_N_ROWS], dim)), numba.carray(idx_p, n), off, 0, 0, B, ctx[_N_P:],
                      numba.carray(acc_p, dim), numba.carray(out_p, (B, dim)), 0, np.float32(2.0 ** -ctx[_N_F]))


def _native_general(table_p, ctx_p, idx_p, n, off_p, noff, out_p, acc_p):  # pragma: no cover - compiled
    ctx = numba.carray(ctx_p, _N_LEN)
    B = _native_bags(ctx, off_p, noff, n)
    if B <= 0:
        return 0 if B == 0 else 1
    off, dim = numba.carray(off_p, noff), ctx[_N_DIM]
    # No row-wise params and no weights: empty views stand in for them, as _EMPTY_PARAMS/_EMPTY_W do.
    return bags_general(numba.carray(table_p, (ctx[_N_ROWS], dim)), numba.carray(ctx_p, (0, 2)), False, numba.carray(idx_p, n),
                        off, numba.carray(ctx_p, 0), False, 0, 0, B, ctx[_N_P:], numba.carray(acc_p, dim),
                        numba.carray(out_p, (B, dim)), 0, np.float32(2.0 ** -ctx[_N_F]))


@dataclass
class NativeEntry:
    """One table's C-ABI lookup (see the ABI above): ``address[np.dtype]`` of the function for
    that index dtype (int32, int64), the table and ``ctx`` it is called with (kept alive here),
    ``dim`` output columns, and ``serial_max``: calls of at least this many gathered elements
    belong to the threaded path when threads are on. :meth:`close` makes every later call decline."""

    address: dict
    table: np.ndarray
    ctx: np.ndarray
    dim: int
    serial_max: int

    def close(self) -> None:
        self.ctx[_N_ALIVE] = 0


def native_entry(p: Plan, tables: Sequence[np.ndarray], params: Sequence[np.ndarray | None]) -> NativeEntry | None:
    """The C-ABI entry of a one-table plan's unweighted float32 calls (compiled here, or loaded
    from numba's disk cache), or None where it has none: numba missing, an unsupported plan,
    several tables, row-wise params, no ``scale32``, a table that is not one C-contiguous block.

    Example::

        e = native_entry(p, [table], [None])
        fn = e.address[np.dtype(np.int64)]   # call from C with e.table, e.ctx, ...
    """
    if _NUMBA is None or not p.supported or p.scale32 is None or len(p.tables) != 1 or params[0] is not None:
        return None
    table = tables[0]
    if table.ndim != 2 or not table.flags.c_contiguous or not table.dtype.isnative or table.dtype.kind not in "iu":
        return None
    tp = p.tables[0]
    ctx = np.zeros(_N_LEN, dtype=np.int64)
    ctx[_N_ALIVE] = 1
    ctx[_N_ROWS], ctx[_N_DIM] = table.shape
    ctx[_N_MAXBAG] = p.pooling.max_bag_size
    ctx[_N_F] = p.pooling.out_type.F
    ctx[_N_P:] = tp.params
    body = _native_plain if tp.plain else _native_general
    acc = types.int32 if tp.plain and tp.acc32 else types.int64
    t0 = time.perf_counter()
    address = {idx_dt: _cfunc(body, table.dtype, np.dtype(idx_dt), acc).address for idx_dt in _INDEX_DTYPES}
    _jit_total[0] += time.perf_counter() - t0
    return NativeEntry(address, table, ctx, int(table.shape[1]), PARALLEL_MIN)


# Every C-ABI function made, by (body, table dtype, index dtype, accumulator type): made once per
# process, and kept here, since a caller holds only its address (the CFunc object owns the code).
_CFUNCS: dict = {}
_CFUNCS_LOCK = threading.Lock()


def _cfunc(body, table_dt: np.dtype, idx_dt: np.dtype, acc):
    key = (body, table_dt, idx_dt, acc)
    with _CFUNCS_LOCK:
        f = _CFUNCS.get(key)
        if f is None:
            sig = types.int64(types.CPointer(numba.from_dtype(table_dt)), types.CPointer(types.int64),
                              types.CPointer(numba.from_dtype(idx_dt)), types.int64, types.CPointer(types.int64), types.int64,
                              types.CPointer(types.float32), types.CPointer(acc))
            f = _CFUNCS[key] = numba.cfunc(sig, nogil=True, cache=True)(body)
        return f

"""The fused compiled embedding path against the step-by-step reference (the oracle): zero mismatches."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from offload.host.sim import SimDevice
from offload.kernels import catalogue, get_kind
from offload.kernels.embedding import ROWWISE, TableSpec, make_kernel, make_spec
from offload.sim.fixed import FixedType
from offload.kernels.embedding import fused_plan, lookup_of
from offload.sim import embedding as E
from offload.sim.embedding import fused as F
from offload.sim.layout import aligned_copy

from _embedding_harness import SPECS, make_case, random_tables

KIND = get_kind("embedding")


@pytest.fixture(autouse=True)
def _parallel_even_for_small_calls(monkeypatch):
    """The cases here are small; make threads > 1 really take the parallel kernels."""
    monkeypatch.setattr(F, "PARALLEL_MIN", 0)


def _run(spec, tensors, inputs):
    """The fused path alone (None where it leaves the call to the reference)."""
    tables, params = lookup_of(spec).arrays(tensors)
    return F.run(fused_plan(spec), tables, params, inputs["indices"], inputs["offsets"], inputs.get("per_sample_weights"))


def _check(spec, tensors, inputs, threads=(1, 2)):
    KIND.validate(spec, tensors, inputs)
    ref = KIND.reference(spec, tensors, inputs)["out"]
    p = fused_plan(spec)
    assert p.supported, p.reason
    for th in threads:
        with F.using_threads(th):
            got = _run(spec, tensors, inputs)
        assert got.dtype == np.int64 and got.shape == ref.shape
        bad = np.argwhere(got != ref)
        assert bad.size == 0, f"{len(bad)} mismatches at threads={th}, first {bad[:3].tolist()}: {got[tuple(bad[0])]} != {ref[tuple(bad[0])]}"
    return ref


@pytest.mark.parametrize("name", sorted(SPECS))
def test_harness_specs_match_reference(name):
    spec = SPECS[name]()
    # crc32, not hash(): str hashes change with every process (PYTHONHASHSEED), so the cases did
    # too; 1 of 400 seeds tried for mixed-max draws a row-wise row whose bias ap_fixed<20,3> cannot hold.
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    k = make_kernel("k", spec, random_tables(rng, spec))
    for weighted, pad_frac, B in itertools.product((False, True) if spec.mode == "sum" else (False,), (0.0, 0.3), (0, 1, 9, 200)):
        inputs = make_case(rng, spec, B, spec.max_bag_size, weighted=weighted, pad_frac=pad_frac)
        if B % 2:  # int32 indices, offsets and weights on odd batches
            inputs = {key: v.astype(np.int32) for key, v in inputs.items()}
        _check(spec, k.tensors, inputs)


def test_overflowing_cases_exercise_every_cast():
    """The narrow-accumulator specs really saturate / wrap / round here (else the test proves little)."""
    spec = SPECS["wrap-acc"]()
    rng = np.random.default_rng(1)
    k = make_kernel("k", spec, [np.full((20, 4), 7.9)])
    inputs = make_case(rng, spec, 50, spec.max_bag_size, weighted=True)
    ref = _check(spec, k.tensors, inputs)
    assert fused_plan(spec).tables[0].params_w[F._P_FITACC] == 1
    assert ref.min() < 0 < ref.max()  # wrap-around of all-positive sums produced negatives


_ROUNDINGS = ("AP_TRN", "AP_TRN_ZERO", "AP_RND", "AP_RND_ZERO", "AP_RND_MIN_INF", "AP_RND_INF", "AP_RND_CONV")
_OVERFLOWS = ("AP_WRAP", "AP_SAT", "AP_SAT_ZERO", "AP_SAT_SYM")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("fmt", ["ap_fixed<8,4>", ROWWISE])
def test_every_rounding_and_overflow_mode(mode, fmt):
    """Accumulator and output types over all rounding x overflow modes, narrow enough to round,
    saturate and wrap: terms (products with 2^-6 weights) lose bits, bags of 16 overflow."""
    rng = np.random.default_rng(7)
    pt = "ap_fixed<12,5>" if fmt == ROWWISE else None
    tables = [TableSpec("a", 20, 3, fmt, pt, padding_idx=2)]
    for (r1, o1), (r2, o2) in zip(itertools.product(_ROUNDINGS, _OVERFLOWS), itertools.product(reversed(_ROUNDINGS), _OVERFLOWS)):
        acc = f"ap_fixed<10,5,{r1},{o1}>"
        out = f"ap_ufixed<7,3,{r2},{o2}>" if o1 == "AP_SAT" else f"ap_fixed<9,3,{r2},{o2}>"
        spec = make_spec(tables, mode=mode, max_bag_size=16, acc_type=acc, out_type=out, weight_type="ap_fixed<8,2>")
        k = make_kernel("k", spec, [rng.uniform(-7.9, 7.9, (20, 3))])
        inputs = make_case(rng, spec, 40, 16, weighted=(mode == "sum"), pad_frac=0.1)
        _check(spec, k.tensors, inputs, threads=(1,))


def test_output_wider_than_accumulator_and_unsigned_accumulator():
    rng = np.random.default_rng(3)
    for acc, out in (("ap_fixed<20,8>", "ap_fixed<40,10,AP_RND,AP_SAT>"), ("ap_ufixed<12,6,AP_RND_CONV,AP_WRAP>", "ap_fixed<16,4,AP_RND,AP_SAT>")):
        spec = make_spec([TableSpec("a", 30, 5, "ap_fixed<12,5>")], mode="sum", max_bag_size=8, acc_type=acc, out_type=out)
        k = make_kernel("k", spec, [rng.uniform(-15, 15, (30, 5))])
        _check(spec, k.tensors, make_case(rng, spec, 30, 8, weighted=True))
        _check(spec, k.tensors, make_case(rng, spec, 30, 8))


def test_long_bags_at_the_exact_accumulator_bound():
    """Bags of max length of the extreme row: the default accumulator's bound is met with no
    overflow; int16 values in int32 partial sums, wide int32 tables in int64."""
    for fmt, bag in (("ap_fixed<16,6>", 2048), ("ap_fixed<32,16>", 300)):
        spec = make_spec([TableSpec("a", 4, 8, fmt)], mode="sum", max_bag_size=bag)
        t = spec.tables[0].value_type()
        k = make_kernel("k", spec, [np.array([[t.max_float] * 8, [t.min_float] * 8, [0.5] * 8, [-0.25] * 8])])
        idx = np.concatenate([np.zeros(bag), np.ones(bag), np.arange(bag) % 4]).astype(np.int64)
        inputs = {"indices": idx, "offsets": np.array([0, bag, 2 * bag, 3 * bag], dtype=np.int64)}
        ref = _check(spec, k.tensors, inputs)
        assert ref[0, 0] == bag * t.max_raw << (spec.acc_type.F - t.F)
        assert fused_plan(spec).tables[0].acc32 == (fmt == "ap_fixed<16,6>")


def test_int32_partial_sums_only_under_the_format_bound():
    """A plain table accumulates in int32 only while max_bag_size * max|raw| < 2**31; at the bound
    the longest bags of the extreme rows sum exactly; a bag past max_bag_size leaves the fused path."""
    vt = FixedType.parse("ap_fixed<16,6>")  # max|raw| = 2**15
    assert F.acc32_ok(65535, vt) and not F.acc32_ok(65536, vt)
    assert not fused_plan(make_spec([TableSpec("a", 2, 4, str(vt))], max_bag_size=65536)).tables[0].acc32
    bag = 65535
    spec = make_spec([TableSpec("a", 2, 4, str(vt))], mode="sum", max_bag_size=bag)
    assert fused_plan(spec).tables[0].acc32
    k = make_kernel("k", spec, [np.array([[vt.max_float] * 4, [vt.min_float] * 4])])
    idx = np.concatenate([np.zeros(bag), np.ones(bag)]).astype(np.int64)
    got = _run(spec, k.tensors, {"indices": idx, "offsets": np.array([0, bag, 2 * bag], dtype=np.int64)})
    sh = spec.acc_type.F - vt.F
    assert got[:, 0].tolist() == [(bag * vt.max_raw) << sh, (bag * vt.min_raw) << sh]
    small = make_spec([TableSpec("a", 2, 4, str(vt))], mode="sum", max_bag_size=4)
    ks = make_kernel("k", small, [np.array([[vt.max_float] * 4, [vt.min_float] * 4])])
    longer = {"indices": np.zeros(5, dtype=np.int64), "offsets": np.array([0, 5], dtype=np.int64)}
    assert _run(small, ks.tensors, longer) is None
    assert np.array_equal(KIND.run_checked(small, ks.tensors, longer)["out"], KIND.reference(small, ks.tensors, longer)["out"])


def test_catalogue_entries_match_reference():
    for e in catalogue.entries("emb/"):
        case = e.build()
        _check(case.kernel.spec, case.kernel.tensors, case.inputs)


def test_unsupported_cast_runs_the_reference():
    spec = make_spec([TableSpec("a", 10, 2, "ap_fixed<8,4>")], mode="sum", max_bag_size=4, out_type="ap_ufixed<64,40>")
    p = fused_plan(spec)
    assert not p.supported and "64-bit unsigned" in p.reason
    k = make_kernel("k", spec, [np.random.default_rng(0).uniform(0, 7, (10, 2))])
    inputs = {"indices": np.array([1, 2, 3], dtype=np.int64), "offsets": np.array([0, 1, 3], dtype=np.int64)}
    assert _run(spec, k.tensors, inputs) is None
    got = KIND.run_checked(spec, k.tensors, inputs)["out"]
    ref = KIND.reference(spec, k.tensors, inputs)["out"]
    assert got.dtype == ref.dtype and np.array_equal(got, ref)


def test_without_numba_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(F, "_NUMBA", None)
    monkeypatch.setattr(F, "_warned", False)
    spec = SPECS["mixed-mean"]()
    rng = np.random.default_rng(5)
    k = make_kernel("k", spec, random_tables(rng, spec))
    inputs = make_case(rng, spec, 20, spec.max_bag_size, pad_frac=0.2)
    want = KIND.reference(spec, k.tensors, inputs)["out"]
    calls = []
    real = E.lookup

    def lookup(*a):
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(E, "lookup", lookup)  # the step-by-step reference, as the kind calls it
    with pytest.warns(RuntimeWarning, match="numba is not installed"):
        got = KIND.run_checked(spec, k.tensors, inputs)["out"]
    assert calls and np.array_equal(got, want)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KIND.run_checked(spec, k.tensors, inputs)  # warned once only
    tables, params = lookup_of(spec).arrays(k.tensors)
    assert len(calls) == 2 and F.warm_up(fused_plan(spec), tables, params) == 0.0


def test_aligned_copy():
    a = np.arange(1000, dtype=np.int16).reshape(100, 10)
    for align in (None, 64, 4096):
        c = aligned_copy(a, align)
        assert c.ctypes.data % (align or 64) == 0 and np.array_equal(c, a) and c.flags.c_contiguous
    big = np.zeros((1 << 19, 2), dtype=np.int16)  # 2 MiB: page-aligned by default
    assert aligned_copy(big).ctypes.data % 4096 == 0


def test_sim_device_aligns_warms_and_runs_fused():
    spec = SPECS["mixed-mean"]()
    rng = np.random.default_rng(11)
    k = make_kernel("k", spec, random_tables(rng, spec))
    dev = SimDevice()
    h = dev.load(k)
    resident = dev._get(h)
    assert all(v.ctypes.data % 64 == 0 and not v.flags.writeable for v in resident.tensors.values())
    assert dev.info().details["jit_s"] > 0
    # load() compiled every variant before any run: runs with either index dtype, serial or
    # threaded, add no signature to any dispatcher.
    disp = (F.bags_plain, F.bags_general, F.par_plain, F.par_general)
    before = [len(d.signatures) for d in disp]
    for dt, th in itertools.product((np.int64, np.int32), (1, 2)):
        inputs = {key: v.astype(dt) for key, v in make_case(rng, spec, 33, spec.max_bag_size, pad_frac=0.2).items()}
        with F.using_threads(th):
            assert np.array_equal(dev.run(h, inputs)["out"], KIND.reference(spec, k.tensors, inputs)["out"])
    assert [len(d.signatures) for d in disp] == before
    with pytest.raises(IndexError):
        dev.run(h, {"indices": np.array([999]), "offsets": np.array([0, 1, 1, 1, 1])})
    dev.close()


def test_sim_device_load_copies_tables_once():
    """The resident copy is the aligned one: load() allocates one table's worth, not two."""
    import tracemalloc

    spec = make_spec([TableSpec("t0", 1 << 15, 32, "ap_fixed<16,6>")], max_bag_size=8)
    k = make_kernel("k", spec, random_tables(np.random.default_rng(3), spec))
    table_bytes = sum(v.nbytes for v in k.tensors.values())
    dev = SimDevice()
    dev.load(k)  # numba's cache and dispatcher state settle outside the measurement
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        h = dev.load(k)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert table_bytes <= peak < 1.5 * table_bytes
    k.tensors["table0"][...] = 0  # the caller's array is not the device's copy
    assert dev._get(h).tensors["table0"].any()
    dev.close()


def test_parallel_calls_from_two_threads_agree():
    """Concurrent callers: one runs parallel, the other serially (never two parallel launches)."""
    from concurrent.futures import ThreadPoolExecutor

    spec = SPECS["fixed-sum"]()
    rng = np.random.default_rng(2)
    k = make_kernel("k", spec, random_tables(rng, spec))
    cases = [make_case(rng, spec, 300, spec.max_bag_size, pad_frac=0.1) for _ in range(8)]
    refs = [KIND.reference(spec, k.tensors, c)["out"] for c in cases]

    def one(c):
        with F.using_threads(2):
            return _run(spec, k.tensors, c)

    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(one, cases * 3))
    assert all(np.array_equal(o, r) for o, r in zip(outs, refs * 3))


def test_device_checks_in_the_kernels_raise_validates_errors():
    """The sim device checks indices, weights and offsets inside the fused loops; every corrupted
    call must still raise exactly validate()'s error (type and message), wherever the bad element
    sits (padding entries and the last table included)."""
    spec = SPECS["fixed-sum"]()  # table a has padding_idx 7
    rng = np.random.default_rng(4)
    k = make_kernel("k", spec, random_tables(rng, spec))
    dev = SimDevice()
    h = dev.load(k)
    wt = spec.weight_type
    for trial in range(60):
        inputs = make_case(rng, spec, 6, spec.max_bag_size, weighted=trial % 2 == 1, pad_frac=0.3)
        n = inputs["indices"].shape[0]
        what = trial % 6
        if what == 0 and n:
            inputs["indices"][rng.integers(n)] = rng.choice([-1, 9, 50, 10**6])
        elif what == 1 and n and "per_sample_weights" in inputs:
            inputs["per_sample_weights"][rng.integers(n)] = rng.choice([wt.min_raw - 1, wt.max_raw + 1])
        elif what == 2:
            inputs["offsets"][rng.integers(1, len(inputs["offsets"]))] += rng.choice([-13, 13])
        elif what == 3:
            inputs["offsets"][0] = 1
        elif what == 4:
            inputs["indices"] = inputs["indices"][:-1] if n else np.array([0])
        else:
            inputs["offsets"] = inputs["offsets"][:-1]
        try:
            KIND.validate(spec, k.tensors, inputs)
        except (ValueError, IndexError, TypeError) as e:
            with pytest.raises(type(e)) as got:
                dev.run(h, inputs)
            assert str(got.value) == str(e)
        else:
            assert np.array_equal(dev.run(h, inputs)["out"], KIND.reference(spec, k.tensors, inputs)["out"])
    dev.close()


def test_strided_and_byte_swapped_indices():
    spec = SPECS["fixed-sum"]()
    rng = np.random.default_rng(8)
    k = make_kernel("k", spec, random_tables(rng, spec))
    inputs = make_case(rng, spec, 20, spec.max_bag_size, pad_frac=0.2)
    ref = KIND.reference(spec, k.tensors, inputs)["out"]
    strided = np.repeat(inputs["indices"], 2)[::2]
    swapped = inputs["indices"].astype(">i8")
    dev = SimDevice()
    h = dev.load(k)
    for idx in (strided, swapped):
        assert np.array_equal(dev.run(h, {"indices": idx, "offsets": inputs["offsets"]})["out"], ref)
    dev.close()


def _spy_threads(monkeypatch):
    """The thread count each table's kernel call gets (1: the serial kernel, more: the parallel one)."""
    seen = []
    real = F._call_table

    def spy(*a):
        seen.append(a[-1])
        return real(*a)

    monkeypatch.setattr(F, "_call_table", spy)
    return seen


@pytest.mark.parametrize("name,weighted", [("fixed-sum", False), ("fixed-sum", True), ("wrap-acc", True)])
def test_parallel_threshold_both_sides(monkeypatch, name, weighted):
    """With threads, calls under PARALLEL_MIN gathered elements run the serial kernel, calls at or
    over it the parallel one; both bit-exact, and a single-threaded call never goes parallel."""
    spec = SPECS[name]()
    rng = np.random.default_rng(5)
    k = make_kernel("k", spec, random_tables(rng, spec))
    inputs = make_case(rng, spec, 40, spec.max_bag_size, weighted=weighted, pad_frac=0.1)
    elements = inputs["indices"].shape[0] * spec.total_dim
    assert elements > 1
    seen = _spy_threads(monkeypatch)
    for threshold, threads, want in ((elements + 1, 2, 1), (elements, 2, min(2, F._MAX_THREADS)), (0, 1, 1)):
        monkeypatch.setattr(F, "PARALLEL_MIN", threshold)
        seen.clear()
        _check(spec, k.tensors, inputs, threads=(threads,))
        assert seen == [want] * spec.num_tables, (threshold, threads, seen)


def test_parallel_scratch_rows_never_share_a_cache_line():
    """No two threads' accumulator rows touch one 64-byte line, wherever the buffer starts (two
    threads adding into one cache line made a 2-chunk parallel call no faster than the serial one)."""
    for dim, dt in itertools.product((1, 3, 16, 64, 100), (np.int32, np.int64)):
        for nc in (1, 2, 3, 8):
            s = F._scratch(nc, dim, dt)
            assert s.shape[0] == nc and s.shape[1] >= dim and s.dtype == dt and s.flags.c_contiguous
            for c in range(nc - 1):
                last_line = (s[c].ctypes.data + dim * s.itemsize - 1) // 64
                assert s[c + 1].ctypes.data // 64 > last_line, (dim, dt, nc, c)


def test_parallel_call_restores_numbas_thread_count(monkeypatch):
    """The thread count is numba's per-thread setting; a parallel call sets it only for itself."""
    import numba

    monkeypatch.setattr(F, "PARALLEL_MIN", 0)
    spec = SPECS["fixed-sum"]()
    rng = np.random.default_rng(6)
    k = make_kernel("k", spec, random_tables(rng, spec))
    inputs = make_case(rng, spec, 30, spec.max_bag_size)
    prev = numba.get_num_threads()
    try:
        for start in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(start)
            _check(spec, k.tensors, inputs, threads=(2,))
            assert numba.get_num_threads() == start
    finally:
        numba.set_num_threads(prev)

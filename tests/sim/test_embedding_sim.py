"""The vectorised embedding reference (offload.sim.embedding via the kernel kind) against an
independent per-bag model built from offload.sim.fixed primitives, and against float maths within
bounds derived from the formats."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from offload.kernels import get_kind
from offload.kernels.embedding import ROWWISE, TableSpec, make_kernel, make_spec, rowwise_param_type
from offload.sim import embedding as E
from offload.sim.fixed import FixedType, accumulate, add, mul

from _embedding_harness import SPECS, make_case as _case, random_tables as _tables

KIND = get_kind("embedding")
U8 = FixedType.parse("ap_uint<8>")


def _slow_reference(spec, tensors, inputs):
    """One bag at a time with FixedType.cast / fixed.mul / fixed.add / fixed.accumulate (the
    per-step ``acc = acc_t(acc + t)`` loop), Python-int division for mean."""
    acc, out_t, wt = spec.acc_type, spec.out_type, spec.weight_type
    idx, off = inputs["indices"], inputs["offsets"]
    w = inputs.get("per_sample_weights")
    T = spec.num_tables
    B = (len(off) - 1) // T
    out = np.zeros((B, spec.total_dim), dtype=np.int64)
    for t, ts in enumerate(spec.tables):
        col = spec.col_offsets()[t]
        for b in range(B):
            lo, hi = int(off[t * B + b]), int(off[t * B + b + 1])
            rows = [k for k in range(lo, hi) if ts.padding_idx is None or idx[k] != ts.padding_idx]
            if not rows:
                continue
            ii = idx[rows]
            if ts.rowwise:
                pt = FixedType.parse(ts.param_type)
                p = tensors[f"params{t}"][ii].astype(np.int64)
                prod, prod_t = mul(tensors[f"table{t}"][ii].astype(np.int64), U8, p[:, 0:1], pt)
                v, vt = add(prod, prod_t, p[:, 1:2], pt)
            else:
                vt = FixedType.parse(ts.fmt)
                v = tensors[f"table{t}"][ii].astype(np.int64)
            if w is not None:
                v, vt = mul(v, vt, w[rows].astype(np.int64)[:, None], wt)
            terms = acc.cast(v, vt)
            if spec.mode == "max":
                r = terms.max(axis=0)
            else:
                r = accumulate(terms, acc, acc, axis=0)
                if spec.mode == "mean":
                    n = len(rows)
                    r = np.array([(1 if a >= 0 else -1) * ((2 * abs(int(a)) + n) // (2 * n)) for a in r], dtype=np.int64)
            out[b, col:col + ts.dim] = out_t.cast(r, acc)
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_vectorised_reference_matches_per_bag_model(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # stable across processes, unlike hash()
    spec = SPECS[name]()
    kernel = make_kernel("k", spec, _tables(rng, spec, scale=4.0 if "sat" in name or "wrap" in name else 1.0))
    for B, max_len, weighted in [(7, spec.max_bag_size, spec.mode == "sum"), (13, 3, False), (1, spec.max_bag_size, False), (0, 1, False)]:
        inputs = _case(rng, spec, B, max_len, weighted=weighted, pad_frac=0.3)
        KIND.validate(spec, kernel.tensors, inputs)
        got = KIND.reference(spec, kernel.tensors, inputs)["out"]
        want = _slow_reference(spec, kernel.tensors, inputs)
        assert got.shape == (B, spec.total_dim)
        np.testing.assert_array_equal(got, want)


def test_saturating_and_wrapping_accumulators_really_overflow():
    # The adversarial specs must exercise the paths they are named after, or the comparison above proves little.
    rng = np.random.default_rng(3)
    for name in ("sat-acc", "wrap-acc"):
        spec = SPECS[name]()
        kernel = make_kernel("k", spec, _tables(rng, spec, scale=4.0))
        inputs = _case(rng, spec, 20, spec.max_bag_size, weighted=True)
        wide = make_spec(spec.tables, mode="sum", max_bag_size=spec.max_bag_size, weight_type=spec.weight_type)
        narrow = KIND.reference(spec, kernel.tensors, inputs)["out"]
        exact = KIND.reference(wide, kernel.tensors, inputs)["out"]
        acc = spec.acc_type
        assert (acc.to_float(narrow) != wide.out_type.to_float(exact)).mean() > 0.2, name


def test_round_div_ties_away_from_zero():
    a = np.array([5, -5, 7, -7, 3, 0, -1, 1])
    n = np.array([2, 2, 2, 2, 0, 3, 2, 2])
    # 2.5 -> 3, -2.5 -> -3, 3.5 -> 4, -3.5 -> -4, n=0 -> 0, 0, -0.5 -> -1, 0.5 -> 1
    np.testing.assert_array_equal(E.round_div(a, n), [3, -3, 4, -4, 0, 0, -1, 1])


def _quant_err(ts: TableSpec, tensors, t):
    """Largest error of one stored element, per row: lsb/2 for rounding modes, lsb for truncation;
    int8_rowwise: scale/2 (codes round to nearest inside [bias, bias + 255*scale])."""
    if ts.rowwise:
        pt = FixedType.parse(ts.param_type)
        return pt.to_float(tensors[f"params{t}"][:, 0].astype(np.int64)) / 2
    ft = FixedType.parse(ts.fmt)
    e = ft.lsb if ft.rounding in ("AP_TRN", "AP_TRN_ZERO") else ft.lsb / 2
    return np.full(ts.num_rows, e)


@pytest.mark.parametrize("fmt", ["ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "ap_fixed<14,5>", ROWWISE])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_reference_close_to_float_within_derived_bound(fmt, mode):
    rng = np.random.default_rng(11)
    W = rng.standard_normal((64, 8)) * 2
    pt = rowwise_param_type(W) if fmt == ROWWISE else None
    spec = make_spec([TableSpec("a", 64, 8, fmt, pt, padding_idx=3)], mode=mode, max_bag_size=40)
    kernel = make_kernel("k", spec, [W])
    inputs = _case(rng, spec, 30, 40, weighted=False, pad_frac=0.2)
    wt = spec.weight_type
    w = None
    if mode == "sum":
        w = rng.uniform(-3, 3, inputs["indices"].shape[0])
        inputs["per_sample_weights"] = wt.quantize(w)
    got = spec.out_type.to_float(KIND.reference(spec, kernel.tensors, inputs)["out"])
    err = _quant_err(spec.tables[0], kernel.tensors, 0)
    acc, out_t = spec.acc_type, spec.out_type
    off = inputs["offsets"]
    for b in range(30):
        ii = inputs["indices"][off[b]:off[b + 1]]
        keep = ii != 3
        ii = ii[keep]
        if ii.size == 0:
            np.testing.assert_array_equal(got[b], 0)
            continue
        v = W[ii]
        if mode == "sum":
            wb = w[off[b]:off[b + 1]][keep]
            want = (v * wb[:, None]).sum(0)
            # |w_q e_q - w e| <= |w| de + |e| dw + de dw per term (dw = lsb_w/2, RND_CONV), plus
            # acc_t's rounding of each product (exact here: acc frac = value frac + weight frac).
            dw = wt.lsb / 2
            bound = (np.abs(wb)[:, None] * err[ii][:, None] + np.abs(v) * dw + err[ii][:, None] * dw).sum(0)
        elif mode == "mean":
            want = v.mean(0)
            # mean of the element errors, plus round_div's half lsb of acc_t.
            bound = err[ii].mean() + acc.lsb / 2
        else:
            want = v.max(0)
            # max is 1-Lipschitz in the sup norm.
            bound = np.full(8, err[ii].max())
        assert np.all(np.abs(got[b] - want) <= bound + 1e-12), (b, got[b] - want, bound)


def test_gather_and_drop_padding():
    idx = np.array([1, 3, 3, 0, 3])
    off = np.array([0, 2, 3, 5])
    i2, o2, keep = E.drop_padding(idx, off, 3)
    np.testing.assert_array_equal(i2, [1, 0])
    np.testing.assert_array_equal(o2, [0, 1, 1, 2])
    np.testing.assert_array_equal(keep, [0, 3])


# ------------------------------------------------------------------ sums at the raw range's ends


@pytest.mark.parametrize("mode, ragged, weighted", [
    ("sum", False, False), ("sum", True, False), ("sum", False, True), ("sum", True, True),
    ("mean", False, False), ("mean", True, False),
])
def test_extreme_raw_values_equal_the_per_bag_model(mode, ragged, weighted):
    # Extreme raw values (both ends of the range) so the sums reach max_bag_size * max|raw|.
    rng = np.random.default_rng(5)
    spec = make_spec([TableSpec("a", 300, 24, "ap_fixed<16,6,AP_RND_CONV,AP_SAT>")], mode=mode, max_bag_size=50)
    kernel = make_kernel("k", spec, [rng.standard_normal((300, 24)) * 20])  # many saturate to the raw ends
    tab = kernel.tensors["table0"]
    assert tab.min() == -2**15 and tab.max() == 2**15 - 1
    B = 150
    lens = rng.integers(0, 51, B) if ragged else np.full(B, 50)
    off = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    inputs = {"indices": rng.integers(0, 300, int(off[-1])), "offsets": off}
    if weighted:
        wt = spec.weight_type
        inputs["per_sample_weights"] = rng.choice([wt.min_raw, wt.max_raw, 1, -1], int(off[-1]))
    KIND.validate(spec, kernel.tensors, inputs)
    np.testing.assert_array_equal(KIND.reference(spec, kernel.tensors, inputs)["out"], _slow_reference(spec, kernel.tensors, inputs))


@pytest.mark.parametrize("width, bag", [(24, 2), (24, 3), (53, 2), (53, 3)])
def test_pool_bags_at_the_range_ends_is_exact(width, bag):
    # ap_int<width> values at both range ends, bags of `bag` entries; compared to Python-int sums.
    vt = FixedType.parse(f"ap_int<{width}>")
    acc = FixedType.parse("ap_int<62>")
    hi, lo = vt.max_raw, vt.min_raw
    rows = np.array([[hi, lo, hi, 3], [hi, lo, lo, 1], [hi, lo, 3, -3]] * bag, dtype=np.int64)[: 3 * bag]
    rows = rows.reshape(bag, 3, 4).transpose(1, 0, 2).reshape(3 * bag, 4)  # bag b = rows of pattern b
    off = np.arange(4, dtype=np.int64) * bag
    got = E.pool_bags(rows, vt, off, "sum", acc, acc)
    want = [[sum(int(x) for x in rows[off[b]:off[b + 1], j]) for j in range(4)] for b in range(3)]
    assert got.tolist() == want
    assert int(np.abs(got).max()) >= (bag - 1) * hi  # the sums really reach the bound

"""Row-wise partial output: shards of a table, combined then rounded once, equal the unsharded
kernel bit for bit (sum, mean with counts, max; weighted or not; every storage format), and the
generated HLS C++ computes the same partials (C-simulated)."""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
import pytest

from offload.hls import csim
from offload.kernels import get_kind
from offload.kernels.embedding import (
    ROWWISE,
    TableSpec,
    combine_partials,
    default_acc_type,
    make_kernel,
    make_spec,
    rowwise_param_type,
)
from offload.sim.errors import FormatOverflowError

from _embedding_harness import make_case, run_cpp

KIND = get_kind("embedding")
FORMATS = ["ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "ap_ufixed<10,3>", "ap_fixed<8,2>", ROWWISE]


def _table(fmt, w, pad):
    rows, dim = w.shape
    return TableSpec("t", rows, dim, fmt, rowwise_param_type(w) if fmt == ROWWISE else None, pad)


def _shard(kernel, r0, r1):
    """Rows [r0, r1) of a one-table kernel as a partial kernel (padding row moved or dropped)."""
    spec = kernel.spec
    ts = spec.tables[0]
    pad = ts.padding_idx
    pad = pad - r0 if pad is not None and r0 <= pad < r1 else None
    sspec = replace(spec, tables=(replace(ts, num_rows=r1 - r0, padding_idx=pad),), partial=True)
    tensors = {k: v[r0:r1] for k, v in kernel.tensors.items()}
    return sspec, tensors


def _route(inputs, r0, r1):
    idx, off = inputs["indices"].astype(np.int64), inputs["offsets"].astype(np.int64)
    keep = (idx >= r0) & (idx < r1)
    cum = np.concatenate(([0], np.cumsum(keep)))
    out = {"indices": idx[keep] - r0, "offsets": cum[off]}
    if "per_sample_weights" in inputs:
        out["per_sample_weights"] = inputs["per_sample_weights"][keep]
    return out


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_row_shards_combine_to_the_single_device_result(mode, fmt):
    # crc32, not hash(): str hashes change with PYTHONHASHSEED, so each run would draw other weights.
    rng = np.random.default_rng(zlib.crc32(f"{mode} {fmt}".encode()))
    rows, dim = 57, 6
    w = rng.standard_normal((rows, dim)) * 2
    if fmt.startswith("ap_ufixed"):
        w = np.abs(w)
    cuts = [0, 5, 13, 14, 40, rows]  # the padding row alone in one shard, a one-row shard
    mism = 0
    for weighted in ([False, True] if mode != "max" else [False]):
        # A weighted mean accumulates as the sum does (FBGEMM/TorchRec weighted means; embedding_spec(weighted_mean=True)).
        tables = [_table(fmt, w, 13)]
        acc = default_acc_type(tables, "sum", 40) if weighted else None
        spec = make_spec(tables, mode=mode, max_bag_size=40, acc_type=acc)
        kernel = make_kernel("k", spec, [w], on_overflow="saturate")
        inputs = make_case(rng, spec, 64, 40, weighted=weighted, pad_frac=0.2)
        want = KIND.reference(spec, kernel.tensors, inputs)["out"]
        accs, counts = [], []
        for r0, r1 in zip(cuts, cuts[1:]):
            sspec, tens = _shard(kernel, r0, r1)
            got = KIND.run_checked(sspec, tens, _route(inputs, r0, r1))
            ref = KIND.reference(sspec, tens, _route(inputs, r0, r1))
            assert (got["out"] == ref["out"]).all() and (got["count"] == ref["count"]).all()
            accs.append(got["out"])
            counts.append(got["count"][:, 0])
        out = combine_partials(spec, accs, counts)
        mism += int((out != want).sum())
    assert mism == 0


def test_a_saturated_partial_sum_is_refused_not_guessed():
    spec = make_spec([TableSpec("t", 4, 1, "ap_fixed<8,4>")], mode="sum", max_bag_size=4, acc_type="ap_fixed<8,4,AP_RND_CONV,AP_SAT>")
    big = np.full((1, 1), spec.acc_type.max_raw, dtype=np.int64)
    with pytest.raises(FormatOverflowError, match="acc_type"):
        combine_partials(spec, [big, big], [np.array([3]), np.array([3])])


@pytest.mark.skipif(not csim.ap_types_include().is_dir(), reason="ap_types headers missing")
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_cpp_partial_output_matches_the_simulator(mode):
    rng = np.random.default_rng(11)
    w0, w1 = rng.standard_normal((41, 5)), rng.standard_normal((23, 3))
    spec = make_spec([_table("ap_fixed<16,6,AP_RND_CONV,AP_SAT>", w0, 0), replace(_table(ROWWISE, w1, 22), name="r")],
                     mode=mode, max_bag_size=24, acc_type="ap_fixed<40,22,AP_RND_CONV,AP_SAT>" if mode == "mean" else None)
    spec = replace(spec, partial=True)
    kernel = make_kernel("k", spec, [w0, w1])
    for weighted in ([False, True] if mode != "max" else [False]):
        inputs = make_case(rng, spec, 9, 24, weighted=weighted, pad_frac=0.25)
        want = KIND.reference(spec, kernel.tensors, inputs)
        got = run_cpp(spec, kernel.tensors, inputs)
        assert int((got["out"] != want["out"]).sum()) == 0
        assert int((got["count"] != want["count"]).sum()) == 0

"""FBGEMM's ``feature_table_map`` in the embedding kind: a shared table is stored once and reads
exactly like a copy of it per feature; weighted means (FBGEMM's TBE) pool ``sum(w*row) / n``."""

from __future__ import annotations

import numpy as np
import pytest

from offload.host import open_device
from offload.kernels.embedding import EmbeddingSpec, TableSpec, make_kernel, make_spec, reference
from offload.sim.errors import FormatError

FMT = "ap_fixed<16,6>"


def _tables():
    rng = np.random.default_rng(0)
    return [TableSpec("a", 12, 4, FMT), TableSpec("b", 9, 2, FMT)], [rng.integers(-512, 512, (12, 4)) / 64, rng.integers(-512, 512, (9, 2)) / 64]


def _inputs(rng, ftm, rows, B=5, weighted=False):
    lens = rng.integers(0, 6, size=len(ftm) * B)
    idx = np.concatenate([rng.integers(0, rows[ftm[i // B]], size=n) for i, n in enumerate(lens)])
    out = {"indices": idx.astype(np.int64), "offsets": np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)}
    if weighted:
        out["per_sample_weights"] = rng.integers(-4096 * 4, 4096 * 4, size=idx.shape[0])
    return out


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_shared_tables_are_stored_once_and_read_like_copies(mode):
    tables, w = _tables()
    ftm = [0, 1, 0, 0]
    spec = make_spec(tables, mode=mode, feature_table_map=ftm)
    kernel = make_kernel("k", spec, w)
    assert sorted(kernel.tensors) == ["table0", "table1"]
    assert spec.num_features == 4 and spec.out_dim == 4 + 2 + 4 + 4
    # The same kernel written out with one (copied) table per feature.
    copies = make_spec([TableSpec(f"c{f}", tables[t].num_rows, tables[t].dim, FMT) for f, t in enumerate(ftm)], mode=mode,
                       acc_type=str(spec.acc_type))
    ck = make_kernel("c", copies, [w[t] for t in ftm])
    rng = np.random.default_rng(1)
    dev = open_device("sim")
    h = dev.load(kernel)
    for weighted in (False, True):
        inp = _inputs(rng, ftm, [12, 9], weighted=weighted)
        want = reference(copies, ck.tensors, inp)["out"]
        assert np.array_equal(reference(spec, kernel.tensors, inp)["out"], want)
        assert np.array_equal(dev.run(h, inp)["out"], want)  # the fused path on the shared tables
    assert EmbeddingSpec.from_json(spec.to_json()) == spec
    with pytest.raises(IndexError, match="out of range"):
        bad = _inputs(rng, ftm, [12, 9])
        bad["indices"] = bad["indices"].copy()
        b = int(bad["offsets"][5])  # feature 1 (table b, 9 rows) starts here
        if b < bad["offsets"][10]:
            bad["indices"][b] = 9
        else:
            bad["indices"][0] = 12
        dev.run(h, bad)


def test_weighted_mean_is_the_weighted_sum_over_the_bag_length():
    tables, w = _tables()
    spec = make_spec(tables[:1], mode="mean", acc_type="ap_fixed<48,24>")
    k = make_kernel("k", spec, w[:1])
    inp = {"indices": np.array([1, 2, 3, 4, 5]), "offsets": np.array([0, 3, 5]), "per_sample_weights": np.array([4096, 8192, -2048, 4096, 4096])}
    dev = open_device("sim")  # validate() and the sim device's checked path, as a call runs
    got = spec.out_type.to_float(dev.run(dev.load(k), inp)["out"])
    want = np.stack([(w[0][1] * 1 + w[0][2] * 2 - w[0][3] * 0.5) / 3, (w[0][4] + w[0][5]) / 2])
    # round_div: half an lsb of the accumulator from the exact mean.
    assert np.all(np.abs(got - want) <= 2.0 ** -(int(spec.out_type.F) + 1))


def test_feature_table_map_limits():
    tables, _ = _tables()
    with pytest.raises(ValueError, match="feature_table_map: table 2 outside"):
        make_spec(tables, feature_table_map=[0, 2])
    from offload.hls.embedding import sources

    with pytest.raises(FormatError, match="feature_table_map"):
        sources(make_spec(tables, feature_table_map=[0, 1, 0]))

"""Bad input: a clear typed error naming the field and the limit, before any device work, with the
resident tables unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import offload
from offload.ops.resident import get_resident
from offload.host import open_device
from offload.kernels.embedding import DEFAULT_MAX_BAG_SIZE, TableSpec, make_kernel, make_spec
from offload.sim.fixed import FixedType
from offload.sim.errors import (
    IndexDtypeError,
    IndexRangeError,
    OffloadError,
    OffsetsError,
    PerSampleWeightsDtypeError,
    UnsupportedError,
)


@pytest.fixture()
def loaded():
    spec = make_spec([TableSpec("users", 10, 4, "ap_fixed<16,6>", padding_idx=2),
                      TableSpec("items", 6, 3, "int8_rowwise", "ap_fixed<20,4,AP_RND_CONV,AP_SAT>")],
                     mode="sum", max_bag_size=4)
    rng = np.random.default_rng(0)
    kernel = make_kernel("k", spec, [rng.standard_normal((10, 4)), rng.standard_normal((6, 3))])
    dev = open_device("sim")
    h = dev.load(kernel)
    good = {"indices": np.array([1, 2, 9, 0, 5, 5], dtype=np.int64), "offsets": np.array([0, 2, 3, 5, 6], dtype=np.int64)}
    before = {k: v.copy() for k, v in dev._get(h).tensors.items()}
    baseline = dev.run(h, good)["out"].copy()
    yield dev, h, good
    # Nothing a rejected call did reached the device: tables and results are unchanged.
    for k, v in dev._get(h).tensors.items():
        np.testing.assert_array_equal(v, before[k])
    np.testing.assert_array_equal(dev.run(h, good)["out"], baseline)
    dev.close()


def _with(good, **kw):
    d = dict(good)
    d.update(kw)
    return {k: v for k, v in d.items() if v is not None}


def test_index_out_of_range_names_table_position_value_rows(loaded):
    dev, h, good = loaded
    # Both IndexError (offload's documented type, torch.nn.Embedding's) and RuntimeError (what
    # torch's embedding_bag raises for the same index).
    with pytest.raises(IndexRangeError, match=r"indices\[4\] = 6 .*table 'items' with 6 rows") as ei:
        dev.run(h, _with(good, indices=np.array([1, 2, 9, 0, 6, 5])))
    assert isinstance(ei.value, IndexError) and isinstance(ei.value, RuntimeError) and isinstance(ei.value, OffloadError)
    with pytest.raises(IndexError, match=r"indices\[1\] = -1 .*table 'users' with 10 rows"):
        dev.run(h, _with(good, indices=np.array([1, -1, 9, 0, 5, 5])))
    with pytest.raises(IndexError, match=r"= 10 .*'users'"):
        dev.run(h, _with(good, indices=np.array([10, 2, 9, 0, 5, 5])))


@pytest.mark.parametrize("offsets, msg", [
    ([1, 2, 3, 5, 6], "must start at 0"),
    ([0, 3, 2, 5, 6], "must not decrease"),
    ([0, 2, 3, 5, 7], "runs past the indices"),
    ([0, 2, 3, 5, 5], "must end at len"),
    ([0, 2, 3, 6], "length must be T\\*B\\+1"),
])
def test_bad_offsets(loaded, offsets, msg):
    dev, h, good = loaded
    with pytest.raises(OffsetsError, match=msg) as ei:
        dev.run(h, _with(good, offsets=np.array(offsets, dtype=np.int64)))
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, RuntimeError)


@pytest.mark.parametrize("acc_type", [None, "ap_fixed<14,4,AP_RND_CONV,AP_SAT>"])
def test_bags_longer_than_max_bag_size_run_with_the_same_arithmetic(acc_type):
    # max_bag_size sizes the default accumulator; it is no run-time limit. A bag past it pools with
    # the same per-step acc_t arithmetic (saturating where a narrow acc_type overflows) as a kernel
    # declared for that length, bit for bit; with the default accumulator, exactly.
    rng = np.random.default_rng(3)
    table = rng.uniform(-8, 8, size=(10, 4))
    lens = [0, 9, 40, 3]
    idx = rng.integers(0, 10, size=sum(lens)).astype(np.int64)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    outs = []
    for mode in ("sum", "mean", "max"):
        for declared in (4, 64):
            spec = make_spec([TableSpec("t", 10, 4, "ap_fixed<12,4>")], mode=mode, max_bag_size=declared,
                             acc_type=acc_type or "ap_fixed<30,16,AP_RND_CONV,AP_SAT>")
            dev = open_device("sim")
            h = dev.load(make_kernel("k", spec, [table]))
            outs.append(dev.run(h, {"indices": idx, "offsets": off})["out"])
            dev.close()
        np.testing.assert_array_equal(outs[-2], outs[-1])
    if acc_type is None:  # wide accumulator: the plain sum of the quantized rows, exactly
        q = np.asarray(FixedType.parse("ap_fixed<12,4>").quantize(table))
        want = np.stack([q[idx[a:b]].sum(axis=0) for a, b in zip(off[:-1], off[1:])]) << (14 - 8)
        np.testing.assert_array_equal(outs[0], want)


def test_default_max_bag_size_is_large_and_declared_bags_never_overflow():
    # The default is derived for real traffic (see DEFAULT_MAX_BAG_SIZE): 2^16 - 1 entries, a full
    # bag of extreme values and weights fits the default accumulator, and a full bag of 16-bit raw
    # values fits an int32 partial sum.
    spec = make_spec([TableSpec("t", 2, 1, "ap_fixed<16,6>")], mode="sum")
    assert spec.max_bag_size == DEFAULT_MAX_BAG_SIZE == (1 << 16) - 1
    assert spec.max_bag_size * 2 ** 15 < 2 ** 31
    acc = spec.acc_type
    term = 2.0 ** 5 * 2.0 ** 7  # |value| <= 2^(I-1), |weight| <= 2^(Iw-1)
    assert term * spec.max_bag_size <= acc.max_float + acc.lsb


def test_bad_dtypes_and_weights(loaded):
    dev, h, good = loaded
    with pytest.raises(TypeError, match="indices: dtype"):
        dev.run(h, _with(good, indices=good["indices"].astype(np.float32)))
    with pytest.raises(TypeError, match="offsets: dtype"):
        dev.run(h, _with(good, offsets=good["offsets"].astype(np.int16)))
    with pytest.raises(TypeError, match="per_sample_weights"):
        dev.run(h, _with(good, per_sample_weights=np.ones(6, np.float32)))
    with pytest.raises(ValueError, match=r"per_sample_weights: shape \(5,\)"):
        dev.run(h, _with(good, per_sample_weights=np.ones(5, np.int64)))


def test_weights_in_max_mode_rejected_by_kernel():
    # FBGEMM's TBE weights sum and mean bags (the kernel follows it); max has no weighted form.
    spec = make_spec([TableSpec("t", 4, 2, "ap_fixed<8,3>")], mode="max", max_bag_size=3)
    kernel = make_kernel("k", spec, [np.zeros((4, 2))])
    dev = open_device("sim")
    h = dev.load(kernel)
    with pytest.raises(UnsupportedError, match="only supported in modes 'sum' and 'mean'"):
        dev.run(h, {"indices": np.array([0, 1]), "offsets": np.array([0, 2]), "per_sample_weights": np.array([1, 1])})


def test_spec_limits():
    with pytest.raises(ValueError, match="padding_idx 7 outside"):
        make_spec([TableSpec("t", 4, 2, "ap_fixed<8,3>", padding_idx=7)])
    with pytest.raises(ValueError, match="mode"):
        make_spec([TableSpec("t", 4, 2, "ap_fixed<8,3>")], mode="median")
    with pytest.raises(ValueError, match="acc_type.*wider than 62"):
        make_spec([TableSpec("t", 4, 2, "ap_fixed<8,3>")], acc_type="ap_fixed<64,20>")
    with pytest.raises(ValueError, match="needs param_type"):
        make_spec([TableSpec("t", 4, 2, "int8_rowwise")])


def _module_and_state():
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 4, mode="mean", padding_idx=3)
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<16,6>", max_bag_size=5)
    res = get_resident(m.rid)
    dev_tables = {k: v.copy() for k, v in res.device._get(res.handle).tensors.items()}
    return m, res, dev_tables


def test_module_errors_leave_resident_state_unchanged():
    m, res, dev_tables = _module_and_state()
    idx, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2])
    y0 = m(idx, off)
    with pytest.raises(IndexError, match=r"indices\[2\] = 10 .*with 10 rows"):
        m(torch.tensor([1, 2, 10, 4]), off)
    with pytest.raises(IndexError, match="= -2"):
        m(torch.tensor([1, -2, 0, 4]), off)
    with pytest.raises(ValueError, match="must start at 0"):
        m(idx, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="must not decrease"):
        m(idx, torch.tensor([0, 3, 2]))
    with pytest.raises(ValueError, match="runs past"):
        m(idx, torch.tensor([0, 5]))
    with pytest.raises(NotImplementedError, match="per_sample_weights: only supported for mode='sum'"):
        m(idx, off, torch.ones(4))
    with pytest.raises(IndexDtypeError, match="input: dtype"):
        m(idx.float(), off)
    with pytest.raises(IndexDtypeError, match="offsets: dtype"):
        m(idx, off.float())
    with pytest.raises(ValueError, match="offsets"):
        m(idx)
    with pytest.raises(ValueError, match="offsets: must be None for 2-D"):
        m(idx.reshape(2, 2), off)
    sbag = offload.nn.EmbeddingBag.from_float(torch.nn.EmbeddingBag(10, 4, mode="sum"))
    with pytest.raises(ValueError, match=r"per_sample_weights: shape \(3,\)"):
        sbag(idx, off, torch.ones(3))
    with pytest.raises(PerSampleWeightsDtypeError, match="per_sample_weights: dtype"):
        sbag(idx, off, torch.ones(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="per_sample_weights: dtype torch.float64"):
        sbag(idx, off, torch.ones(4, dtype=torch.float64))
    for k, v in res.device._get(res.handle).tensors.items():
        np.testing.assert_array_equal(v, dev_tables[k])
    assert torch.equal(m(idx, off), y0)


@pytest.mark.parametrize("which", [0, 1])
def test_max_norm_refused_by_every_module(which):
    # max_norm renormalises rows during the lookup, which the kernel does not do: silently
    # dropping it would return different numbers than torch.
    plain = torch.nn.EmbeddingBag(10, 4, mode="sum")
    renorm = torch.nn.EmbeddingBag(10, 4, mode="sum", max_norm=1.0)
    bags = [plain, plain]
    bags[which] = renorm
    with pytest.raises(UnsupportedError, match=rf"bags\[{which}\]: max_norm"):
        offload.nn.TableBatchedEmbeddingBags.from_float(bags)
    with pytest.raises(UnsupportedError, match="max_norm"):
        offload.nn.EmbeddingBag.from_float(renorm)
    with pytest.raises(UnsupportedError, match="max_norm"):
        offload.nn.Embedding.from_float(torch.nn.Embedding(10, 4, max_norm=1.0))


@pytest.mark.parametrize("device", ["sim", "emu"])
def test_resident_tables_outside_their_format_are_refused_at_load(device):
    # ap_fixed<12,4> lives in an int16 container: a raw 3000 fits the container but not the type,
    # and the reference (int64 arithmetic) and the C++ (12-bit ap_fixed) would read it differently.
    spec = make_spec([TableSpec("t", 8, 4, "ap_fixed<12,4>")], mode="sum", max_bag_size=4)
    good = make_kernel("k", spec, [np.zeros((8, 4))])
    dev = open_device(device)
    dev.load(good)  # the well-formed kernel loads
    for mutate, err, msg in [
        (lambda t: t.__setitem__("table0", np.full((8, 4), 3000, dtype=np.int16)), ValueError, r"outside ap_fixed<12,4>'s range \[-2048, 2047\]"),
        (lambda t: t.__setitem__("table0", np.zeros((8, 4), dtype=np.int32)), TypeError, "stored as int16"),
        (lambda t: t.__setitem__("table0", np.zeros((7, 4), dtype=np.int16)), ValueError, "must be 8 x 4"),
        (lambda t: t.pop("table0"), ValueError, "missing 'table0'"),
        (lambda t: t.__setitem__("table1", np.zeros((8, 4), dtype=np.int16)), ValueError, "unexpected"),
    ]:
        tensors = dict(good.tensors)
        mutate(tensors)
        bad = type(good)("k", spec, tensors)
        with pytest.raises(err, match=msg):
            dev.load(bad)
    dev.close()


def test_longest_exact_bag_is_the_longest_the_default_accumulator_covers():
    from offload.kernels.embedding import default_acc_type, longest_exact_bag

    assert longest_exact_bag([TableSpec("t", 4, 2, "ap_fixed<16,6>")], "sum") == DEFAULT_MAX_BAG_SIZE
    wide = [TableSpec("t", 4, 2, "ap_fixed<40,8>")]  # like FBGEMM's exact fp32 scale/bias row-wise values
    n = longest_exact_bag(wide, "sum")
    assert 1 < n < DEFAULT_MAX_BAG_SIZE
    make_spec(wide, mode="sum", max_bag_size=n)  # fits
    with pytest.raises(ValueError, match="would need"):
        make_spec(wide, mode="sum", max_bag_size=2 * n)
    # A max bag's accumulator does not grow with the bag: any declared length is exact.
    wider = [TableSpec("t", 4, 2, "ap_fixed<50,8>")]
    assert longest_exact_bag(wider, "sum") < DEFAULT_MAX_BAG_SIZE
    assert longest_exact_bag(wider, "max") == DEFAULT_MAX_BAG_SIZE
    assert default_acc_type(wider, "max", 1) == default_acc_type(wider, "max", DEFAULT_MAX_BAG_SIZE)

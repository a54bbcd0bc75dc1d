"""The embedding op's per-call path: the cheaper steps give exactly what the old ones gave."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import offload
from offload.ops import embedding as E
from offload.sim.fixed import FixedType


def _two_step(raw: np.ndarray, F: int) -> np.ndarray:
    """The float32 conversion as it was: round to float32, then scale by 2^-F."""
    y = raw.astype(np.float32)
    np.ldexp(y, np.int32(-F), out=y)
    return y


@pytest.mark.parametrize("fmt", ["ap_fixed<64,4>", "ap_fixed<32,12>", "ap_ufixed<32,0>", "ap_fixed<16,6>",
                                 "ap_fixed<16,-110>", "ap_fixed<8,-130>", "ap_fixed<8,12>", "ap_int<16>"])
def test_float32_output_is_bit_identical_to_the_two_step_conversion(fmt):
    """The conversion by a float32 multiply (int64 -> float32, times the float32 2^-F) against astype + ldexp,
    on values float32 must round (ties included) and the extremes of int64; F from -4 to 138."""
    t = FixedType.parse(fmt)
    rng = np.random.default_rng(0)
    edges = [0, 1, -1, 2**24 + 1, 2**25 + 2, -(2**25 + 6), 2**53 + 1, 2**62 + 2**38, -(2**63), 2**63 - 1]
    raw = np.concatenate([np.array(edges, dtype=np.int64), rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64),
                          rng.integers(-(2**20), 2**20, 500, dtype=np.int64)]).reshape(-1, 10)
    got = E.raw_to_tensor(raw, t, torch.float32)
    assert got.dtype == torch.float32 and got.shape == raw.shape
    assert np.array_equal(got.numpy().view(np.int32), _two_step(raw, t.F).view(np.int32))


def test_plain_cpu_calls_skip_the_redispatch_and_others_keep_it(monkeypatch):
    """The Python autograd kernel calls the implementation directly for a plain CPU call that needs
    no gradient; a call with a weight requiring grad, or under a dispatch mode, still goes through
    torch's own path (redispatch below autograd), with the same results. (embedding_lookup_tbe:
    embedding_lookup's CPU calls meet the C++ kernel first where it is built, tests/ops/test_embedding_native.py.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(30, 4, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(bag, device="sim")
    idx, off = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 5])
    w = torch.rand(5)
    op = torch.ops.offload.embedding_lookup_tbe.default
    redispatched = []
    real = type(op).redispatch

    def spy(self, *a, **kw):
        redispatched.append(self)
        return real(self, *a, **kw)

    monkeypatch.setattr(type(op), "redispatch", spy)
    want = op(m.rid, idx, off, w, torch.float32)
    assert redispatched == []

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(func)
            return func(*args, **(kwargs or {}))

    with Seen():
        got = op(m.rid, idx, off, w, torch.float32)
    assert op in Seen.ops and len(redispatched) == 1 and torch.equal(got, want)
    wg = w.clone().requires_grad_()
    got = op(m.rid, idx, off, wg, torch.float32)
    assert len(redispatched) == 2 and got.requires_grad and torch.equal(got.detach(), want)
    with torch.no_grad():
        got = op(m.rid, idx, off, wg, torch.float32)
    assert len(redispatched) == 2 and not got.requires_grad and torch.equal(got, want)


_SPECS = [  # (formats, mode, weighted, max_bag_size, out_type): the fused kernels' plain and general loops, the reference's
    (["ap_fixed<16,6,AP_RND_CONV,AP_SAT>"], "sum", False, 32, None),
    (["ap_fixed<16,6>", "int8_rowwise"], "mean", False, 32, None),
    (["ap_fixed<16,6>"], "sum", True, 32, None),
    (["ap_fixed<8,3>"], "max", False, 32, None),
    (["ap_fixed<16,6>"], "sum", False, 32, "ap_fixed<12,4,AP_RND,AP_SAT>"),
    (["ap_fixed<16,6>"], "sum", False, 32, "ap_fixed<8,12,AP_TRN,AP_SAT>"),  # F = -4: converted after, not in the kernel
]


def _kernel(fmts, mode, max_bag, out_type, rng):
    from offload.kernels.embedding import TableSpec, make_kernel, make_spec, rowwise_param_type

    w = [rng.normal(size=(40, 8)) * 3 for _ in fmts]
    tables = [TableSpec(f"t{i}", 40, 8, f, param_type=rowwise_param_type(w[i]) if f == "int8_rowwise" else None, padding_idx=3 if i else None)
              for i, f in enumerate(fmts)]
    spec = make_spec(tables, mode=mode, max_bag_size=max_bag, out_type=out_type)
    return make_kernel("k", spec, w)


@pytest.mark.parametrize("case", range(len(_SPECS)))
@pytest.mark.parametrize("threads", [1, 2])
def test_bound_lookup_writes_float32_bit_for_bit_as_the_raw_output_converted(case, threads):
    """The sim device's bound call (fused kernels writing float32) against run()'s raw int64 output
    converted by float32_of; and with bags past max_bag_size (the reference's path) as well."""
    from offload.host.sim import SimDevice
    from offload.kernels.embedding import float32_of
    from offload.sim.embedding.fused import using_threads

    fmts, mode, weighted, max_bag, out_type = _SPECS[case]
    rng = np.random.default_rng(case)
    k = _kernel(fmts, mode, max_bag, out_type, rng)
    dev = SimDevice()
    h = dev.load(k)
    T, B = len(fmts), 300
    for longest in (max_bag, 2 * max_bag):  # the second has bags the fused plan refuses
        lens = rng.integers(0, longest + 1, T * B)
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        idx = rng.integers(0, 40, int(off[-1])).astype(np.int32)
        inputs = {"indices": idx, "offsets": off}
        w = None
        if weighted:
            wt = k.spec.weight_type
            w = inputs["per_sample_weights"] = rng.integers(wt.min_raw, wt.max_raw + 1, idx.shape[0])
        with using_threads(threads):
            raw = dev.run(h, inputs)["out"]
            got = dev.bind_checked(h, fp32=True)(idx, off, w)
            got_raw = dev.bind_checked(h)(idx, off, w)
        want = float32_of(raw, k.spec.out_type)
        assert got.dtype == np.float32 and got.shape == raw.shape
        assert np.array_equal(got.view(np.int32), want.view(np.int32))
        assert got_raw.dtype == np.int64 and np.array_equal(got_raw, raw)


def test_bound_lookup_refuses_what_run_refuses_and_a_closed_device():
    from offload.host.sim import SimDevice
    from offload.sim.errors import DeviceError, IndexRangeError, OffsetsError

    k = _kernel(["ap_fixed<16,6>"], "sum", 8, None, np.random.default_rng(0))
    dev = SimDevice()
    h = dev.load(k)
    lookup = dev.bind_checked(h, fp32=True)
    with pytest.raises(IndexRangeError, match=r"indices\[1\] = 40"):
        lookup(np.array([1, 40]), np.array([0, 2]), None)
    with pytest.raises(OffsetsError, match="must end at len"):
        lookup(np.array([1, 2]), np.array([0, 1]), None)
    dev.close()
    with pytest.raises(DeviceError, match="closed"):
        lookup(np.array([1, 2]), np.array([0, 2]), None)

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
    got = E._to_dtype(raw, t, torch.float32)
    assert got.dtype == torch.float32 and got.shape == raw.shape
    assert np.array_equal(got.numpy().view(np.int32), _two_step(raw, t.F).view(np.int32))


def test_plain_cpu_calls_skip_the_redispatch_and_others_keep_it(monkeypatch):
    """The autograd kernel calls the implementation directly for a plain CPU call that needs no
    gradient; a call with a weight requiring grad, or under a dispatch mode, still goes through
    torch's own path (redispatch below autograd), with the same results."""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(30, 4, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(bag, device="sim")
    idx, off = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 5])
    w = torch.rand(5)
    op = torch.ops.offload.embedding_lookup.default
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

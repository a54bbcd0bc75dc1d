"""The offload ops are inference-only: backward() through them raises instead of silently
leaving every gradient None (issue 15, item 13)."""

from __future__ import annotations

import pytest
import torch

import offload
from offload.sim.errors import OffloadError, UnsupportedError


def _mlp():
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    return offload.nn.MLP.from_float(seq, calib=torch.randn(64, 4), precision="ap_fixed<16,6>", device="sim")


def test_backward_through_the_mlp_op_raises():
    m = _mlp()
    x = torch.randn(2, 4, requires_grad=True)
    y = m(x)
    with pytest.raises(UnsupportedError, match="inference-only"):
        y.sum().backward()
    assert x.grad is None


@pytest.mark.parametrize("tbe", [False, True])
def test_backward_through_weighted_lookups_raises(tbe):
    torch.manual_seed(0)
    bags = [torch.nn.EmbeddingBag(10, 4, mode="sum") for _ in range(2 if tbe else 1)]
    if tbe:
        m = offload.nn.TableBatchedEmbeddingBags.from_float(bags, device="sim")
        idx, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2, 4])
    else:
        m = offload.nn.EmbeddingBag.from_float(bags[0], device="sim")
        idx, off = torch.tensor([1, 2, 3]), torch.tensor([0])
    w = torch.rand(idx.numel(), requires_grad=True)
    out = m(idx, off, per_sample_weights=w)
    with pytest.raises(OffloadError, match="not differentiable"):
        out.sum().backward()


def test_no_grad_inference_is_untouched():
    m = _mlp()
    x = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        y = m(x)
    assert not y.requires_grad and y.shape == (3, 1)
    assert torch.equal(y, m(x.detach()))

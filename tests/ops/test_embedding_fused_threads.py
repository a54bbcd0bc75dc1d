"""The torch op's Python path hands torch's thread count to the sim device's fused kernels (1
elsewhere); the C++ kernel (offload.ops.native) serves only calls the fused kernels run serially."""

from __future__ import annotations

import torch

import offload
from offload.ops import native
from offload.sim.embedding import fused as F


def test_op_passes_torch_threads_and_default_is_single(monkeypatch):
    seen = []
    real = F.run

    def spy(*a, **kw):
        seen.append(F._threads.get())
        return real(*a, **kw)

    monkeypatch.setattr(F, "run", spy)
    monkeypatch.setattr(native, "attach", lambda res: False)  # the Python path, which F.run serves
    torch.manual_seed(0)
    tbag = torch.nn.EmbeddingBag(50, 8, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(tbag, fmt="ap_fixed<16,6>", max_bag_size=4, device="sim")
    idx, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2])
    prev = torch.get_num_threads()
    try:
        for n in (2, 1):
            torch.set_num_threads(n)
            m(idx, off)
            assert seen[-1] == n
    finally:
        torch.set_num_threads(prev)
    assert F._threads.get() == 1  # outside the op: single-threaded

"""Tables whose lookups are each followed by a cast (``t(idx[i], off[i]).float()``, as TorchRec-style
code writes them) still batch into one device call: the ``idx[i]`` items move up to the arguments."""

from __future__ import annotations

import torch
import torch.nn as nn

import offload


class _CastEach(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = nn.ModuleList(nn.EmbeddingBag(50, 8, mode="sum") for _ in range(3))

    def forward(self, idx, off):
        return torch.cat([t(idx[i], off[i]).float() for i, t in enumerate(self.t)], 1)


def test_a_cast_after_each_lookup_still_batches_the_tables():
    torch.manual_seed(0)
    m = _CastEach().eval()
    idx = tuple(torch.randint(0, 50, (20,)) for _ in range(3))
    off = tuple(torch.tensor([0, 5, 11, 20]) for _ in range(3))
    gm = offload.offload(m, (idx, off), ops=("embedding_bag",), device="sim")
    assert gm.offload_report.batches == [("t_0", "t_1", "t_2")]
    one_by_one = offload.offload(m, (idx, off), ops=("embedding_bag",), device="sim", batch_tables=False)
    # The same kernels' arithmetic per table: batching changes the call, not a bit of the result.
    assert torch.equal(gm(idx, off), one_by_one(idx, off))

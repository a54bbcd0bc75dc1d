"""End-to-end check of the offload ops with CUDA tensors (a few seconds on a GPU machine).

For each op and output dtype: inputs on cuda, result on the same cuda device, values bit-identical
to the same call with CPU tensors (the kernel runs on the host device either way, so any difference
is a device-move bug), and torch.compile(fullgraph=True) on cuda inputs gives the same values.
Exits 0 with a message when no CUDA device is present. Run by scripts/check_cuda.sh.
"""

from __future__ import annotations

import sys

import numpy as np
import torch


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.device.type != "cuda":
        raise SystemExit(f"FAIL {what}: result on {got.device}, inputs were on cuda")
    if got.dtype != want.dtype or not torch.equal(got.cpu(), want):
        raise SystemExit(f"FAIL {what}: cuda result differs from the CPU call")
    print(f"ok   {what}")


def main() -> int:
    if not torch.cuda.is_available():
        print("check_cuda: no CUDA device (torch.cuda.is_available() is False); nothing checked, skipping")
        return 0
    import offload

    print(f"check_cuda: torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    bag = offload.nn.EmbeddingBag.from_float(torch.nn.EmbeddingBag(1000, 32, mode="sum"))
    lens = torch.randint(0, 33, (256,), generator=g)  # bags of 0..32 rows, under max_bag_size
    off = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    n = int(off[-1])
    idx = torch.randint(0, 1000, (n,), generator=g)
    psw = torch.rand(n, generator=g) * 2 - 1
    for dtype in (torch.float32, torch.float16, torch.float64):
        for w in (None, psw):
            want = torch.ops.offload.embedding_lookup(bag.rid, idx, off, w, dtype)
            got = torch.ops.offload.embedding_lookup(bag.rid, idx.cuda(), off.cuda(), None if w is None else w.cuda(), dtype)
            _same(got, want, f"embedding_lookup dtype={dtype} weighted={w is not None}")

    tbe = offload.nn.TableBatchedEmbeddingBags.from_float(
        [torch.nn.EmbeddingBag(500, 16, mode="sum"), torch.nn.EmbeddingBag(300, 8, mode="sum")], fmt=["ap_fixed<16,6>", "int8_rowwise"])
    B = 64
    lens = torch.randint(0, 6, (2 * B,), generator=g)
    toff = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    tidx = torch.cat([torch.randint(0, 500, (int(lens[:B].sum()),), generator=g), torch.randint(0, 300, (int(lens[B:].sum()),), generator=g)])
    want = torch.ops.offload.embedding_lookup_tbe(tbe.rid, tidx, toff, None, torch.float32)
    _same(torch.ops.offload.embedding_lookup_tbe(tbe.rid, tidx.cuda(), toff.cuda(), None, torch.float32), want, "embedding_lookup_tbe")

    seq = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
    mlp = offload.nn.MLP.from_float(seq, calib=np.random.default_rng(0).normal(size=(2000, 16)))
    x = torch.randn(512, 16, generator=g) * 2
    for dtype in (torch.float32, torch.float64):
        want = torch.ops.offload.mlp_score(mlp.rid, x.to(dtype))
        _same(torch.ops.offload.mlp_score(mlp.rid, x.to(dtype).cuda()), want, f"mlp_score dtype={dtype}")

    # A model whose dense part stays on cuda around the offloaded op: compiled, one graph.
    fn = torch.compile(lambda t: mlp(t) * 2.0 + 1.0, fullgraph=True)
    _same(fn(x.cuda()), mlp(x) * 2.0 + 1.0, "torch.compile(fullgraph=True) mlp on cuda")
    torch.cuda.synchronize()
    print("check_cuda: all CUDA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

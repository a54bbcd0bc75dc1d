"""int8 row-wise tables against oracles that do not share offload's code: the float table itself,
with an error bound that follows from the format alone, and torch's own FBGEMM 8-bit row-wise
kernels (``quantized::embedding_bag_byte_prepack`` / ``embedding_bag_byte_rowwise_offsets``).

The bound is the format's, not the code's: 8-bit codes give 255 steps over a row's range, so a
code is at most half a step, ``range / 510``, from the value it stands for. offload keeps the
row's scale and bias in a fixed-point ``param_type`` instead of FBGEMM's floats, which may widen
the step by at most one lsb of that type (the bias is floored, the scale rounded up), and the
float32 output rounds once more. A scale computed with the wrong denominator (say 127) doubles
the step and breaks the bound on almost every row of a 64-wide table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import offload
from offload.sim.fixed import FixedType

ROWS, DIM = 200, 64


def _table(seed: int) -> torch.nn.EmbeddingBag:
    g = torch.Generator().manual_seed(seed)
    bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum")
    with torch.no_grad():
        # Rows of very different ranges, and one constant row (range 0).
        scale = torch.exp2(torch.randint(-6, 6, (ROWS, 1), generator=g).float())
        bag.weight.copy_(torch.randn(ROWS, DIM, generator=g) * scale)
        bag.weight[7] = 0.25
    return bag


def _row_bound(w: np.ndarray, lsb: float) -> np.ndarray:
    rng = w.max(axis=1) - w.min(axis=1)
    # half a code step of FBGEMM's format, one param lsb of offload's fixed-point scale/bias
    # (times the 255 steps a code can span: the scale's extra lsb moves the top code by 255 lsb,
    # plus the floored bias), and float32's rounding of the result.
    return rng / 510.0 + 256.0 * lsb + np.abs(w).max(axis=1) * 2.0**-23


@pytest.mark.parametrize("seed", [0, 1])
def test_each_dequantized_row_is_within_the_format_bound_of_the_float_row(seed):
    bag = _table(seed)
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="int8_rowwise", device="sim")
    lsb = float(FixedType.parse(m.spec.tables[0].param_type).lsb)
    idx = torch.arange(ROWS)
    got = m(idx, torch.arange(ROWS)).double().numpy()  # one row a bag: the dequantized rows
    w = bag.weight.detach().double().numpy()
    err = np.abs(got - w).max(axis=1)
    bound = _row_bound(w, lsb)
    assert (err <= bound).all(), (err / bound).max()
    # The bound is not slack: the codes really use half-step rounding on most rows.
    assert (err > 0.25 * (w.max(1) - w.min(1)) / 510.0).mean() > 0.9


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bags_match_torch_fbgemm_rowwise_kernel_within_the_format_bound(mode):
    bag = _table(3)
    bag.mode = mode
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="int8_rowwise", device="sim")
    lsb = float(FixedType.parse(m.spec.tables[0].param_type).lsb)
    g = torch.Generator().manual_seed(4)
    lens = torch.randint(1, 30, (64,), generator=g)
    idx = torch.randint(0, ROWS, (int(lens.sum()),), generator=g)
    off = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]])
    ours = m(idx, off).double()
    w = bag.weight.detach().float()
    packed = torch.ops.quantized.embedding_bag_byte_prepack(w)
    # mode 0 (sum): this CPU kernel returns sums whatever mode it is given, so the mean is formed here.
    theirs = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(packed, idx, off, False, 0, False, None, None, False).double()
    if mode == "mean":
        theirs = theirs / lens.double()[:, None]
    # Each entry of a bag: offload within its bound of the float row, FBGEMM within half a step
    # (its float scale/bias carry no lsb term) plus float32 rounding.
    wn = w.double().numpy()
    per_row = torch.from_numpy(_row_bound(wn, lsb) + (wn.max(1) - wn.min(1)) / 510.0 + np.abs(wn).max(1) * 2.0**-22)
    ends = torch.cat([off[1:], torch.tensor([idx.numel()])])
    bound = torch.stack([per_row[idx[a:b]].sum() / (1 if mode == "sum" else (b - a)) for a, b in zip(off.tolist(), ends.tolist())])
    # Pooling adds float32 rounding of the sum in both kernels.
    bound = bound + ours.abs().max(dim=1).values * 2.0**-20
    assert ((ours - theirs).abs().max(dim=1).values <= bound).all()

"""int8 row-wise tables against oracles that do not share offload's code: the float table itself,
with an error bound that follows from the format alone, and torch's own FBGEMM 8-bit row-wise
kernels (``quantized::embedding_bag_byte_prepack`` / ``embedding_bag_byte_rowwise_offsets``).

No bound reads the parameter type offload chose (a coarser type would pass its own oracle):

- Rows quantized by offload (``from_float``): 8-bit codes give 255 steps over a row's range, so a
  code is at most half a step, ``range / 510``, from the value it stands for. Scale and bias are
  held in the type ``rowwise_param_type`` documents: 24 bits, integer bits just enough (ap_fixed's
  signed range) for the table's largest ``max(|row min|, row range / 255)``; its lsb is computed here
  from the data. Bias floored and scale rounded up by less than one lsb widen the step to at most
  ``(range + lsb) / 255 + lsb``; the float32 output rounds once more (half an ulp).
- FBGEMM's own rows (``from_rowwise``): the value FBGEMM computes is ``code * scale + bias`` rounded
  once to float32, and offload holds the same codes, scale and bias exactly, so a row is within half
  an ulp of float32 of the exact value; a bag's sum is exact, then rounded once.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import offload

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


def _format_lsb(w: np.ndarray, width: int = 24) -> float:
    """The lsb of the scale/bias type ``rowwise_param_type`` documents for ``w``: ``width`` bits,
    the fewest signed integer bits ``I`` with ``m < 2^(I-1)``."""
    m = max(np.abs(w.min(axis=1)).max(), ((w.max(axis=1) - w.min(axis=1)) / 255.0).max())
    integer = int(np.floor(np.log2(m))) + 2
    return 2.0 ** (integer - width)


def _half_ulp32(y: np.ndarray) -> np.ndarray:
    return np.spacing(np.abs(np.asarray(y, dtype=np.float32))).astype(np.float64) / 2


@pytest.mark.parametrize("seed", [0, 1])
def test_each_dequantized_row_is_within_the_format_bound_of_the_float_row(seed):
    bag = _table(seed)
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="int8_rowwise", device="sim")
    idx = torch.arange(ROWS)
    got = m(idx, torch.arange(ROWS)).double().numpy()  # one row a bag: the dequantized rows
    w = bag.weight.detach().double().numpy()
    lsb = _format_lsb(w)
    rng = w.max(1) - w.min(1)
    # Half the widened step, then float32's rounding of the output.
    bound = ((rng + lsb) / 255.0 + lsb)[:, None] / 2 + _half_ulp32(got)
    err = np.abs(got - w)
    assert (err <= bound).all(), (err / bound).max()
    # The bound is not slack: the codes really use half-step rounding on most rows.
    assert (err.max(1) > 0.25 * rng / 510.0).mean() > 0.9


def _exact_fraction_bits(*arrays: np.ndarray) -> int:
    """Fraction bits that hold every (dyadic, float) value of ``arrays`` exactly."""
    return max(Fraction(float(v)).denominator.bit_length() - 1 for a in arrays for v in np.asarray(a, dtype=np.float64).ravel())


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_fbgemm_rows_match_torch_fbgemm_rowwise_kernel_within_float32_rounding(mode):
    bag = _table(3)
    w = bag.weight.detach().float()
    packed = torch.ops.quantized.embedding_bag_byte_prepack(w)
    # Rows whose ranges span 12 binades need 44-bit exact scale/bias; unweighted bags leave room by a
    # narrow weight_type (README: value times weight must fit 63 bits).
    m = offload.nn.TableBatchedEmbeddingBags.from_rowwise([packed], layout="fp32_end", mode=mode, weight_type="ap_fixed<8,4>", device="sim")
    # The exact values: fp32_end rows are [codes, fp32 scale, fp32 bias]; float64 holds each
    # code * scale (8 x 24 bits) plus bias (within 9 binades of it here) exactly.
    p = packed.numpy()
    codes = p[:, :-8].astype(np.float64)
    sb = np.ascontiguousarray(p[:, -8:]).view("<f4").astype(np.float64)
    rows = codes * sb[:, :1] + sb[:, 1:]
    # One-row bags: FBGEMM's value is code * scale + bias rounded once to float32; offload's is the
    # same exact value rounded once: both within half an ulp of float32 of it.
    one = torch.arange(ROWS)
    ours1 = m(one, torch.arange(ROWS + 1)).double().numpy()
    theirs1 = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(packed, one, one, False, 0, False, None, None, False).double().numpy()
    assert (np.abs(ours1 - rows) <= _half_ulp32(ours1)).all()
    assert (np.abs(theirs1 - rows) <= _half_ulp32(theirs1)).all()
    # Bags: offload sums the exact values in fixed point and rounds once to float32; a mean is
    # rounded (half away) to the accumulator's grid first, which keeps at least the values' own
    # fraction bits (those of the exact fp32 scale and bias). float64's own sum of the exact rows
    # adds at most n * 2^-53 of their magnitudes.
    g = torch.Generator().manual_seed(4)
    lens = torch.randint(1, 30, (64,), generator=g)
    idx = torch.randint(0, ROWS, (int(lens.sum()),), generator=g)
    off = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    ours = m(idx, off).double().numpy()
    ends, ix = off.tolist(), idx.numpy()
    n = lens.numpy()[:, None].astype(np.float64)
    exact = np.stack([rows[ix[a:b]].sum(0) for a, b in zip(ends[:-1], ends[1:])])
    absum = np.stack([np.abs(rows[ix[a:b]]).sum(0) for a, b in zip(ends[:-1], ends[1:])])
    f64 = n * 2.0 ** -53 * absum
    if mode == "mean":
        exact, f64 = exact / n, f64 / n
    grid = 2.0 ** -(_exact_fraction_bits(sb) + 1) if mode == "mean" else 0.0
    tol = _half_ulp32(ours) + grid + f64
    assert (np.abs(ours - exact) <= tol).all(), (np.abs(ours - exact) / tol).max()

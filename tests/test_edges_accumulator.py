"""Long bags at the edge of a 32-bit partial sum, through the public module on the sim device.

A compiled lookup may keep a bag's partial sums of 16-bit raw values in int32 only while no bag can
leave int32's range. The edges come from the two formats' definitions, not from the code:
``ap_fixed<16,6>`` holds raw values in [-2^15, 2^15 - 1] (lsb 2^-10), int32 holds [-2^31, 2^31 - 1].
So n copies of the minimum fit up to n = 2^16 (exactly -2^31) and overflow at 2^16 + 1; n copies of
the maximum fit up to n = 65538 (2^31 - 2) and overflow at 65539. Each bag of n entries is declared
with ``max_bag_size = n`` (the bound the kernel sizes its accumulator for) and checked, bit for bit,
against Python's exact integer sum. A path that takes int32 one bag too long returns the wrapped sum:
+2^31 - 2^15 raw where the answer is -2^31 - 2^15.
"""

from __future__ import annotations

import pytest
import torch

import offload

pytest.importorskip("numba")  # the compiled path is what holds the narrow accumulator

FMT = "ap_fixed<16,6>"
RAW_MIN, RAW_MAX, F = -(1 << 15), (1 << 15) - 1, 10  # ap_fixed<16,6>: 16-bit two's complement, 10 frac bits
DIM = 2


def _bag_module(n: int, mode: str) -> offload.nn.EmbeddingBag:
    bag = torch.nn.EmbeddingBag(2, DIM, mode=mode)
    with torch.no_grad():  # row 0 the format's minimum, row 1 its maximum, both held exactly
        bag.weight[0] = RAW_MIN * 2.0 ** -F
        bag.weight[1] = RAW_MAX * 2.0 ** -F
    return offload.nn.EmbeddingBag.from_float(bag, fmt=FMT, max_bag_size=n, on_overflow="raise", device="sim", dtype=torch.float64)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("n", [65535, 65536, 65537, 65538, 65539])
def test_bags_of_the_extremes_at_the_int32_edge_are_exact(n, mode, threads):
    m = _bag_module(n, mode)
    idx = torch.cat([torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64)])
    off = torch.tensor([0, n], dtype=torch.int64)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = m(idx, off)
    finally:
        torch.set_num_threads(prev)
    # Exact: Python ints, scaled by the lsb (a power of two, so float64 holds the results exactly).
    want = []
    for raw in (RAW_MIN, RAW_MAX):
        total = sum([raw] * n)
        want.append(total * 2.0 ** -F if mode == "sum" else raw * 2.0 ** -F)
    assert got.dtype == torch.float64 and tuple(got.shape) == (2, DIM)
    for b in range(2):
        assert got[b].tolist() == [want[b]] * DIM, f"bag {b} of {n} x raw {(RAW_MIN, RAW_MAX)[b]}: {got[b].tolist()} != {want[b]}"


def test_the_edges_sit_where_int32_ends():
    """The sizes above really straddle int32's range (so the test cannot drift off the edge)."""
    lo, hi = -(1 << 31), (1 << 31) - 1
    assert 65536 * RAW_MIN == lo and 65537 * RAW_MIN < lo
    assert 65538 * RAW_MAX <= hi < 65539 * RAW_MAX

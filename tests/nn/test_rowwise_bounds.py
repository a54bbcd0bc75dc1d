"""Pre-quantized row-wise tables (``from_rowwise``, torch's fp32_end layout): every row is loaded
exactly or refused with a ``FormatError`` naming the row and the value (issue 45, item 2).

The bounds follow from the format, not from offload's code. A table's scales and biases share one
``ap_fixed<Wp,Ip>``, which must hold each fp32 value exactly; a row's value ``code * scale + bias``
is then ``ap_fixed<Wp+9,Ip+9>`` (ap_types' result type of ``ap_uint<8> * ap_fixed<Wp,Ip>`` plus
``ap_fixed<Wp,Ip>``), and the kernel multiplies it by a per-sample weight of ``weight_type``
(``ap_fixed<20,8>`` by default) into an exact product of at most 63 bits (the int64 products of
the embedding kind, ``offload.kernels.embedding``). So ``Wp <= 63 - 9 - 20 = 34``, and a value
needs ``bits(integer part) + 1`` sign bit plus its fraction bits; a negative power of two is a
two's complement minimum and needs one bit fewer.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import offload
from offload.kernels.embedding import DEFAULT_WEIGHT_TYPE
from offload.nn.fbgemm import rowwise_kernel
from offload.sim.errors import FormatError
from offload.sim.fixed import FixedType

CODES = np.array([1, 2, 3, 4], dtype=np.uint8)
# The widest exact scale/bias type the default weight_type leaves (module docstring).
WP = 63 - 9 - FixedType.parse(DEFAULT_WEIGHT_TYPE).width
F32_MAX_INT = np.float32(2.0 ** (WP - 1))  # a power of two: exactly representable in fp32


def _packed(rows: list[tuple[float, float]]) -> torch.Tensor:
    """fp32_end rows (``[codes, fp32 scale, fp32 bias]``, as ``embedding_bag_byte_prepack`` writes)."""
    codes = np.tile(CODES, (len(rows), 1))
    sb = np.array(rows, dtype="<f4").view(np.uint8)
    return torch.from_numpy(np.concatenate([codes, sb], axis=1))


def _load(rows: list[tuple[float, float]]):
    return offload.nn.TableBatchedEmbeddingBags.from_rowwise([_packed(rows)], device="sim", dtype=torch.float64)


def _exact(rows: list[tuple[float, float]]) -> np.ndarray:
    # fp32 scale x 8-bit code and the sum with an fp32 bias of at most WP significant bits are exact in float64.
    return np.array([[float(np.float32(s)) * c + float(np.float32(b)) for c in CODES.tolist()] for s, b in rows])


def _assert_exact(rows):
    got = _load(rows).weights[0].numpy()
    np.testing.assert_array_equal(got, _exact(rows))


def _assert_refused(rows, row: int, value: float):
    with pytest.raises(FormatError) as e:
        _load(rows)
    msg = str(e.value)
    assert f"row {row}" in msg and repr(float(np.float32(value))) in msg, msg


@pytest.mark.parametrize(
    "scale,bias",
    [(1.0, 1e19), (2.0**-20, 2.0**44), (1.0, -3e38)],
    ids=["bias-past-int64", "scale-2^-20-bias-2^44", "bias--3e38"],
)
def test_the_issues_rows_are_refused_naming_the_row_and_value(scale, bias):
    # Before: the first two loaded with the bias silently 0 (int64 overflow), the third with an untyped error.
    _assert_refused([(0.5, 1.0), (scale, bias)], 1, bias)


def test_integer_bits_the_last_bias_that_loads_exactly_and_the_first_refused():
    last = np.nextafter(F32_MAX_INT, np.float32(0))  # the largest fp32 below 2^(WP-1): WP signed bits
    _assert_exact([(1.0, float(last)), (2.0, -3.0)])
    _assert_refused([(1.0, float(F32_MAX_INT)), (2.0, -3.0)], 0, float(F32_MAX_INT))
    # Negative: -2^(WP-1) is the WP-bit minimum; the next fp32 below it needs one bit more.
    _assert_exact([(2.0, 3.0), (1.0, -float(F32_MAX_INT))])
    below = np.nextafter(-F32_MAX_INT, np.float32(-np.inf))
    _assert_refused([(2.0, 3.0), (1.0, float(below))], 1, float(below))


def test_fraction_bits_the_last_scale_that_loads_exactly_and_the_first_refused():
    # Bias 1.0 needs 2 signed integer bits, so a scale of 2^-k in another row needs 2 + k <= WP bits.
    _assert_exact([(0.5, 1.0), (2.0 ** -(WP - 2), 0.0)])
    _assert_refused([(0.5, 1.0), (2.0 ** -(WP - 1), 0.0), (0.25, -0.5)], 1, 2.0 ** -(WP - 1))


def test_every_row_loads_exactly_or_is_refused_naming_it():
    """A sweep over the kernel constructor (no device, so it stays fast): what loads holds each
    row's ``code * scale + bias`` exactly in its raw fixed-point parameters."""
    rng = np.random.default_rng(45)
    loaded = refused = 0
    for _ in range(300):
        # Short mantissas, exponents far apart or close: the row's width is about their spread.
        s = float(np.float32(int(rng.integers(1, 16)) * 2.0 ** int(rng.integers(-30, 10))))
        b = float(np.float32(int(rng.integers(-16, 16)) * 2.0 ** int(rng.integers(-20, 60))))
        try:
            k = rowwise_kernel("k", [("t0", CODES[None, :], np.float32([s]), np.float32([b]))])
        except FormatError as e:
            assert "row 0" in str(e) and (repr(s) in str(e) or repr(b) in str(e)), str(e)
            refused += 1
            continue
        lsb = Fraction(2) ** -FixedType.parse(k.spec.tables[0].param_type).F
        raw_s, raw_b = (int(v) for v in k.tensors["params0"][0])
        codes = k.tensors["table0"][0].tolist()
        if s == 0:  # a constant row is stored as code 0 with the smallest scale
            assert codes == [0, 0, 0, 0] and raw_b * lsb == Fraction(b)
        else:
            assert codes == CODES.tolist()
            assert [c * raw_s * lsb + raw_b * lsb for c in codes] == [c * Fraction(s) + Fraction(b) for c in codes]
        loaded += 1
    assert loaded >= 50 and refused >= 50, (loaded, refused)

"""hls4ml's two dense strategies as the simulator sees them: ``latency`` and ``distributed_arithmetic``.

Under ``distributed_arithmetic`` (hls4ml 1.3 with da4ml 0.5) a Dense layer is no longer
``nnet_dense_latency.h``. What the sources do, step by step:

- ``hls4ml/backends/vivado/passes/distributed_arithmetic.py`` (``DistributedArithmeticCodegen``)
  traces ``inp @ kernel (+ bias)`` with da4ml, where ``inp`` is
  ``FixedVariableArray.from_kif(k, i, f)`` of the layer's input type (``_get_input_kif``: the
  previous layer's ``result_t``), ``kernel`` the layer's weight *data* and ``bias`` its bias data.
  ``weight_t``, ``bias_t`` and ``accum_t`` are never used (``DALatencyDenseTemplate`` deletes
  them): the weights enter as exact constants (``da4ml/trace/fixed_variable_array.py``, ``cmvm``,
  casts the matrix to float32 and decomposes it into shifts and adds; ``fixed_variable.py``,
  ``_const_add`` / ``_const_f``, takes the bias as an exact dyadic of at most 32 fraction bits).
- ``da4ml/codegen/hls/hls_codegen.py`` types every intermediate with the minimal ``ap_fixed`` of
  its exact interval (``ssa_gen``), so every partial sum is exact; ``output_gen`` writes
  ``model_out[i] = ap_fixed<exact>(v)``, and that assignment into the layer's ``result_t`` is the
  one place the Dense rounds and saturates, with ``result_t``'s own modes.

So a DA Dense is ``result_t(sum_i x_i * w_i + b)`` computed exactly, which is the latency datapath
with an accumulator wide enough never to round or overflow. :func:`exact_accum` is that type, and
a DA spec carries it as the layer's ``accum``: the reference and the fused program then run DA
without a second code path. Weights are still offload's quantized ones (``weight_t``/``bias_t``):
hls4ml receives them as exact dyadic floats, which da4ml uses unchanged. BatchNorm and the
activations keep their latency implementations (the DA pass only matches Dense/Conv).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from offload.sim.fixed import FixedType, mul_type

__all__ = ["STRATEGIES", "LATENCY", "DA", "DA_MAX_CONST_BITS", "DA_MAX_CONST_F", "check_da_constant", "exact_accum", "with_exact_accum"]

LATENCY = "latency"
DA = "distributed_arithmetic"
STRATEGIES = (LATENCY, DA)
# da4ml's cmvm reads the weight matrix as float32 (24 significant bits) and _const_f looks for a
# constant's fraction bits in (-32, 32]: constants beyond either are no longer exact.
DA_MAX_CONST_BITS = 24
DA_MAX_CONST_F = 32
_MAX_ACC_BITS = 62  # the simulator's raw int64 datapath


def exact_accum(input_type: FixedType, weight: FixedType, bias: FixedType | None,
                w_raw: np.ndarray, b_raw: np.ndarray | None) -> FixedType:
    """The narrowest signed ``ap_fixed`` holding every ``x . w + b`` exactly for inputs of ``input_type``.

    Its fraction bits are the product's (or the bias's, if finer) and its range covers the worst
    case over the input type's whole range with these raw weights, so casting products and partial
    sums into it never rounds and never overflows (AP_TRN / AP_WRAP: the cheapest modes, never hit).
    Raises ``ValueError`` when that type is wider than the simulator's 62-bit raw datapath.
    """
    xt, wt = input_type, weight
    pt = mul_type(xt, wt)
    f = pt.F
    bt = None
    if bias is not None and b_raw is not None:
        bt = bias
        f = max(f, bt.F)
    xmax = max(abs(xt.min_raw), abs(xt.max_raw))
    w = np.abs(np.asarray(w_raw, dtype=object))  # Python ints: the bound itself is exact
    bound = (w.sum(axis=0) * xmax) << (f - pt.F)
    if bt is not None:
        bound = bound + (np.abs(np.asarray(b_raw, dtype=object)) << (f - bt.F))
    worst = int(max(bound.max(initial=0), 1))
    width = worst.bit_length() + 1  # signed: -2**(W-1) .. 2**(W-1) - 1 holds +-worst
    if width > _MAX_ACC_BITS:
        raise ValueError(f"an exact accumulator needs {width} bits, beyond the {_MAX_ACC_BITS}-bit datapath")
    return FixedType(width, width - f, True, "AP_TRN", "AP_WRAP")


def check_da_constant(t: FixedType, what: str) -> None:
    """Refuse a weight/bias type da4ml would not read exactly (see the module docstring)."""
    if t.width > DA_MAX_CONST_BITS or t.F > DA_MAX_CONST_F:
        raise ValueError(f"{what} type {t}: distributed_arithmetic takes constants of at most {DA_MAX_CONST_BITS} bits "
                         f"and {DA_MAX_CONST_F} fraction bits (da4ml reads weights as float32)")


def with_exact_accum(input_type: FixedType | str, layers, tensors: Mapping[str, np.ndarray]):
    """``layers`` with every dense layer's ``accum`` replaced by :func:`exact_accum` (DA's semantics)."""
    out, prev = [], FixedType.parse(input_type)
    for layer in layers:
        if layer.op == "dense":
            b = tensors.get(f"{layer.name}.bias") if layer.use_bias else None
            acc = exact_accum(prev, layer.weight, layer.bias if layer.use_bias else None, tensors[f"{layer.name}.weight"], b)
            layer = replace(layer, accum=acc)
        out.append(layer)
        prev = layer.result
    return out

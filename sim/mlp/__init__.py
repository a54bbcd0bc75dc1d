"""Bit-exact reference of hls4ml's io_parallel datapath for small scoring MLPs (Vitis backend).

Every rule below is read from the C++ hls4ml generates and compiles (``nnet_utils`` in the
installed hls4ml, ``firmware/parameters.h`` / ``defines.h`` of a written project); the proof is
``tests/hls/test_mlp_hls4ml.py``, which compares against hls4ml's own compiled C-simulation.

- Input: ``input_t(double)`` (the ``myproject_double`` bridge converts each feature that way).
- Dense (``nnet_dense_latency.h``): ``mult = (accum_t)(x * w)`` with the full-precision product,
  ``acc = (accum_t)bias``, then ``acc += mult`` input by input in index order (each step assigned
  back into ``accum_t``), finally ``res = (result_t)acc``.
- BatchNorm (``nnet_batchnorm.h``, ``normalize``): ``res = (result_t)(x * scale + bias)`` with the
  exact product and sum.
- ReLU: ``x > 0 ? (result_t)x : 0``. LeakyReLU: ``x > 0 ? (result_t)x : (result_t)(alpha * x)``
  with ``alpha = (param_t)(double)negative_slope``.
- Sigmoid / Tanh (``nnet_activation.h``): a ``table_size``-entry table built at first call in
  float (``1.0 / (1 + std::exp(-x))`` returned as float; ``tanh`` resolves to ``tanhf``) over
  [-8, 8) / [-4, 4) and stored in ``table_t``; the index is
  ``int(x * table_size / 16) + table_size / 2`` (``/ 8`` for tanh), clamped to the table.
  The float functions come from this machine's libm (``expf`` / ``tanhf`` through ctypes): NumPy's
  own float32 ``exp`` differs from glibc's in the last bit for some inputs, which can move a table
  entry by one LSB after rounding into ``table_t``.
- Output: ``double(result_t)``.

Weights reach the C++ as decimal text: hls4ml prints each float with ``F`` decimals (``F`` = the
weight type's fraction bits, at least 0) and the firmware converts that text to the type;
:func:`quantize_like_hls4ml` reproduces that path.

Example::

    from offload.sim.mlp import MlpLayer, simulate
    layers = [MlpLayer("fc0", "dense", 4, 1, "ap_fixed<16,6>", weight="ap_fixed<8,2>",
                       bias="ap_fixed<8,2>", accum="ap_fixed<24,10>")]
    y = simulate("ap_fixed<16,6>", layers, {"fc0.weight": w_raw, "fc0.bias": b_raw}, x)
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from offload.sim.mlp import datapath, fused
from offload.sim.mlp.datapath import OPS, MlpLayer, _ftype, activation_table, forward, quantize_like_hls4ml
from offload.sim.mlp.plan import PLAN_MAX_ROWS, plan_for

__all__ = [
    "OPS",
    "MlpLayer",
    "activation_table",
    "forward",
    "quantize_like_hls4ml",
    "simulate",
    "bind",
]


def simulate(input_type: str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Float64 outputs [B, n_out], bit for bit what hls4ml's C-simulation ``predict`` returns.

    The fused compiled program of ``(layers, tensors)`` (:mod:`offload.sim.mlp.fused`; built at
    the first call, reused while the same tuple and arrays are passed) runs every batch it can;
    where it cannot (numba missing, a type outside its int64 bounds), small batches run the NumPy
    plan (:mod:`offload.sim.mlp.plan`) and the rest :func:`forward`. Inputs it cannot quantize
    exactly in float (|x * 2**F| >= 2**62, inf, NaN) take :func:`forward` too.
    """
    if (
        datapath._FAST_DENSE
        and isinstance(x, np.ndarray)
        and x.ndim == 2
        and x.shape[0] > 0
        and layers
        and x.shape[1] == layers[0].n_in
    ):
        xf = x if x.dtype == np.float64 else x.astype(np.float64)
        prog = fused.program_for(input_type, layers, tensors)
        if prog is not None:
            y = prog.run(xf)
            if y is not None:
                return y
        elif x.shape[0] <= PLAN_MAX_ROWS:
            plan = plan_for(input_type, layers, tensors)
            if plan is not None:
                y = plan.run(xf)
                if y is not None:
                    return y
    raw = forward(input_type, layers, tensors, x)
    last = _ftype(layers[-1].result if layers else input_type)
    return last.to_float(raw)


def bind(input_type: str, layers: Sequence[MlpLayer], tensors: Mapping[str, np.ndarray], *, fp32: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """:func:`simulate` of these arguments as one prepared call: ``bind(t, layers, tensors)(x)`` is
    bit for bit ``simulate(t, layers, tensors, x)``. The fused program is looked up once, not on
    every call (about half of a one-row call's cost, before its kernel ran). ``tensors`` must
    not change from now on: the sim device binds its read-only resident copies.

    ``fp32``: rows of FP32 values (float32, or float64 holding them) in, FP32 out: the call gives
    ``simulate(...).astype(np.float32)`` bit for bit, rounded inside the compiled kernel where it
    runs (:meth:`~offload.sim.mlp.fused.Program.run_fp32`), for a server whose wire type is FP32.

    Example::

        run = bind("ap_fixed<16,6>", layers, tensors)
        y = run(x)
    """
    prog = fused.program_for(input_type, layers, tensors)
    n_in = layers[0].n_in if layers else -1

    def run(x: np.ndarray) -> np.ndarray:
        if prog is not None and datapath._FAST_DENSE and x.ndim == 2 and x.shape[0] > 0 and x.shape[1] == n_in:
            y = prog.run(x)
            if y is not None:
                return y
        return simulate(input_type, layers, tensors, x)

    def general_fp32(x: np.ndarray) -> np.ndarray:
        return simulate(input_type, layers, tensors, np.asarray(x, dtype=np.float64)).astype(np.float32)

    if fp32:  # the compiled pass with no frame of ours above it (Program.bind_fp32)
        return general_fp32 if prog is None else prog.bind_fp32(general_fp32)
    return run

#!/usr/bin/env python
"""Compile da4ml's numba solver once, at set-up, instead of in the first test or build that writes
distributed-arithmetic firmware (numba caches it on disk: ``cache=True`` in da4ml's cmvm).

The call is the one hls4ml 1.3 makes per Dense layer
(``hls4ml/backends/vivado/passes/distributed_arithmetic.py``, ``DistributedArithmeticCodegen``):
``FixedVariableArray.from_kif`` of the input type, ``@`` a float matrix, ``+`` a bias, ``comb_trace``.
"""

import numpy as np
from da4ml.codegen.hls import hls_logic_and_bridge_gen
from da4ml.trace import FixedVariableArray, HWConfig, comb_trace

if __name__ == "__main__":
    k, i, f = np.ones(4, np.int16), np.full(4, 3, np.int16), np.full(4, 8, np.int16)
    inp = FixedVariableArray.from_kif(k, i, f, HWConfig(1, -1, -1), solver_options={"hard_dc": 2, "search_all_decompose_dc": True})
    out = inp @ np.array([[0.75, -1.5], [0.125, 2.0], [-0.5, 0.25], [1.0, -0.375]], dtype=np.float32) + np.array([0.5, -0.25])
    hls_logic_and_bridge_gen(comb_trace(inp, out), "warm", "vitis")
    print("da4ml ready")

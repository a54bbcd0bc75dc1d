"""The scoring MLP's arithmetic (hls4ml's io_parallel datapath): the step-by-step reference
(:mod:`.reference`, imported here; its docstring lists the rules) and the fused compiled path
(:mod:`.fused`, imported on its own: it loads numba). The ``mlp`` kernel kind chooses between them.
:mod:`.strategy` holds what hls4ml's dense strategies mean for the arithmetic.

Example::

    from offload.sim.mlp import MlpLayer, simulate
    layers = (MlpLayer("fc0", "dense", 4, 1, "ap_fixed<16,6>", weight="ap_fixed<8,2>",
                       bias="ap_fixed<8,2>", accum="ap_fixed<24,10>"),)
    y = simulate("ap_fixed<16,6>", layers, {"fc0.weight": w_raw, "fc0.bias": b_raw}, x)
"""

from offload.sim.mlp.reference import OPS, MlpLayer, activation_table, forward, quantize_like_hls4ml, simulate

__all__ = ["OPS", "MlpLayer", "activation_table", "forward", "quantize_like_hls4ml", "simulate"]

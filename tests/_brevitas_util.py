"""What the Brevitas tests share: a few training-mode batches to set a net's learned quantizer
statistics, and a net's output on float64 rows as a float64 array (Brevitas reads float32)."""

from __future__ import annotations

import numpy as np
import torch


def calibrated(net: torch.nn.Sequential, n_in: int) -> torch.nn.Sequential:
    """``net`` after three batches of ``randn * 2`` rows in training mode, in eval mode."""
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(256, n_in) * 2)
    return net.eval()


def brevitas_out(net, x: np.ndarray) -> np.ndarray:
    """``net(x)`` as float64 rows ``[len(x), n_out]`` (a QuantTensor's value, or the tensor)."""
    with torch.no_grad():
        y = net(torch.from_numpy(x).float())
    return (y.value if hasattr(y, "value") else y).double().numpy().reshape(len(x), -1)

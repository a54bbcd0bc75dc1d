"""Autograd for the offload ops: they are inference-only, and say so at ``backward()``.

Without a rule, an op registered under CompositeExplicitAutograd returns outputs that claim
``requires_grad=True`` when an input requires grad, and ``backward()`` then "succeeds" with every
``.grad`` left None: training code would silently stop learning through the offloaded layer. A
registered backward that raises turns that into a clear error at the first ``backward()``.
"""

from __future__ import annotations

from typing import Any

import torch

from offload.sim.errors import UnsupportedError

__all__ = ["register_inference_only"]


def register_inference_only(qualname: str, lib: torch.library.Library) -> None:
    """Register a backward for ``qualname`` (``"offload::mlp_score"``) that raises UnsupportedError."""

    def backward(ctx: Any, *grads: Any) -> Any:
        raise UnsupportedError(
            f"{qualname} is not differentiable: offload kernels are inference-only (quantized, "
            "fixed-point, on a card); train the float model, then convert it with from_float / offload.offload"
        )

    torch.library.register_autograd(qualname, backward, lib=lib)

"""torch.library op for resident MLP kernels.

``torch.ops.offload.mlp_score(rid, x)`` scores ``x`` [B, F] (floating point) with the resident
kernel ``rid`` (from :func:`offload.ops.resident.make_resident`) on that kernel's device and returns
[B, n_out] in ``x``'s dtype on ``x``'s device. The kernel's spec fixes layers and types.

Registered like the embedding ops (``Library`` + ``impl`` under CompositeExplicitAutograd and
``register_fake``), so it passes ``torch.library.opcheck`` and stays one node under
``torch.compile(fullgraph=True)``.

Example::

    y = torch.ops.offload.mlp_score(rid, x)
"""

from __future__ import annotations

import numpy as np
import torch

from offload.ops.autograd import register_inference_only
from offload.ops.resident import get_resident

__all__ = ["score_numpy"]

_lib = torch.library.Library("offload", "FRAGMENT")
_lib.define("mlp_score(int rid, Tensor x) -> Tensor")


def score_numpy(rid: int, x: np.ndarray) -> np.ndarray:
    """Run resident kernel ``rid`` on float64 ``x`` [B, F]; returns float64 [B, n_out]."""
    res = get_resident(rid)
    return np.asarray(res.device.run(res.handle, {"x": x})["y"], dtype=np.float64)


def _check(rid: int, x: torch.Tensor) -> int:
    spec = get_resident(rid).kernel.spec
    if not x.dtype.is_floating_point:
        raise TypeError(f"mlp_score: x must be floating point, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != spec.n_features:
        raise ValueError(f"mlp_score: x must have shape [batch, {spec.n_features}], got {list(x.shape)}")
    return spec.n_outputs


def _impl(rid: int, x: torch.Tensor) -> torch.Tensor:
    _check(rid, x)
    xh = x.detach()
    if xh.device.type != "cpu":
        xh = xh.cpu()
    out = score_numpy(rid, xh.to(torch.float64).contiguous().numpy())
    y = torch.from_numpy(out).to(x.dtype)
    return y if x.device.type == "cpu" else y.to(x.device)


def _fake(rid: int, x: torch.Tensor) -> torch.Tensor:
    n_out = _check(rid, x)
    return x.new_empty((x.shape[0], n_out))


_lib.impl("mlp_score", _impl, "CompositeExplicitAutograd")
torch.library.register_fake("offload::mlp_score", _fake, lib=_lib)
register_inference_only("offload::mlp_score", _lib)

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
from offload.kernels.mlp import validate_inputs
from offload.ops.resident import bound_call, get_resident

__all__ = ["score_numpy"]

_lib = torch.library.Library("offload", "FRAGMENT")
_lib.define("mlp_score(int rid, Tensor x) -> Tensor")


def score_numpy(rid: int, x: np.ndarray) -> np.ndarray:
    """Run resident kernel ``rid`` on float64 ``x`` [B, F]; returns float64 [B, n_out]."""
    res = get_resident(rid)
    return np.asarray(res.device.run(res.handle, {"x": x})["y"], dtype=np.float64)


def _check(rid: int, x: torch.Tensor):
    spec = get_resident(rid).kernel.spec
    if not x.dtype.is_floating_point:
        raise TypeError(f"mlp_score: x must be floating point, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != spec.n_features:
        raise ValueError(f"mlp_score: x must have shape [batch, {spec.n_features}], got {list(x.shape)}")
    return spec


def _impl(rid: int, x: torch.Tensor) -> torch.Tensor:
    # One check of the rows (the kind's validate_inputs: finite, within MAX_BATCH), then the
    # device's prepared rows call (bind_rows): float32 rows in, float32 out from the compiled pass
    # where the device has one, no float64 copy either way; else run() as before.
    spec = _check(rid, x)
    res = get_resident(rid)
    xh = x.detach() if x.requires_grad else x
    if not xh.is_cpu:
        xh = xh.cpu()
    fp32 = x.dtype == torch.float32
    rows = bound_call(res, "bind_rows", fp32)
    if rows is None:
        out = score_numpy(rid, xh.to(torch.float64).contiguous().numpy())
        y = torch.from_numpy(out).to(x.dtype)
    else:
        xn = xh.numpy() if fp32 else xh.to(torch.float64).numpy()
        validate_inputs(spec, {"x": xn})
        y = torch.from_numpy(rows(xn))
        if not fp32:
            y = y.to(x.dtype)
    return y if x.device.type == "cpu" else y.to(x.device)


def _fake(rid: int, x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], _check(rid, x).n_outputs))


_lib.impl("mlp_score", _impl, "CompositeExplicitAutograd")
torch.library.register_fake("offload::mlp_score", _fake, lib=_lib)
register_inference_only("offload::mlp_score", _lib, _impl)

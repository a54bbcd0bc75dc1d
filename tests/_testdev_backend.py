"""A Python-only test device, ``testdev``, on torch's PrivateUse1 dispatch key, for the ops' non-CPU
branches on machines without a GPU. Run only in a child process (see tests/ops/test_ops_devices.py):
``rename_privateuse1_backend`` may be called once per process and cannot be undone.

Built the way torch 2.13 tests its own Python backend (test/test_privateuseone_python_backend.py
with ``torch.utils.backend_registration._setup_privateuseone_for_python_backend``): a tensor on
``testdev`` has real metadata (shape, dtype, device) but no CPU storage; its values live in a NumPy
array on the Python object. ``.numpy()`` on it fails like on a CUDA tensor, so a branch that
forgets ``.cpu()`` fails here too, and a result not moved back stays visibly on ``cpu``.

Only the aten ops a device move needs are registered (allocation, copies both ways, detach);
any other op on a ``testdev`` tensor raises NotImplementedError, which is the point: the offload ops
must hand the device nothing but copies.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

NAME = "testdev"
_setup_privateuseone_for_python_backend(NAME)

# Every copy into or out of the device, as (source device type, destination device type, shape).
COPIES: list[tuple[str, str, tuple[int, ...]]] = []


class DeviceTensor(torch.Tensor):
    raw: np.ndarray


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def wrap(arr: np.ndarray, dtype: torch.dtype) -> DeviceTensor:
    t = torch._C._acc.create_empty_tensor(list(arr.shape), dtype)
    t.__class__ = DeviceTensor
    t.raw = arr
    return t


def values(t: torch.Tensor) -> np.ndarray:
    """The device tensor's contents (a test's view, not a copy through torch)."""
    assert t.device.type == NAME, t.device
    return t.raw


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    return wrap(np.zeros(size, dtype=_np_dtype(dtype)), dtype)


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _empty_strided(size, None, dtype=dtype)


def _copy_from(src, dst, non_blocking=False):
    COPIES.append((src.device.type, dst.device.type, tuple(src.shape)))
    if src.device.type == NAME and dst.device.type == NAME:
        dst.raw = src.raw.copy()
    elif src.device.type == NAME:
        dst.copy_(torch.from_numpy(np.ascontiguousarray(src.raw)))
    else:
        dst.raw = src.detach().contiguous().numpy().astype(_np_dtype(dst.dtype), copy=True)
    return dst


def _detach(t):
    return wrap(t.raw, t.dtype)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("empty_strided", _empty_strided, "PrivateUse1")
_lib.impl("empty.memory_format", _empty, "PrivateUse1")
_lib.impl("_copy_from", _copy_from, "PrivateUse1")
_lib.impl("detach", _detach, "PrivateUse1")

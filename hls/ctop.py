"""A kernel's top function, built with g++ (``offload.hls.csim``) and called through ctypes.

This is the one place that turns ``HlsKind.sources(spec)`` into something callable: the emu
device runs it behind card buffer semantics, ``offload build`` C-simulates it against the sim
reference, and the test stand-ins for pyxrt/PYNQ run it as their "hardware". Pointer arguments
are passed as NumPy arrays (their data pointer), scalars as numbers, in ``HlsKind.top_args`` order.

Example::

    top = load_top(kernel.spec)
    top([bias, x, y, batch])          # y is written in place
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from offload.hls import csim
from offload.hls.registry import KernelArg, get_hls_kind

__all__ = ["CTop", "load_top"]

_CTYPES = {
    np.dtype(np.int8): ctypes.c_int8,
    np.dtype(np.uint8): ctypes.c_uint8,
    np.dtype(np.int16): ctypes.c_int16,
    np.dtype(np.uint16): ctypes.c_uint16,
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
}


@dataclass(frozen=True)
class CTop:
    """A loaded top function: ``name``, its ``args`` and the shared ``library`` it lives in."""

    name: str
    args: tuple[KernelArg, ...]
    library: str
    _fn: Any

    def __call__(self, values: Sequence[Any]) -> None:
        if len(values) != len(self.args):
            raise TypeError(f"{self.name}: {len(self.args)} arguments expected, got {len(values)}")
        cargs = []
        for a, v in zip(self.args, values):
            if a.role == "scalar":
                cargs.append(v)
            else:
                if not (isinstance(v, np.ndarray) and v.flags.c_contiguous):
                    raise TypeError(f"{self.name}: argument {a.name!r} needs a C-contiguous array")
                cargs.append(ctypes.c_void_p(v.ctypes.data))
        self._fn(*cargs)


_LOCK = threading.Lock()


def load_top(spec: Any) -> CTop:
    """Build (cached by source hash) and load the top function of the kernel described by ``spec``."""
    hk = get_hls_kind(spec.kind)
    args = tuple(hk.top_args(spec))
    name = hk.top_name(spec)
    lib_path = csim.build(hk.sources(spec), shared=True)
    lib = csim.load_library(lib_path)
    argtypes = []
    for a in args:
        if a.role == "scalar":
            dt = np.dtype(a.dtype)
            if dt not in _CTYPES:
                raise TypeError(f"{name}: scalar argument {a.name!r} has unsupported dtype {dt}")
            argtypes.append(_CTYPES[dt])
        else:
            argtypes.append(ctypes.c_void_p)
    with _LOCK:  # the CDLL caches one function object per name; set its signature once, atomically
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None
    return CTop(name, args, str(lib_path), fn)

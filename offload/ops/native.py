"""The C++ kernel of ``torch.ops.offload.embedding_lookup`` (``embedding_native.cpp``): the common
call without Python.

Why: a torch op whose body is Python pays torch's Python-kernel dispatch on every call (~3 us
under ``inference_mode``, about torch's own ``F.embedding_bag`` for one bag). The C++ kernel,
registered for CPU and AutogradCPU, calls the sim device's fused kernels through their C ABI
(:class:`offload.sim.embedding.fused.NativeEntry`, the same compiled loops behind
``numba.cfunc``) with the tensors' own memory, and hands everything it does not serve to
``offload::_embedding_lookup_py``, the Python implementation, through the dispatcher: narrow
index dtypes, per-sample weights, other devices and dtypes, and every call the entry declines
(offsets or indices that break a rule, a bag past ``max_bag_size``, a last offset short of
``len(indices)``, a closed device or released kernel), so errors and results there are exactly
the Python path's.

Built once per source, torch and Python version with ``torch.utils.cpp_extension`` (ninja and a
C++ compiler) into ``$OFFLOAD_CACHE_DIR/torch_ext`` (``~/.cache/offload/torch_ext``), torch's file
lock keeping concurrent builds apart; where it cannot be built the op stays Python, with a
warning logged once. ``OFFLOAD_NATIVE_OPS=0`` keeps it Python.

Example::

    from offload.ops import native
    native.attach(res)   # after this, torch.ops.offload.embedding_lookup(res.id, ...) runs in C++
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
import threading
from pathlib import Path

import numpy as np
import torch

from offload.ops.resident import Resident, get_resident, on_release

__all__ = ["available", "attach", "cache_dir"]

_log = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("embedding_native.cpp")
_state: dict[str, bool] = {}
_lock = threading.Lock()
_attach_lock = threading.Lock()
_KEY = ("native",)


def cache_dir() -> Path:
    """Root of the extension builds (``$OFFLOAD_CACHE_DIR/torch_ext`` or ``~/.cache/offload/torch_ext``)."""
    root = os.environ.get("OFFLOAD_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "offload") / "torch_ext"


def _build() -> None:
    src = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join((src, torch.__version__.encode(), sys.version.encode(), platform.machine().encode()))).hexdigest()[:16]
    name = f"offload_embedding_native_{key}"
    where = cache_dir() / name
    built = where / f"{name}.so"
    if (where / "built").exists():  # written after a finished build: never load a half-written library
        torch.ops.load_library(str(built))
        return
    from torch.utils import cpp_extension

    where.mkdir(parents=True, exist_ok=True)
    # load() builds under torch's FileBaton in `where`: a second process waits for the first's build.
    cpp_extension.load(name=name, sources=[str(_SOURCE)], build_directory=str(where), is_python_module=False,
                       extra_cflags=["-O2"], verbose=False)
    (where / "built").touch()


def _last_line(e: Exception) -> str:
    # A failed build's message ends with the compiler's output: its error lines say why.
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or [""])[-1][:300]


def available() -> bool:
    """Whether the C++ kernel is registered in this process (built or loaded on first use)."""
    ok = _state.get("ok")
    if ok is None:
        with _lock:
            ok = _state.get("ok")
            if ok is None:
                ok = False
                if os.environ.get("OFFLOAD_NATIVE_OPS", "1") != "0":
                    try:
                        _build()
                        ok = True
                    except Exception as e:  # no compiler, no ninja, a failed build: the Python op serves every call
                        _log.warning("offload.ops.native: the C++ embedding_lookup kernel could not be built (%s: %s); "
                                     "the op runs its Python implementation", type(e).__name__, _last_line(e))
                _state["ok"] = ok
    return ok


def attach(res: Resident) -> bool:
    """Serve ``res``'s float32 lookups from C++ where its device hands out a C-ABI entry
    (``bind_native``, the sim device) and the kernel builds; once per resident kernel. True when
    the C++ kernel now serves it."""
    done = res.bound.get(_KEY)
    if done is not None:
        return done
    with _attach_lock:
        done = res.bound.get(_KEY)
        return done if done is not None else _attach(res)


def _attach(res: Resident) -> bool:
    # A kernel released before this attach (a first call racing its module's release) gets none:
    # its entry would outlive the release hook, and the C++ kernel would answer for a released id.
    # Where the C++ kernel is off or failed to build, no entry is asked for: making one compiles
    # the fused kernels' C-ABI wrappers, which nothing would call.
    if not _resident(res) or _state.get("ok") is False or os.environ.get("OFFLOAD_NATIVE_OPS", "1") == "0":
        res.bound[_KEY] = False
        return False
    entry = res.device.bind_native(res.handle)
    ok = entry is not None and available()
    res.bound[("native_entry",)] = entry  # keeps the table and ctx the C++ entry points at alive
    if ok:
        torch.ops.offload._native_embedding_attach(res.id, [
            entry.address[np.dtype(np.int64)], entry.address[np.dtype(np.int32)], entry.table.ctypes.data,
            entry.ctx.ctypes.data, entry.dim, entry.serial_max])
        # Released meanwhile (the release takes the id out of the table, then runs its hooks): its
        # hook may have run before the entry was there, so this attach removes it itself. Checked
        # after registering, one of the two always removes it, with no lock the hook must take.
        if not _resident(res):
            torch.ops.offload._native_embedding_detach(res.id)
            ok = False
    res.bound[_KEY] = ok
    return ok


def _resident(res: Resident) -> bool:
    try:
        return get_resident(res.id) is res
    except KeyError:
        return False


def _detach(res: Resident) -> None:
    # No lock: a release can run from a garbage-collector finalizer in the middle of another
    # kernel's attach on the same thread (which holds the attach lock while numba compiles).
    # Detaching an id the C++ kernel does not hold does nothing, and an attach racing this release
    # checks after registering (see _attach).
    if _state.get("ok"):
        torch.ops.offload._native_embedding_detach(res.id)


on_release(_detach)

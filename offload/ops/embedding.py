"""torch.library ops for resident embedding kernels.

``torch.ops.offload.embedding_lookup(rid, indices, offsets, per_sample_weights, dtype,
include_last_offset=True)`` runs a one-table kernel (``include_last_offset=False``: ``offsets``
holds each bag's start only, as ``torch.nn.EmbeddingBag`` takes them),
``torch.ops.offload.embedding_lookup_tbe(rid, indices, offsets, per_sample_weights, dtype)`` a
table-batched one (T tables, ``offsets`` of length ``T*B+1``, result ``B x sum(dims)``). ``rid`` is the resident kernel id from
:func:`offload.ops.resident.make_resident`; the kernel's spec fixes mode, formats and padding.

Registered with ``torch.library.Library`` + ``impl`` (CompositeExplicitAutograd, so indices on
any device dispatch here) and ``register_fake``: measured cheaper per call than
``torch.library.custom_op`` (see BENCHMARKS.md, "Embedding"), with the same properties (opcheck,
no graph break under ``torch.compile(fullgraph=True)``, a node under ``torch.export``).

A call: the dtypes checked, the tensors' memory read as NumPy arrays (copied only where one is
not contiguous, not on the CPU, or of a narrow integer dtype), the device's one checked pass over
the values (offsets, indices, weights: the kernel kind's), and the result allocated once, in the
requested dtype where the device writes it directly (the sim device's fused kernels write
float32), else converted here.

Example::

    y = torch.ops.offload.embedding_lookup(rid, idx, off, None, torch.float32)
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from offload.ops import native
from offload.ops.autograd import register_inference_only
from offload.ops.resident import bound_call, get_resident
from offload.sim.embedding.fused import using_threads
from offload.kernels.embedding import float32_of, quantize_checked
from offload.sim.errors import IndexDtypeError, InputError, InputTypeError, UnsupportedError

__all__ = ["lookup_numpy", "quantize_weights", "raw_to_tensor"]

_ARGS = "int rid, Tensor indices, Tensor offsets, Tensor? per_sample_weights, ScalarType dtype"
_lib = torch.library.Library("offload", "FRAGMENT")
_lib.define(f"embedding_lookup({_ARGS}, bool include_last_offset=True) -> Tensor")
_lib.define(f"embedding_lookup_tbe({_ARGS}) -> Tensor")
# embedding_lookup's Python implementation as an op of its own: where the C++ kernel is built
# (offload.ops.native) it serves the common call and hands every other one here, through the dispatcher.
_lib.define(f"_embedding_lookup_py({_ARGS}, bool include_last_offset=True) -> Tensor")

# Index dtypes the ops take (torch's embedding_bag takes int32/int64 only, see
# aten/src/ATen/native/EmbeddingBag.cpp at v2.13: checkScalarTypes(... {kLong, kInt})). The kernel
# contract is int32/int64; narrower integers are widened here on the host, losslessly.
_INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)
_NARROW = frozenset((torch.int16, torch.int8, torch.uint8))
_INDEX_SET = frozenset(_INDEX_DTYPES)
_NP_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64}


def _host(t: torch.Tensor) -> np.ndarray:
    # Only the steps a tensor needs: each of detach / cpu / contiguous costs ~0.5-1 us even as a no-op.
    if t.dtype in _NARROW:
        t = t.to(torch.int32)
    if not t.is_cpu:
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()  # integer tensors never require grad


def _host_weights(t: torch.Tensor) -> np.ndarray:
    # float64 holds every bfloat16/float16/float32 value exactly (and NumPy has no bfloat16).
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    if t.dtype != torch.float64:
        t = t.to(torch.float64)
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def quantize_weights(w: np.ndarray, wt, on_overflow: str) -> np.ndarray:
    """Float per-sample weights -> raw ``wt`` integers. Values outside ``wt``'s range are counted
    and handled by ``on_overflow`` (:func:`offload.kernels.embedding.quantize_checked`: warn and
    saturate, raise, or saturate), never wrapped; non-finite weights are refused."""
    if w.size and not np.isfinite(w).all():
        p = int(np.flatnonzero(~np.isfinite(w))[0])
        raise InputError(f"per_sample_weights[{p}] = {float(w[p])}: weights must be finite")
    return np.asarray(quantize_checked(wt, w, "per_sample_weights", on_overflow), dtype=np.int64)


def _run_raw(res, indices: np.ndarray, offsets: np.ndarray, per_sample_weights: np.ndarray | None, raw_weights: np.ndarray | None = None):
    spec = res.kernel.spec
    inputs = {"indices": indices, "offsets": offsets}
    if per_sample_weights is not None:
        if per_sample_weights.dtype.kind != "f":
            raise InputTypeError(f"per_sample_weights: must be floating point, got {per_sample_weights.dtype}")
        raw_weights = quantize_weights(per_sample_weights.astype(np.float64, copy=False), spec.weight_type, res.on_overflow)
    if raw_weights is not None:
        inputs["per_sample_weights"] = raw_weights
    # The sim device's fused kernels use as many threads as torch would (other devices ignore it).
    with using_threads(torch.get_num_threads()):
        return res.device.run(res.handle, inputs)["out"], spec.out_type


def lookup_numpy(rid: int, indices: np.ndarray, offsets: np.ndarray, per_sample_weights: np.ndarray | None) -> np.ndarray:
    """Run the resident kernel on host arrays; returns the float64 pooled rows ``B x total_dim``.

    ``per_sample_weights`` are floats, quantized here to the kernel's ``weight_type``
    (see :func:`quantize_weights`).
    """
    raw, out_t = _run_raw(get_resident(rid), indices, offsets, per_sample_weights)
    return np.asarray(out_t.to_float(raw), dtype=np.float64)


def raw_to_tensor(raw: np.ndarray, out_t, dtype: torch.dtype) -> torch.Tensor:
    """A kernel's raw fixed-point output ``raw`` (format ``out_t``) as a tensor of ``dtype``:
    float32 by the fused kernels' one multiply, any other dtype through float64.

    Example::

        y = raw_to_tensor(raw, spec.out_type, torch.float32)
    """
    if dtype == torch.float32:  # what the fused kernels write when asked for float32
        return torch.from_numpy(float32_of(raw, out_t))
    out = np.asarray(out_t.to_float(raw), dtype=np.float64)
    np_dt = _NP_DTYPES.get(dtype)
    return torch.from_numpy(out.astype(np_dt)) if np_dt is not None else torch.from_numpy(out).to(dtype)


_INDEX_NAMES = ", ".join(str(d).replace("torch.", "") for d in _INDEX_DTYPES)


def _dtype_error(indices: torch.Tensor, offsets: torch.Tensor, psw: Optional[torch.Tensor]) -> Exception:
    if indices.dtype not in _INDEX_SET:
        return IndexDtypeError(f"indices: dtype must be one of {_INDEX_NAMES}, got {indices.dtype}")
    if offsets.dtype not in _INDEX_SET:
        return IndexDtypeError(f"offsets: dtype must be one of {_INDEX_NAMES}, got {offsets.dtype}")
    return InputTypeError(f"per_sample_weights: dtype must be floating point, got {psw.dtype}")


def _with_end(off: np.ndarray, n: int) -> np.ndarray:
    """Bag starts plus the end, ``len(indices)``: the offsets the kernels take (int64)."""
    full = np.empty(off.shape[0] + 1, dtype=np.int64)
    full[:-1] = off
    full[-1] = n
    return full


def _impl(rid: int, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor], dtype: torch.dtype,
          include_last_offset: bool = True, single: bool = False) -> torch.Tensor:
    if indices.dtype not in _INDEX_SET or offsets.dtype not in _INDEX_SET or not (
            per_sample_weights is None or per_sample_weights.dtype.is_floating_point):
        raise _dtype_error(indices, offsets, per_sample_weights)
    res = get_resident(rid)
    spec = res.kernel.spec
    idx, off = _host(indices), _host(offsets)
    if not include_last_offset:
        off = _with_end(off, idx.shape[0])
    w = None if per_sample_weights is None else _host_weights(per_sample_weights)
    if single:
        if spec.num_tables != 1:
            raise InputError("embedding_lookup: the kernel has several tables; use embedding_lookup_tbe")
        if include_last_offset:
            idx, off, w = _last_bag_as_torch(spec, idx, off, w)
    if w is not None:
        w = quantize_weights(w, spec.weight_type, res.on_overflow)
    fp32 = dtype == torch.float32
    lookup = bound_call(res, "bind_checked", fp32)
    if lookup is None:
        raw, out_t = _run_raw(res, idx, off, None, w)
        y = raw_to_tensor(raw, out_t, dtype)
    else:
        n = torch.get_num_threads()
        if n == 1:  # the fused kernels' default: no context to enter
            out = lookup(idx, off, w)
        else:
            with using_threads(n):
                out = lookup(idx, off, w)
        y = torch.from_numpy(out) if fp32 else raw_to_tensor(out, spec.out_type, dtype)
    if single and fp32:
        native.attach(res)  # from the next call on, the C++ kernel serves what it can
    return y if indices.is_cpu else y.to(indices.device)


def _last_bag_as_torch(spec, idx: np.ndarray, off: np.ndarray, w: np.ndarray | None):
    """A last offset short of ``len(indices)`` (include_last_offset), as torch 2.13's CPU kernel
    (aten/src/ATen/native/EmbeddingBag.cpp) reads it: the last bag runs to ``len(indices)`` in mode
    max or with a padding_idx (pytorch issue 89677, pinned by test_embeddingbag_include_last_offset),
    to the last offset in mode sum; in mode mean torch sums to the last offset but divides by the
    count to ``len(indices)``, which no bag layout gives: refused (documented) rather than guessed."""
    n = idx.shape[0]
    if off.shape[0] < 2:
        return idx, off, w
    last = int(off[-1])
    if last >= n or last < int(off[-2]):
        return idx, off, w  # the usual case, or offsets validate() refuses
    if spec.mode == "max" or spec.tables[0].padding_idx is not None:
        off = off.copy()
        off[-1] = n
        return idx, off, w
    if spec.mode == "mean":
        raise UnsupportedError(
            f"offsets: include_last_offset with a last offset ({last}) short of len(input) ({n}) in mode 'mean' "
            "without padding_idx: torch 2.13 divides that bag by a count it does not sum; pass offsets[-1] == len(input)")
    return idx[:last], off, None if w is None else w[:last]


def _impl_single(rid, indices, offsets, per_sample_weights, dtype, include_last_offset=True):
    return _impl(rid, indices, offsets, per_sample_weights, dtype, include_last_offset, True)


def _impl_tbe(rid, indices, offsets, per_sample_weights, dtype):
    return _impl(rid, indices, offsets, per_sample_weights, dtype)


def _fake_single(rid, indices, offsets, per_sample_weights, dtype, include_last_offset=True):
    spec = get_resident(rid).kernel.spec
    b = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    return indices.new_empty((b, spec.out_dim), dtype=dtype)


def _fake(rid, indices, offsets, per_sample_weights, dtype):
    spec = get_resident(rid).kernel.spec
    b = (offsets.shape[0] - 1) // spec.num_features
    return indices.new_empty((b, spec.out_dim), dtype=dtype)


for _name, _fn, _fk in (("embedding_lookup", _impl_single, _fake_single), ("_embedding_lookup_py", _impl_single, _fake_single),
                        ("embedding_lookup_tbe", _impl_tbe, _fake)):
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"offload::{_name}", _fk, lib=_lib)
    register_inference_only(f"offload::{_name}", _lib, _fn, shown="offload::embedding_lookup" if _fn is _impl_single else None)

"""torch.library ops for resident embedding kernels.

``torch.ops.offload.embedding_lookup(rid, indices, offsets, per_sample_weights, dtype)`` runs a
one-table kernel, ``torch.ops.offload.embedding_lookup_tbe(...)`` a table-batched one (T tables,
``offsets`` of length ``T*B+1``, result ``B x sum(dims)``). ``rid`` is the resident kernel id from
:func:`offload.ops.resident.make_resident`; the kernel's spec fixes mode, formats and padding.

Registered with ``torch.library.Library`` + ``impl`` (CompositeExplicitAutograd, so indices on
any device dispatch here) and ``register_fake``: measured cheaper per call than
``torch.library.custom_op`` (see BENCHMARKS.md, "Embedding"), with the same properties (opcheck,
no graph break under ``torch.compile(fullgraph=True)``, a node under ``torch.export``).

Example::

    y = torch.ops.offload.embedding_lookup(rid, idx, off, None, torch.float32)
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from offload.ops.autograd import register_inference_only
from offload.ops.resident import get_resident
from offload.sim.embedding.fused import using_threads
from offload.kernels.embedding import quantize_checked
from offload.sim.errors import IndexDtypeError, InputError, InputTypeError, UnsupportedError

__all__ = ["lookup_numpy", "quantize_weights"]

_SCHEMA = "(int rid, Tensor indices, Tensor offsets, Tensor? per_sample_weights, ScalarType dtype) -> Tensor"
_lib = torch.library.Library("offload", "FRAGMENT")
_lib.define("embedding_lookup" + _SCHEMA)
_lib.define("embedding_lookup_tbe" + _SCHEMA)

# Index dtypes the ops take (torch's embedding_bag takes int32/int64 only, see
# aten/src/ATen/native/EmbeddingBag.cpp at v2.13: checkScalarTypes(... {kLong, kInt})). The kernel
# contract is int32/int64; narrower integers are widened here on the host, losslessly.
_INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)
_NARROW = (torch.int16, torch.int8, torch.uint8)
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


def _run_raw(res, indices: np.ndarray, offsets: np.ndarray, per_sample_weights: np.ndarray | None):
    spec = res.kernel.spec
    inputs = {"indices": indices, "offsets": offsets}
    if per_sample_weights is not None:
        if per_sample_weights.dtype.kind != "f":
            raise InputTypeError(f"per_sample_weights: must be floating point, got {per_sample_weights.dtype}")
        inputs["per_sample_weights"] = quantize_weights(per_sample_weights.astype(np.float64, copy=False),
                                                        spec.weight_type, res.on_overflow)
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


def _to_dtype(raw: np.ndarray, out_t, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32 and 0 <= out_t.F <= 126:
        # round(raw) * 2^-F in float32 equals round(raw * 2^-F): scaling by a power of two commutes
        # with rounding while results stay normal (|value| >= 2^-F >= 2^-126 for 0 <= F <= 126).
        # A multiply by the exact float32 2^-F instead of ldexp: ~1 us against ~9 us for a small result.
        y = raw.astype(np.float32)
        y *= np.float32(2.0 ** -out_t.F)
        return torch.from_numpy(y)
    if dtype == torch.float32:  # F outside [0, 126] (2^-F not a normal float32): the two steps as before
        y = raw.astype(np.float32)
        np.ldexp(y, np.int32(-out_t.F), out=y)
        return torch.from_numpy(y)
    out = np.asarray(out_t.to_float(raw), dtype=np.float64)
    np_dt = _NP_DTYPES.get(dtype)
    return torch.from_numpy(out.astype(np_dt)) if np_dt is not None else torch.from_numpy(out).to(dtype)


_INDEX_NAMES = ", ".join(str(d).replace("torch.", "") for d in _INDEX_DTYPES)


def _check(indices: torch.Tensor, offsets: torch.Tensor, psw: Optional[torch.Tensor]) -> None:
    if indices.dtype not in _INDEX_DTYPES:
        raise IndexDtypeError(f"indices: dtype must be one of {_INDEX_NAMES}, got {indices.dtype}")
    if offsets.dtype not in _INDEX_DTYPES:
        raise IndexDtypeError(f"offsets: dtype must be one of {_INDEX_NAMES}, got {offsets.dtype}")
    if psw is not None and not psw.dtype.is_floating_point:
        raise InputTypeError(f"per_sample_weights: dtype must be floating point, got {psw.dtype}")


def _impl(rid: int, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor], dtype: torch.dtype,
          single: bool = False) -> torch.Tensor:
    _check(indices, offsets, per_sample_weights)
    res = get_resident(rid)
    idx, off = _host(indices), _host(offsets)
    w = None if per_sample_weights is None else _host_weights(per_sample_weights)
    if single:
        if res.kernel.spec.num_tables != 1:
            raise InputError("embedding_lookup: the kernel has several tables; use embedding_lookup_tbe")
        idx, off, w = _last_bag_as_torch(res.kernel.spec, idx, off, w)
    raw, out_t = _run_raw(res, idx, off, w)
    y = _to_dtype(raw, out_t, dtype)
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


def _impl_single(rid, indices, offsets, per_sample_weights, dtype):
    return _impl(rid, indices, offsets, per_sample_weights, dtype, single=True)


def _fake(rid, indices, offsets, per_sample_weights, dtype):
    spec = get_resident(rid).kernel.spec
    b = (offsets.shape[0] - 1) // spec.num_features
    return indices.new_empty((b, spec.out_dim), dtype=dtype)


_lib.impl("embedding_lookup", _impl_single, "CompositeExplicitAutograd")
_lib.impl("embedding_lookup_tbe", _impl, "CompositeExplicitAutograd")
torch.library.register_fake("offload::embedding_lookup", _fake, lib=_lib)
torch.library.register_fake("offload::embedding_lookup_tbe", _fake, lib=_lib)
register_inference_only("offload::embedding_lookup", _lib, _impl_single)
register_inference_only("offload::embedding_lookup_tbe", _lib, _impl)

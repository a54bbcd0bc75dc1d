"""FBGEMM users: ``TableBatchedEmbeddingBags.from_fbgemm(tbe)``, pre-quantized row-wise tables in
FBGEMM's layouts, and FBGEMM's bounds-check modes. Behaviour follows fbgemm_gpu v1.8.0's sources:

- ``split_table_batched_embeddings_ops_training.py`` (``SplitTableBatchedEmbeddingBagsCodegen``:
  ``embedding_specs`` of ``(rows, dim, location, compute_device)``, ``feature_table_map``,
  ``pooling_mode``, ``split_embedding_weights()``);
- ``split_table_batched_embeddings_ops_inference.py`` (``IntNBitTableBatchedEmbeddingBagsCodegen``:
  ``embedding_specs`` of ``(name, rows, dim, SparseType, location)``; an INT8 row is
  ``[fp16 scale, fp16 bias, codes]`` unless ``reverse_qparam``, see
  ``split_embedding_weights_with_scale_bias(2)``);
- ``codegen/utils/embedding_bounds_check_host_cpu.cpp`` (``bounds_check_indices_cpu``: FATAL raises;
  WARNING logs the first case and sets an out-of-range index to 0 and clamps offsets; IGNORE does
  the same silently; it edits the caller's tensors in place, which offload never does).

The torch ``quantized::embedding_bag_byte_rowwise_offsets`` layout is ``[codes, fp32 scale, fp32
bias]`` (8 bytes at the row end). Either way offload stores scale and bias as exact fixed-point
numbers (fp16 and fp32 are dyadic rationals), so ``code * scale + bias`` is the exact real value;
FBGEMM's float dequantization rounds it once to float32.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Optional, Sequence

import numpy as np
import torch

from offload.host import Device
from offload.kernels import Kernel
from offload.kernels.embedding import DEFAULT_WEIGHT_TYPE, ROWWISE, EmbeddingSpec, TableSpec, longest_exact_bag
from offload.nn.embedding_kernel import embedding_kernel, embedding_spec, float_table, table_spec
from offload.sim.errors import FormatError, InputError, InputIndexError
from offload.sim.fixed import FixedType

__all__ = ["BOUNDS_CHECK_MODES", "rowwise_params", "split_rowwise", "bounds_check", "rowwise_kernel", "from_fbgemm", "from_rowwise"]

# fbgemm_gpu/tbe/config/embedding_config.py (v1.8.0) BoundsCheckMode values -> offload's names. NONE
# (no checks at all) becomes "fatal": offload never reads outside a table; V2_* are the same modes.
BOUNDS_CHECK_MODES = {0: "fatal", 1: "warning", 2: "ignore", 3: "fatal", 4: "ignore", 5: "warning", 6: "fatal"}
# SparseType values (fbgemm_gpu/split_embedding_configs.py) of the output dtypes offload returns.
_OUTPUT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_POOLING = {0: "sum", 1: "mean"}  # PoolingMode.SUM, MEAN; NONE (2) returns unpooled rows
# The raw (scale, bias) pairs are stored in int64 containers; the kernel's own width rules
# (value x weight products, the accumulator) refuse narrower types than this, and rowwise_kernel then
# names the rows that need them.
_MAX_PARAM_WIDTH = 64
_NO_BITS = -(1 << 20)  # a zero's integer bits: below any finite float's (-1073)


def _exact_bits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per finite float64 value: the signed integer bits (negative below 0.5 in magnitude) and the
    fraction bits that hold it exactly, so that ``ap_fixed<max(i) + max(f), max(i)>`` holds every
    value of ``x``. Zero needs neither: ``_NO_BITS`` and 0."""
    m, e = np.frexp(x)  # x = m * 2^e, 0.5 <= |m| < 1 (m = e = 0 for zero)
    mant = np.ldexp(np.abs(m), 53).astype(np.int64)  # |x| = mant * 2^(e-53), mant < 2^53: exact
    low = (mant & -mant).astype(np.float64)  # lowest set bit, a power of two
    tz = np.frexp(low)[1] - 1
    nz = mant > 0
    frac = np.where(nz, np.maximum(0, 53 - e - tz), 0)
    # |x| lies in [2^(e-1), 2^e): e integer bits and a sign bit; a negative power of two is the
    # two's complement minimum of e bits and a sign, so it needs one bit fewer.
    ints = np.where(nz, e + 1 - ((x < 0) & (mant == 1 << 52)), _NO_BITS)
    return ints.astype(np.int64), frac.astype(np.int64)


def _culprits(s: np.ndarray, b: np.ndarray, ints: np.ndarray, frac: np.ndarray) -> str:
    """The rows whose values set the shared type's integer and fraction bits, with the values."""
    n = s.shape[0]

    def name(i: int) -> str:
        r = i % n
        return f"row {r} ({'scale' if i < n else 'bias'} {float(s[r] if i < n else b[r])!r})"

    i, f = int(np.argmax(ints)), int(np.argmax(frac))
    if frac[f] == 0 or i == f:
        return name(i)
    if i % n == f % n:
        return f"row {i % n} (scale {float(s[i % n])!r}, bias {float(b[i % n])!r})"
    return f"{name(i)} with {name(f)}"


def rowwise_params(scale: np.ndarray, bias: np.ndarray, max_width: int = _MAX_PARAM_WIDTH, *,
                   table: str = "scale/bias") -> tuple[FixedType, np.ndarray]:
    """The narrowest ``ap_fixed`` holding every ``scale`` and ``bias`` exactly, and the raw
    ``rows x 2`` (scale, bias) in it. Refuses non-finite or negative scales and types wider than
    ``max_width`` with an error naming the row and the value (``table`` prefixes it)."""
    s = np.asarray(scale, dtype=np.float64).reshape(-1)
    b = np.asarray(bias, dtype=np.float64).reshape(-1)
    bad = ~(np.isfinite(s) & np.isfinite(b))
    if bad.any():
        r = int(np.argmax(bad))
        raise InputError(f"{table}: row {r}: scale {float(s[r])!r}, bias {float(b[r])!r}: non-finite row-wise parameters")
    if s.size and s.min() < 0:
        r = int(np.argmin(s))
        raise InputError(f"{table}: row {r}: scale {float(s[r])!r} must be >= 0 (FBGEMM's row-wise scale is range/255)")
    both = np.concatenate([s, b])
    ints, frac = _exact_bits(both)
    f = int(frac.max(initial=0))
    width = max(2, int(ints.max(initial=_NO_BITS)) + f)
    if width > max_width:  # checked before the type is built: exact fp64 values can need more than 1024 bits
        raise FormatError(f"{table}: {_culprits(s, b, ints, frac)} needs ap_fixed<{width},{width - f},AP_RND_CONV,AP_SAT> "
                          f"to hold every scale and bias exactly, wider than {max_width} bits")
    ptype = FixedType(width, width - f, rounding="AP_RND_CONV", overflow="AP_SAT")
    # Exact: each value times 2^f is an integer below 2^(width-1) <= 2^63 in magnitude.
    raw = np.ldexp(both, f).astype(np.int64)
    n = s.shape[0]
    return ptype, np.stack([raw[:n], raw[n:]], axis=1)


def split_rowwise(packed: torch.Tensor, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes, scale, bias)`` of packed uint8 rows: ``layout="fp32_end"`` (torch's
    ``*_byte_rowwise`` ops: ``[codes, fp32 scale, fp32 bias]``) or ``"fp16_front"`` (FBGEMM's IntNBit
    TBE: ``[fp16 scale, fp16 bias, codes]``)."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2:
        raise InputError(f"packed: expected a 2-D torch.uint8 tensor, got {getattr(packed, 'dtype', type(packed).__name__)}")
    p = packed.detach().cpu().contiguous().numpy()
    if layout == "fp32_end":
        if p.shape[1] < 8:
            raise InputError(f"packed: fp32_end rows need 8 bytes of scale and bias, got {p.shape[1]} bytes")
        sb = np.ascontiguousarray(p[:, -8:]).view("<f4")
        return np.ascontiguousarray(p[:, :-8]), sb[:, 0], sb[:, 1]
    if layout == "fp16_front":
        if p.shape[1] < 4:
            raise InputError(f"packed: fp16_front rows need 4 bytes of scale and bias, got {p.shape[1]} bytes")
        sb = np.ascontiguousarray(p[:, :4]).view("<f2")
        return np.ascontiguousarray(p[:, 4:]), sb[:, 0], sb[:, 1]
    raise InputError(f"layout: must be 'fp32_end' or 'fp16_front', got {layout!r}")


def _rowwise_table(name: str, codes: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> tuple[TableSpec, dict[str, np.ndarray]]:
    codes = np.array(codes, dtype=np.uint8)  # a copy: rows of zero scale are rewritten below
    ptype, params = rowwise_params(scale, bias, table=f"table {name!r}")
    # A zero scale (a constant row) is code*0 + bias = bias: code 0 with the smallest scale is the same
    # value, and the kernel's params need scale >= 1 lsb.
    zero = params[:, 0] == 0
    codes[zero] = 0
    params[zero, 0] = 1
    ts = TableSpec(name, codes.shape[0], codes.shape[1], ROWWISE, ptype)
    return ts, {"table": codes, "params": params.astype(ts.fmt.params_dtype)}


def rowwise_kernel(name: str, tables: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray]], *, mode: str = "sum",
                   feature_table_map: Optional[Sequence[int]] = None, max_bag_size: Optional[int] = None,
                   weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE, weighted_mean: bool = False) -> Kernel:
    """A kernel over pre-quantized row-wise tables ``(name, codes, scale, bias)``, stored exactly.
    A table whose scale and bias need a type the kernel cannot take is refused with a
    :class:`FormatError` naming the rows and values that set the type."""
    specs, tensors = [], {}
    for t, (tname, codes, scale, bias) in enumerate(tables):
        ts, ten = _rowwise_table(tname, codes, scale, bias)
        specs.append(ts)
        tensors[f"table{t}"], tensors[f"params{t}"] = ten["table"], ten["params"]
    try:
        spec = _spec(specs, mode, feature_table_map, max_bag_size, weight_type, weighted_mean)
    except FormatError as e:
        # Refused again with the narrowest scale/bias type: the other arguments are the cause.
        _spec([replace(ts, param_type="ap_fixed<2,2>") for ts in specs], mode, feature_table_map, max_bag_size, weight_type, weighted_mean)
        # Otherwise the widest table's rows set the type the kernel refused: name them.
        t = max(range(len(specs)), key=lambda i: specs[i].param_type.width)
        tname, _, scale, bias = tables[t]
        s = np.asarray(scale, dtype=np.float64).reshape(-1)
        b = np.asarray(bias, dtype=np.float64).reshape(-1)
        rows = _culprits(s, b, *_exact_bits(np.concatenate([s, b])))
        raise FormatError(f"table {tname!r}: {rows} needs {specs[t].param_type} to hold every scale and bias exactly; {e}") from e
    return Kernel(name, spec, tensors)


def _spec(tables, mode, feature_table_map, max_bag_size, weight_type, weighted_mean) -> EmbeddingSpec:
    if max_bag_size is None:  # exact fp32 scale/bias make wide values: the longest bag that still sums exactly
        max_bag_size = longest_exact_bag(tables, "sum" if weighted_mean else mode, weight_type)
    return embedding_spec(tables, mode=mode, max_bag_size=max_bag_size, weight_type=weight_type,
                          feature_table_map=feature_table_map, weighted_mean=weighted_mean)


def bounds_check(mode: str, rows: Sequence[int], indices: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FBGEMM's ``bounds_check_indices`` on copies: ``"fatal"`` raises, ``"warning"`` warns (with the
    count) and ``"ignore"`` stays silent while offsets are clamped into ``[0, len(indices)]`` bag by bag
    and out-of-range indices become 0. ``rows``: each feature's table rows. The caller's tensors are
    never edited."""
    F = len(rows)
    n = indices.shape[0]
    if offsets.dim() != 1 or offsets.shape[0] < 1 or (offsets.shape[0] - 1) % F:
        raise InputError(f"offsets: length must be F*B+1 with F={F} features, got {tuple(offsets.shape)}")
    B = (offsets.shape[0] - 1) // F
    off = offsets.detach().cpu().to(torch.int64)
    bad_off = bool((off < 0).any() or (off > n).any() or (off[1:] < off[:-1]).any() or int(off[-1]) != n)
    if mode == "fatal":
        if bad_off:
            raise InputError(f"offsets: must be non-decreasing within [0, {n}] and end at len(indices)={n}")
        lim = torch.tensor(rows, dtype=torch.int64).repeat_interleave(torch.diff(off).view(F, B).sum(1))
        idx = indices.detach().cpu().to(torch.int64)
        oob = (idx < 0) | (idx >= lim)
        if bool(oob.any()):
            p = int(oob.nonzero()[0, 0])
            raise InputIndexError(f"indices[{p}] = {int(idx[p])} is out of range for its table with {int(lim[p])} rows")
        return indices, offsets
    off = off.clone()
    if bad_off:
        # adjust_offset_cpu, bag by bag in FBGEMM's order: the last offset first, then each bag's start and end.
        off[-1] = n
        o = off.tolist()
        for b in range(F * B):
            s = max(0, min(o[b], n))
            e = max(s, min(o[b + 1], n))
            o[b], o[b + 1] = s, e
        off = torch.tensor(o, dtype=torch.int64)
    lim = torch.tensor(rows, dtype=torch.int64).repeat_interleave(torch.diff(off).view(F, B).sum(1))
    idx = indices.detach().cpu().to(torch.int64)
    oob = (idx < 0) | (idx >= lim) if n else torch.zeros(0, dtype=torch.bool)
    count = int(oob.sum())
    if count:
        idx = idx.clone()
        idx[oob] = 0
    if mode == "warning" and (count or bad_off):
        warnings.warn(f"bounds check: {count} index(es) outside their table set to 0" + ("; offsets clamped" if bad_off else ""),
                      RuntimeWarning, stacklevel=3)
    return idx.to(indices.device), off.to(offsets.device)


def _sparse_name(t: object) -> str:
    # SparseType is a str-valued Enum ("fp32", "int8", ...); output_dtype attributes hold its int form.
    from fbgemm_gpu.split_embedding_configs import SparseType

    return (t if isinstance(t, SparseType) else SparseType.from_int(int(t))).value


def _output_dtype(tbe) -> torch.dtype:
    name = _sparse_name(tbe.output_dtype)
    if name not in _OUTPUT_DTYPES:
        raise FormatError(f"output_dtype: offload returns fp32, fp16 or bf16, this module's is {name}")
    return _OUTPUT_DTYPES[name]


def _pooling(tbe) -> str:
    mode = int(tbe.pooling_mode)
    if mode not in _POOLING:
        raise FormatError(f"pooling_mode: offload pools bags (SUM or MEAN); this module's is {tbe.pooling_mode!r} (NONE)")
    return _POOLING[mode]


def from_fbgemm(cls, tbe, fmt: str = "ap_fixed<16,6>", *, max_bag_size: Optional[int] = None, weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE,
                device: str | Device | None = None, name: str = "tbe", on_overflow: str = "warn"):
    """``cls`` (TableBatchedEmbeddingBags) from an FBGEMM TBE module; see the module docstring."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    if not isinstance(tbe, (IntNBitTableBatchedEmbeddingBagsCodegen, SplitTableBatchedEmbeddingBagsCodegen)):
        raise TypeError(f"tbe: expected SplitTableBatchedEmbeddingBagsCodegen or IntNBitTableBatchedEmbeddingBagsCodegen, got {type(tbe).__name__}")
    mode = _pooling(tbe)
    ftm = list(tbe.feature_table_map)
    ftm_arg = None if ftm == list(range(len(tbe.embedding_specs))) else ftm
    bounds = BOUNDS_CHECK_MODES[int(tbe.bounds_check_mode_int)]
    if isinstance(tbe, IntNBitTableBatchedEmbeddingBagsCodegen):
        kernel = intnbit_kernel(tbe, name=name, mode=mode, feature_table_map=ftm_arg, max_bag_size=max_bag_size, weight_type=weight_type)
    else:
        weights = [float_table(f"t{t}", w) for t, w in enumerate(tbe.split_embedding_weights())]
        tables = [table_spec(f"t{t}", w, fmt) for t, w in enumerate(weights)]
        kernel = embedding_kernel(name, tables, weights, on_overflow=on_overflow, mode=mode, max_bag_size=max_bag_size,
                                  weight_type=weight_type, feature_table_map=ftm_arg, weighted_mean=True)
    return cls(kernel, device=device, dtype=_output_dtype(tbe), bounds_check=bounds)


def intnbit_kernel(tbe, *, name: str, mode: str, feature_table_map: Optional[Sequence[int]], max_bag_size: Optional[int],
                   weight_type: str) -> Kernel:
    """The exact row-wise kernel of an IntNBit TBE's INT8 tables (FP32/FP16/INT4/INT2 tables are refused)."""
    tables = []
    splits = tbe.split_embedding_weights_with_scale_bias(2)
    for (tname, rows, dim, wty, _), (codes, scale, bias) in zip(tbe.embedding_specs, splits):
        if wty.value != "int8":
            raise FormatError(f"table {tname!r}: weight type {wty.value}; offload loads INT8 row-wise tables from IntNBit TBEs")
        # reverse_qparam puts scale/bias at the row end; split_embedding_weights_with_scale_bias(2) undoes either order.
        tables.append((tname, codes.cpu().numpy(), scale.float().cpu().numpy().reshape(-1), bias.float().cpu().numpy().reshape(-1)))
    return rowwise_kernel(name, tables, mode=mode, feature_table_map=feature_table_map, max_bag_size=max_bag_size,
                          weight_type=weight_type, weighted_mean=mode == "mean")


def from_rowwise(cls, packed: Sequence[torch.Tensor], layout: str = "fp32_end", *, mode: str = "sum",
                 names: Optional[Sequence[str]] = None, feature_table_map: Optional[Sequence[int]] = None,
                 max_bag_size: Optional[int] = None, weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE, device: str | Device | None = None,
                 dtype: torch.dtype = torch.float32, bounds_check: str = "fatal", name: str = "rowwise"):
    """``cls`` (TableBatchedEmbeddingBags) over pre-quantized packed uint8 tables, one per entry of
    ``packed``, in ``layout`` (see :func:`split_rowwise`); values are ``code * scale + bias`` exactly."""
    packed = list(packed)
    names = list(names) if names is not None else [f"t{i}" for i in range(len(packed))]
    if not packed or len(names) != len(packed):
        raise InputError(f"packed/names: need at least one table and one name per table, got {len(packed)} and {len(names)}")
    tables = [(n, *split_rowwise(p, layout)) for n, p in zip(names, packed)]
    kernel = rowwise_kernel(name, tables, mode=mode, feature_table_map=feature_table_map, max_bag_size=max_bag_size,
                            weight_type=weight_type, weighted_mean=mode == "mean")
    return cls(kernel, device=device, dtype=dtype, bounds_check=bounds_check)

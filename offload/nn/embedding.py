"""Drop-ins for ``torch.nn.EmbeddingBag`` / ``torch.nn.Embedding`` whose lookups run on the
active offload device, plus a table-batched form (FBGEMM TBE layout) for many sparse features
in one device round trip.

Tables are quantized once (``fmt``: ``"ap_fixed<W,I,...>"`` or ``"int8_rowwise"``) and uploaded
once (:func:`offload.ops.resident.make_resident`); a call moves only indices, offsets, weights and the
pooled result. Arithmetic: :mod:`offload.sim.embedding`.

Example::

    bag = torch.nn.EmbeddingBag(1000, 16, mode="mean")
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<16,6>")
    y = m(idx, offsets)                      # same call and meaning as bag(idx, offsets)

    tbe = offload.nn.TableBatchedEmbeddingBags.from_float([bag_a, bag_b], fmt="int8_rowwise")
    y = tbe(idx, offsets)                    # offsets: T*B+1 entries; y: B x (Da + Db)
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import numpy as np
import torch

import offload.ops.embedding  # noqa: F401  (registers torch.ops.offload.embedding_lookup*)
from offload.ops import native
from offload.ops.resident import Resident, make_resident, release_resident
from offload.host import Device
from offload.kernels import Kernel
from offload.kernels.embedding import DEFAULT_WEIGHT_TYPE, OVERFLOW_POLICIES, EmbeddingSpec
from offload.nn import fbgemm
from offload.nn.embedding_kernel import embedding_kernel, float_table, table_spec
from offload.sim import embedding as _sim
from offload.sim.errors import (
    IndexDtypeError,
    InputError,
    InputTypeError,
    OffsetsError,
    PerSampleWeightsDtypeError,
    UnsupportedError,
)
from offload.sim.fixed import FixedType

__all__ = ["EmbeddingBag", "Embedding", "TableBatchedEmbeddingBags"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# torch 2.13's embedding_bag takes any of these index/offset dtypes (probed: int8/int16/uint8 are
# accepted next to int32/int64), torch.nn.functional.embedding only int32/int64.
_BAG_INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)
_EMB_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_index_dtypes(allowed, indices: torch.Tensor, offsets: Optional[torch.Tensor]) -> None:
    # Early, static checks (no data reads, so torch.compile traces through them); the kernel's
    # validate() checks values on the device side before any work.
    if not isinstance(indices, torch.Tensor) or indices.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise IndexDtypeError(f"input: dtype must be one of {names}, got {getattr(indices, 'dtype', type(indices).__name__)}")
    if offsets is not None and (not isinstance(offsets, torch.Tensor) or offsets.dtype not in allowed):
        names = ", ".join(str(d) for d in allowed)
        raise IndexDtypeError(f"offsets: dtype must be one of {names}, got {getattr(offsets, 'dtype', type(offsets).__name__)}")


def _check_psw(psw: torch.Tensor, mode: str, dtype: torch.dtype) -> None:
    # torch's order (torch/nn/functional.py embedding_bag, then ATen): mode first, then the dtype,
    # which the CPU kernel wants equal to the weight's ("have the same type as").
    if mode != "sum":
        raise UnsupportedError(f"per_sample_weights: only supported for mode='sum', this bag's mode is {mode!r}")
    if psw.dtype != dtype:
        raise PerSampleWeightsDtypeError(f"per_sample_weights: dtype {psw.dtype} must be the bag's weight dtype {dtype} (as torch requires)")


class _Resident(torch.nn.Module):
    """Holds one resident embedding kernel; releases it when the module is collected.

    Inference-only: the lookups are fixed-point kernels on a card, with no gradient. An output
    computed from inputs that require grad (``per_sample_weights``) raises
    :class:`~offload.sim.errors.UnsupportedError` at ``backward()`` (:mod:`offload.ops.autograd`).
    """

    def __init__(self, kernel: Kernel, device: str | Device | None, dtype: torch.dtype, on_overflow: str = "warn") -> None:
        super().__init__()
        if dtype not in _FLOAT_DTYPES:
            raise InputTypeError(f"dtype: must be a floating point torch dtype, got {dtype}")
        if on_overflow not in OVERFLOW_POLICIES:
            raise InputError(f"on_overflow: must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")
        self._kernel = kernel
        self._res: Resident = make_resident(kernel, device, on_overflow)
        if dtype == torch.float32:
            # The op's C++ kernel is built (or loaded) and attached here, with the device's JIT,
            # so no lookup pays for it (the op attaches on its first call otherwise).
            native.attach(self._res)
        self.rid: int = self._res.id
        self.dtype = dtype
        self.on_overflow = on_overflow
        weakref.finalize(self, release_resident, self.rid)

    @property
    def spec(self) -> EmbeddingSpec:
        return self._kernel.spec

    def offload_kernels(self) -> list[Kernel]:
        """The kernels this module runs (for the bundle saver)."""
        return [self._kernel]

    def _table_values(self, t: int) -> np.ndarray:
        """Table ``t`` as the kernel reads it (float64, exact: every value type is <= 53 bits wide
        or a multiple of a power of two that float64 rounds like ``to_double()``)."""
        ts = self.spec.tables[t]
        raw = _sim.gather_values(self._kernel.tensors[f"table{t}"], np.arange(ts.num_rows), self._kernel.tensors.get(f"params{t}"))
        return self.spec.value_types[t].to_float(raw)

    def _weight(self, values: np.ndarray) -> torch.Tensor:
        # An inference tensor: in-place writes outside torch.inference_mode raise, and each read
        # is a fresh copy, so nothing a caller does to it reaches the resident table.
        with torch.inference_mode():
            return torch.from_numpy(values).to(self.dtype)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "weight":
            raise UnsupportedError("weight: the table is quantized and resident on the device (read-only); "
                                   "change the float module and convert it again with from_float")
        super().__setattr__(name, value)


class _SingleTable(_Resident):
    @property
    def weight(self) -> torch.Tensor:
        """The dequantized table (``num_embeddings x embedding_dim``, in the module's dtype):
        the values the kernel pools, read-only (a fresh inference tensor on each read)."""
        return self._weight(self._table_values(0))


class EmbeddingBag(_SingleTable):
    """``torch.nn.EmbeddingBag`` on the offload device: modes sum/mean/max, offsets with or without
    ``include_last_offset``, 2-D fixed-length input, ``per_sample_weights`` (sum), ``padding_idx``;
    the same results (to the format's precision), dtypes and error types as torch.

    Refused at conversion: ``max_norm`` (renormalises rows at lookup time), non-finite tables;
    table values the format cannot hold are saturated with a warning, refused, or saturated
    silently (``on_overflow``). Inference-only (see :class:`_Resident`).

    Example::

        m = EmbeddingBag.from_float(torch.nn.EmbeddingBag(100, 8), fmt="int8_rowwise")
        y = m(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2]))
    """

    def __init__(self, kernel: Kernel, *, include_last_offset: bool = False, device: str | Device | None = None,
                 dtype: torch.dtype = torch.float32, on_overflow: str = "warn") -> None:
        if kernel.spec.num_tables != 1:
            raise InputError(f"EmbeddingBag: kernel {kernel.name!r} has {kernel.spec.num_tables} tables; use TableBatchedEmbeddingBags")
        super().__init__(kernel, device, dtype, on_overflow)
        self.include_last_offset = bool(include_last_offset)
        self.mode = kernel.spec.mode
        self.embedding_dim = kernel.spec.tables[0].dim
        self.num_embeddings = kernel.spec.tables[0].num_rows
        self.padding_idx = kernel.spec.tables[0].padding_idx

    @classmethod
    def from_float(
        cls,
        bag: torch.nn.EmbeddingBag,
        fmt: str = "ap_fixed<16,6>",
        *,
        max_bag_size: Optional[int] = None,
        acc_type: Optional[str] = None,
        out_type: Optional[str] = None,
        weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE,
        on_overflow: str = "warn",
        device: str | Device | None = None,
        dtype: Optional[torch.dtype] = None,
        name: str = "embedding_bag",
    ) -> "EmbeddingBag":
        """Quantize ``bag``'s table to ``fmt`` and make it resident on ``device`` (default: active).

        ``max_bag_size``: the longest bag the accumulator is sized for (default
        :data:`~offload.kernels.embedding.DEFAULT_MAX_BAG_SIZE`); longer bags still run.
        ``on_overflow``: table values (and, at call time, per-sample weights) the format cannot
        hold: ``"warn"`` (saturate and warn with the count and worst value), ``"raise"``
        (:class:`~offload.sim.errors.FormatOverflowError`) or ``"saturate"`` (silently).
        ``dtype``: the output dtype, by default the bag's weight dtype (as torch returns).
        """
        if not isinstance(bag, torch.nn.EmbeddingBag):
            raise InputTypeError(f"bag: expected torch.nn.EmbeddingBag, got {type(bag).__name__}")
        if bag.max_norm is not None:
            raise UnsupportedError("bag: max_norm renormalises rows at lookup time; not supported on the offload kernel")
        w = float_table(name, bag.weight)
        ts = table_spec(name, w, fmt, bag.padding_idx)
        kernel = embedding_kernel(name, [ts], [w], on_overflow=on_overflow, mode=bag.mode, max_bag_size=max_bag_size,
                                  acc_type=acc_type, out_type=out_type, weight_type=weight_type)
        return cls(kernel, include_last_offset=bag.include_last_offset, device=device,
                   dtype=bag.weight.dtype if dtype is None else dtype, on_overflow=on_overflow)

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None, per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        # Checks in torch.nn.functional.embedding_bag's order (torch 2.13), so a call with several
        # faults gets the error torch gives.
        if not isinstance(input, torch.Tensor):
            raise IndexDtypeError(f"input: expected a tensor, got {type(input).__name__}")
        if per_sample_weights is not None and per_sample_weights.shape != input.shape:
            raise InputError(f"per_sample_weights: shape {tuple(per_sample_weights.shape)} must be the same shape as the input {tuple(input.shape)}")
        two_d = input.dim() == 2
        if two_d:
            if offsets is not None:
                raise InputError("offsets: must be None for 2-D input (each row is one bag)")
            b, n = input.shape
            if n == 0 and b > 0:
                raise OffsetsError("input: 2-D input with 0 columns has no bag layout (torch: 'step must be nonzero')")
            offsets = torch.arange(b + 1, device=input.device, dtype=torch.int64) * n
            input = input.reshape(-1)
            if per_sample_weights is not None:
                per_sample_weights = per_sample_weights.reshape(-1)
        elif input.dim() == 1:
            if offsets is None:
                raise InputError("offsets: a 1-D offsets tensor is required for 1-D input, got None")
            if offsets.dim() != 1:
                raise InputError(f"offsets: must be a 1-D tensor, got shape {tuple(offsets.shape)}")
        else:
            raise InputError(f"input: must be 1-D or 2-D, got shape {tuple(input.shape)}")
        if per_sample_weights is not None:
            _check_psw(per_sample_weights, self.mode, self.dtype)
        _check_index_dtypes(_BAG_INDEX_DTYPES, input, offsets)
        if not two_d and not self.include_last_offset:
            if offsets.shape[0] == 0:  # no bags: torch returns (0, D) whatever the indices
                return input.new_zeros((0, self.embedding_dim), dtype=self.dtype)
            # The op appends len(input) on the host (a torch.cat here cost ~3 us a call).
            return torch.ops.offload.embedding_lookup(self.rid, input, offsets, per_sample_weights, self.dtype, False)
        elif not two_d and offsets.shape[0] == 0:
            raise OffsetsError("offsets: include_last_offset needs at least 1 offset, got 0")
        return torch.ops.offload.embedding_lookup(self.rid, input, offsets, per_sample_weights, self.dtype)

    def extra_repr(self) -> str:
        s = self.spec
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, fmt={str(s.tables[0].fmt)!r}, acc={str(s.acc_type)!r}"


class Embedding(_SingleTable):
    """``torch.nn.Embedding`` (plain lookup, any input shape) on the same kernel: one-entry bags.

    The padding row is looked up like any other (torch returns ``weight[padding_idx]`` too).
    Indices int32/int64, as torch; an index outside the table raises an error that is both
    ``IndexError`` (as torch's) and ``RuntimeError``. Inference-only (see :class:`_Resident`).

    Example::

        m = Embedding.from_float(torch.nn.Embedding(100, 8), fmt="ap_fixed<16,6>")
        y = m(torch.tensor([[1, 2], [3, 4]]))      # 2 x 2 x 8
    """

    def __init__(self, kernel: Kernel, *, device: str | Device | None = None, dtype: torch.dtype = torch.float32,
                 on_overflow: str = "warn", padding_idx: Optional[int] = None) -> None:
        super().__init__(kernel, device, dtype, on_overflow)
        self.embedding_dim = kernel.spec.tables[0].dim
        self.num_embeddings = kernel.spec.tables[0].num_rows
        self.padding_idx = padding_idx  # the source's, for its surface only: torch looks the row up too

    @classmethod
    def from_float(cls, emb: torch.nn.Embedding, fmt: str = "ap_fixed<16,6>", *, out_type: Optional[str] = None,
                   on_overflow: str = "warn", device: str | Device | None = None, dtype: Optional[torch.dtype] = None,
                   name: str = "embedding") -> "Embedding":
        """Quantize ``emb``'s table to ``fmt`` and make it resident (``on_overflow``, ``dtype`` as
        in :meth:`EmbeddingBag.from_float`)."""
        if not isinstance(emb, torch.nn.Embedding):
            raise InputTypeError(f"emb: expected torch.nn.Embedding, got {type(emb).__name__}")
        if emb.max_norm is not None:
            raise UnsupportedError("emb: max_norm renormalises rows at lookup time; not supported on the offload kernel")
        w = float_table(name, emb.weight)
        ts = table_spec(name, w, fmt, None)
        kernel = embedding_kernel(name, [ts], [w], on_overflow=on_overflow, mode="sum", max_bag_size=1, out_type=out_type)
        return cls(kernel, device=device, dtype=emb.weight.dtype if dtype is None else dtype, on_overflow=on_overflow,
                   padding_idx=emb.padding_idx)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_index_dtypes(_EMB_INDEX_DTYPES, input, None)
        flat = input.reshape(-1)
        offsets = torch.arange(flat.shape[0] + 1, device=input.device, dtype=torch.int64)
        y = torch.ops.offload.embedding_lookup(self.rid, flat, offsets, None, self.dtype)
        return y.reshape(*input.shape, self.embedding_dim)


class TableBatchedEmbeddingBags(_Resident):
    """T embedding bags in one kernel and one device call (FBGEMM's table-batched layout).

    ``forward(indices, offsets, per_sample_weights=None)``: ``indices`` holds all tables' indices
    (table 0's bags first), ``offsets`` has ``T*B+1`` entries (bag ``b`` of table ``t`` is
    ``indices[offsets[t*B+b]:offsets[t*B+b+1]]``); the result is ``B x sum(dims)``, table ``t`` in
    columns ``col_t:col_t+dim_t``. All tables share one mode. ``EmbeddingBag`` is the T=1 case.
    Inference-only (see :class:`_Resident`).

    Example::

        tbe = TableBatchedEmbeddingBags.from_float([bag_a, bag_b], fmt="ap_fixed<16,6>")
        y = tbe(idx, off)
    """

    def __init__(self, kernel: Kernel, *, device: str | Device | None = None, dtype: torch.dtype = torch.float32,
                 bounds_check: str = "fatal", on_overflow: str = "warn") -> None:
        super().__init__(kernel, device, dtype, on_overflow)
        if bounds_check not in ("fatal", "warning", "ignore"):
            raise InputError(f"bounds_check: must be 'fatal', 'warning' or 'ignore' (FBGEMM's BoundsCheckMode), got {bounds_check!r}")
        spec = kernel.spec
        self.mode = spec.mode
        ftm = spec.feature_table_map if spec.feature_table_map is not None else range(spec.num_tables)
        self.dims = [spec.tables[t].dim for t in ftm]
        self.bounds_check = bounds_check
        self._feature_rows = [spec.tables[t].num_rows for t in ftm]

    @classmethod
    def from_fbgemm(cls, tbe: torch.nn.Module, fmt: str = "ap_fixed<16,6>", **kw) -> "TableBatchedEmbeddingBags":
        """From FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` (float tables, quantized to ``fmt``)
        or ``IntNBitTableBatchedEmbeddingBagsCodegen`` (INT8 row-wise tables, loaded exactly): same
        feature_table_map, pooling, bounds-check mode and output dtype. See :mod:`offload.nn.fbgemm`."""
        return fbgemm.from_fbgemm(cls, tbe, fmt, **kw)

    @classmethod
    def from_rowwise(cls, packed: Sequence[torch.Tensor], layout: str = "fp32_end", **kw) -> "TableBatchedEmbeddingBags":
        """From pre-quantized int8 row-wise tables: ``layout="fp32_end"`` (torch's
        ``embedding_bag_byte_prepack``) or ``"fp16_front"`` (FBGEMM's IntNBit rows). See :mod:`offload.nn.fbgemm`."""
        return fbgemm.from_rowwise(cls, packed, layout, **kw)

    @classmethod
    def from_float(
        cls,
        bags: Sequence[torch.nn.EmbeddingBag],
        fmt: str | Sequence[str] = "ap_fixed<16,6>",
        *,
        names: Optional[Sequence[str]] = None,
        max_bag_size: Optional[int] = None,
        acc_type: Optional[str] = None,
        out_type: Optional[str] = None,
        weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE,
        on_overflow: str = "warn",
        device: str | Device | None = None,
        dtype: Optional[torch.dtype] = None,
        name: str = "tbe",
    ) -> "TableBatchedEmbeddingBags":
        """Quantize each bag's table (``fmt`` one for all or one per table) into one kernel
        (``max_bag_size``, ``on_overflow``, ``dtype`` as in :meth:`EmbeddingBag.from_float`; the
        default dtype is the tables' common dtype)."""
        bags = list(bags)
        if not bags or not all(isinstance(b, torch.nn.EmbeddingBag) for b in bags):
            raise InputTypeError("bags: expected a non-empty sequence of torch.nn.EmbeddingBag")
        for i, b in enumerate(bags):
            if b.max_norm is not None:
                raise UnsupportedError(f"bags[{i}]: max_norm renormalises rows at lookup time; not supported on the offload kernel")
        modes = {b.mode for b in bags}
        if len(modes) != 1:
            raise InputError(f"bags: all tables of one kernel share a mode, got {sorted(modes)}")
        fmts = [fmt] * len(bags) if isinstance(fmt, str) else list(fmt)
        names = list(names) if names is not None else [f"t{i}" for i in range(len(bags))]
        if len(fmts) != len(bags) or len(names) != len(bags):
            raise InputError(f"fmt/names: need one per table ({len(bags)})")
        if dtype is None:
            dtypes = {b.weight.dtype for b in bags}
            dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        ws = [float_table(n, b.weight) for n, b in zip(names, bags)]
        tables = [table_spec(n, w, f, b.padding_idx) for n, w, b, f in zip(names, ws, bags, fmts)]
        kernel = embedding_kernel(name, tables, ws, on_overflow=on_overflow, mode=modes.pop(), max_bag_size=max_bag_size,
                                  acc_type=acc_type, out_type=out_type, weight_type=weight_type)
        return cls(kernel, device=device, dtype=dtype, on_overflow=on_overflow)

    @property
    def weights(self) -> list[torch.Tensor]:
        """Each table dequantized (read-only inference tensors, as :attr:`EmbeddingBag.weight`)."""
        return [self._weight(self._table_values(t)) for t in range(self.spec.num_tables)]

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        _check_index_dtypes(_BAG_INDEX_DTYPES, indices, offsets)
        if per_sample_weights is not None:
            if self.mode == "max":  # FBGEMM weights sum and mean bags
                raise UnsupportedError(f"per_sample_weights: only supported with mode 'sum' or 'mean', this kernel's mode is {self.mode!r}")
            if not per_sample_weights.dtype.is_floating_point:
                raise InputTypeError(f"per_sample_weights: dtype must be floating point, got {per_sample_weights.dtype}")
        if self.bounds_check != "fatal":
            indices, offsets = fbgemm.bounds_check(self.bounds_check, self._feature_rows, indices, offsets)
        return torch.ops.offload.embedding_lookup_tbe(self.rid, indices, offsets, per_sample_weights, self.dtype)

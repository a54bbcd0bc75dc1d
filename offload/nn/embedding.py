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

import torch

import offload.ops.embedding  # noqa: F401  (registers torch.ops.offload.embedding_lookup*)
from offload.ops.resident import Resident, make_resident, release_resident
from offload.host import Device
from offload.kernels import Kernel
from offload.kernels.embedding import (
    DEFAULT_WEIGHT_TYPE,
    ROWWISE,
    EmbeddingSpec,
    TableSpec,
    make_kernel,
    make_spec,
    rowwise_param_type,
)
from offload.sim.errors import FormatError, InputError

__all__ = ["EmbeddingBag", "Embedding", "TableBatchedEmbeddingBags"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def _table_spec(name: str, weight: torch.Tensor, fmt: str, padding_idx: Optional[int], bundle: Optional[str] = None) -> TableSpec:
    w = weight.detach().cpu().double().numpy()
    rows, dim = w.shape
    if fmt == ROWWISE:
        return TableSpec(name, rows, dim, ROWWISE, rowwise_param_type(w), padding_idx, bundle)
    return TableSpec(name, rows, dim, fmt, None, padding_idx, bundle)


def _make_kernel(name: str, tables: Sequence[TableSpec], weights: Sequence[torch.Tensor], **spec: object) -> Kernel:
    """The quantized kernel of ``tables``. :mod:`offload.kernels.embedding` refuses with plain
    ValueErrors: in ``make_spec`` a type it cannot parse or hold (format, accumulator or product
    too wide), in ``make_kernel`` table values it cannot represent (NaN); here they become the
    hierarchy's refusals, which the partitioner turns into "kept on host"."""
    try:
        kspec = make_spec(tables, **spec)
    except ValueError as e:
        raise FormatError(str(e)) from e
    try:
        return make_kernel(name, kspec, [w.detach().cpu().double().numpy() for w in weights])
    except ValueError as e:
        raise InputError(str(e)) from e


def _check_dtypes(indices: torch.Tensor, offsets: Optional[torch.Tensor], psw: Optional[torch.Tensor]) -> None:
    # Early, static checks (no data reads, so torch.compile traces through them); the kernel's
    # validate() checks values on the device side before any work.
    if not isinstance(indices, torch.Tensor) or indices.dtype not in _INDEX_DTYPES:
        raise TypeError(f"input: dtype must be torch.int32 or torch.int64, got {getattr(indices, 'dtype', type(indices).__name__)}")
    if offsets is not None and offsets.dtype not in _INDEX_DTYPES:
        raise TypeError(f"offsets: dtype must be torch.int32 or torch.int64, got {offsets.dtype}")
    if psw is not None and not psw.dtype.is_floating_point:
        raise TypeError(f"per_sample_weights: dtype must be floating point, got {psw.dtype}")


class _Resident(torch.nn.Module):
    """Holds one resident embedding kernel; releases it when the module is collected."""

    def __init__(self, kernel: Kernel, device: str | Device | None, dtype: torch.dtype) -> None:
        super().__init__()
        if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise TypeError(f"dtype: must be a floating point torch dtype, got {dtype}")
        self._kernel = kernel
        self._res: Resident = make_resident(kernel, device)
        self.rid: int = self._res.id
        self.dtype = dtype
        weakref.finalize(self, release_resident, self.rid)

    @property
    def spec(self) -> EmbeddingSpec:
        return self._kernel.spec

    def offload_kernels(self) -> list[Kernel]:
        """The kernels this module runs (for the bundle saver)."""
        return [self._kernel]


class EmbeddingBag(_Resident):
    """``torch.nn.EmbeddingBag`` on the offload device: modes sum/mean/max, offsets with or without
    ``include_last_offset``, 2-D fixed-length input, ``per_sample_weights`` (sum), ``padding_idx``.

    Example::

        m = EmbeddingBag.from_float(torch.nn.EmbeddingBag(100, 8), fmt="int8_rowwise")
        y = m(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2]))
    """

    def __init__(self, kernel: Kernel, *, include_last_offset: bool = False, device: str | Device | None = None, dtype: torch.dtype = torch.float32) -> None:
        if kernel.spec.num_tables != 1:
            raise ValueError(f"EmbeddingBag: kernel {kernel.name!r} has {kernel.spec.num_tables} tables; use TableBatchedEmbeddingBags")
        super().__init__(kernel, device, dtype)
        self.include_last_offset = bool(include_last_offset)
        self.mode = kernel.spec.mode
        self.embedding_dim = kernel.spec.tables[0].dim
        self.num_embeddings = kernel.spec.tables[0].num_rows

    @classmethod
    def from_float(
        cls,
        bag: torch.nn.EmbeddingBag,
        fmt: str = "ap_fixed<16,6>",
        *,
        max_bag_size: int = 256,
        acc_type: Optional[str] = None,
        out_type: Optional[str] = None,
        weight_type: str = DEFAULT_WEIGHT_TYPE,
        device: str | Device | None = None,
        dtype: torch.dtype = torch.float32,
        name: str = "embedding_bag",
    ) -> "EmbeddingBag":
        """Quantize ``bag``'s table to ``fmt`` and make it resident on ``device`` (default: active)."""
        if not isinstance(bag, torch.nn.EmbeddingBag):
            raise TypeError(f"bag: expected torch.nn.EmbeddingBag, got {type(bag).__name__}")
        if bag.max_norm is not None:
            raise InputError("bag: max_norm renormalises rows at lookup time; not supported on the offload kernel")
        ts = _table_spec(name, bag.weight, fmt, bag.padding_idx)
        kernel = _make_kernel(name, [ts], [bag.weight], mode=bag.mode, max_bag_size=max_bag_size, acc_type=acc_type,
                              out_type=out_type, weight_type=weight_type)
        return cls(kernel, include_last_offset=bag.include_last_offset, device=device, dtype=dtype)

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None, per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        _check_dtypes(input, offsets, per_sample_weights)
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ValueError(f"per_sample_weights: only supported with mode='sum', this bag's mode is {self.mode!r}")
            if per_sample_weights.shape != input.shape:
                raise ValueError(f"per_sample_weights: shape {tuple(per_sample_weights.shape)} must match input {tuple(input.shape)}")
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError("offsets: must be None for 2-D input (each row is one bag)")
            b, n = input.shape
            offsets = torch.arange(b + 1, device=input.device, dtype=torch.int64) * n
            input = input.reshape(-1)
            if per_sample_weights is not None:
                per_sample_weights = per_sample_weights.reshape(-1)
        elif input.dim() == 1:
            if offsets is None or offsets.dim() != 1:
                raise ValueError("offsets: a 1-D offsets tensor is required for 1-D input")
            if not self.include_last_offset:
                offsets = torch.cat([offsets.to(torch.int64), offsets.new_full((1,), input.shape[0], dtype=torch.int64)])
        else:
            raise ValueError(f"input: must be 1-D or 2-D, got shape {tuple(input.shape)}")
        return torch.ops.offload.embedding_lookup(self.rid, input, offsets, per_sample_weights, self.dtype)

    def extra_repr(self) -> str:
        s = self.spec
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, fmt={s.tables[0].fmt!r}, acc={str(s.acc_type)!r}"


class Embedding(_Resident):
    """``torch.nn.Embedding`` (plain lookup, any input shape) on the same kernel: one-entry bags.

    The padding row is looked up like any other (torch returns ``weight[padding_idx]`` too).

    Example::

        m = Embedding.from_float(torch.nn.Embedding(100, 8), fmt="ap_fixed<16,6>")
        y = m(torch.tensor([[1, 2], [3, 4]]))      # 2 x 2 x 8
    """

    def __init__(self, kernel: Kernel, *, device: str | Device | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(kernel, device, dtype)
        self.embedding_dim = kernel.spec.tables[0].dim
        self.num_embeddings = kernel.spec.tables[0].num_rows

    @classmethod
    def from_float(cls, emb: torch.nn.Embedding, fmt: str = "ap_fixed<16,6>", *, out_type: Optional[str] = None,
                   device: str | Device | None = None, dtype: torch.dtype = torch.float32, name: str = "embedding") -> "Embedding":
        """Quantize ``emb``'s table to ``fmt`` and make it resident."""
        if not isinstance(emb, torch.nn.Embedding):
            raise TypeError(f"emb: expected torch.nn.Embedding, got {type(emb).__name__}")
        if emb.max_norm is not None:
            raise InputError("emb: max_norm renormalises rows at lookup time; not supported on the offload kernel")
        ts = _table_spec(name, emb.weight, fmt, None)
        kernel = _make_kernel(name, [ts], [emb.weight], mode="sum", max_bag_size=1, out_type=out_type)
        return cls(kernel, device=device, dtype=dtype)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_dtypes(input, None, None)
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

    Example::

        tbe = TableBatchedEmbeddingBags.from_float([bag_a, bag_b], fmt="ap_fixed<16,6>")
        y = tbe(idx, off)
    """

    def __init__(self, kernel: Kernel, *, device: str | Device | None = None, dtype: torch.dtype = torch.float32,
                 bounds_check: str = "fatal") -> None:
        super().__init__(kernel, device, dtype)
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
        from offload.nn.fbgemm import from_fbgemm

        return from_fbgemm(cls, tbe, fmt, **kw)

    @classmethod
    def from_rowwise(cls, packed: Sequence[torch.Tensor], layout: str = "fp32_end", **kw) -> "TableBatchedEmbeddingBags":
        """From pre-quantized int8 row-wise tables: ``layout="fp32_end"`` (torch's
        ``embedding_bag_byte_prepack``) or ``"fp16_front"`` (FBGEMM's IntNBit rows). See :mod:`offload.nn.fbgemm`."""
        from offload.nn.fbgemm import from_rowwise

        return from_rowwise(cls, packed, layout, **kw)

    @classmethod
    def from_float(
        cls,
        bags: Sequence[torch.nn.EmbeddingBag],
        fmt: str | Sequence[str] = "ap_fixed<16,6>",
        *,
        names: Optional[Sequence[str]] = None,
        max_bag_size: int = 256,
        acc_type: Optional[str] = None,
        out_type: Optional[str] = None,
        weight_type: str = DEFAULT_WEIGHT_TYPE,
        device: str | Device | None = None,
        dtype: torch.dtype = torch.float32,
        name: str = "tbe",
    ) -> "TableBatchedEmbeddingBags":
        """Quantize each bag's table (``fmt`` one for all or one per table) into one kernel."""
        bags = list(bags)
        if not bags or not all(isinstance(b, torch.nn.EmbeddingBag) for b in bags):
            raise TypeError("bags: expected a non-empty sequence of torch.nn.EmbeddingBag")
        for i, b in enumerate(bags):
            if b.max_norm is not None:
                raise InputError(f"bags[{i}]: max_norm renormalises rows at lookup time; not supported on the offload kernel")
        modes = {b.mode for b in bags}
        if len(modes) != 1:
            raise ValueError(f"bags: all tables of one kernel share a mode, got {sorted(modes)}")
        fmts = [fmt] * len(bags) if isinstance(fmt, str) else list(fmt)
        names = list(names) if names is not None else [f"t{i}" for i in range(len(bags))]
        if len(fmts) != len(bags) or len(names) != len(bags):
            raise ValueError(f"fmt/names: need one per table ({len(bags)})")
        tables = [_table_spec(n, b.weight, f, b.padding_idx) for n, b, f in zip(names, bags, fmts)]
        kernel = _make_kernel(name, tables, [b.weight for b in bags], mode=modes.pop(), max_bag_size=max_bag_size,
                              acc_type=acc_type, out_type=out_type, weight_type=weight_type)
        return cls(kernel, device=device, dtype=dtype)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        _check_dtypes(indices, offsets, per_sample_weights)
        if per_sample_weights is not None and self.mode == "max":  # FBGEMM weights sum and mean bags
            raise ValueError(f"per_sample_weights: only supported with mode 'sum' or 'mean', this kernel's mode is {self.mode!r}")
        if self.bounds_check != "fatal":
            from offload.nn.fbgemm import bounds_check

            indices, offsets = bounds_check(self.bounds_check, self._feature_rows, indices, offsets)
        return torch.ops.offload.embedding_lookup_tbe(self.rid, indices, offsets, per_sample_weights, self.dtype)

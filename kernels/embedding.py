"""Kernel kind ``embedding``: table-batched embedding lookups with bag pooling (FBGEMM TBE layout).

One kernel holds ``T`` tables. A call carries one ``indices`` vector and ``offsets`` of length
``T*B + 1`` (bag ``b`` of table ``t`` is ``indices[offsets[t*B+b] : offsets[t*B+b+1]]``) and
returns ``out`` of shape ``B x sum(dim_t)``: table ``t``'s pooled rows in columns
``col_t : col_t + dim_t``. A single ``torch.nn.EmbeddingBag`` is the ``T = 1`` case; a plain
``torch.nn.Embedding`` is ``sum`` with one index per bag and no padding skip.

Storage formats (per table, :class:`TableSpec.fmt`, parsed once into
:mod:`offload.kernels.table_format`'s objects):

- a :class:`FixedType` (text ``"ap_fixed<W,I,Q,O>"`` or ``ap_ufixed``): raw ``W``-bit integers,
  container int8/16/32/64.
- :class:`RowwiseInt8` (text ``"int8_rowwise"``): ``uint8`` codes plus, per row, raw
  ``(scale, bias)`` in ``param_type`` (an ap_fixed, chosen from the data by
  :func:`rowwise_param_type`); the kernel forms
  ``code * scale + bias`` exactly. Like FBGEMM's fused 8-bit row-wise, with fixed-point instead of
  fp16/fp32 scale and bias so the hardware needs no float units.

Arithmetic (accumulator, per-sample weights, mean division, overflow) is defined and simulated in
:mod:`offload.sim.embedding`: its step-by-step reference is this kind's :func:`reference`, its
fused compiled path runs in :func:`run_checked` where numba is present and the spec fits it.
Default accumulator: wide enough that no bag of up to
``max_bag_size`` entries can overflow it (see :func:`default_acc_type`).

Resident tensors: ``table{t}`` (raw, ``num_rows x dim``) and, for int8_rowwise, ``params{t}``
(``num_rows x 2`` raw scale, bias). Inputs: ``indices`` (int32/int64), ``offsets`` (int32/int64),
optional ``per_sample_weights`` (raw ints in ``weight_type``; the torch op quantizes float weights
with that type's own modes, by default round-half-even and saturate at +-128, lsb 2^-12). Output:
``out`` (raw ``out_type``, int64).

Example::

    spec = make_spec([TableSpec("user", 1000, 16, "ap_fixed<16,6>")], mode="sum", max_bag_size=32)
    kernel = make_kernel("emb0", spec, [np.random.randn(1000, 16)])
    out = get_kind("embedding").reference(spec, kernel.tensors, {"indices": idx, "offsets": off})
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field, replace
from typing import ClassVar, Mapping, Sequence

import numpy as np

from offload.kernels.registry import Kernel, KernelKind, register_kind
from offload.sim import embedding as _sim
from offload.sim.embedding import PooledTable, Pooling
from offload.sim.errors import (
    FormatOverflowError,
    FormatOverflowWarning,
    IndexDtypeError,
    IndexRangeError,
    InputError,
    InputTypeError,
    OffsetsError,
    UnsupportedError,
)
from offload.kernels.table_format import ROWWISE, RowwiseInt8, TableFormat, container_dtype, table_format
from offload.sim.fixed import FixedType

__all__ = [
    "ROWWISE",
    "RowwiseInt8",
    "table_format",
    "DEFAULT_WEIGHT_TYPE",
    "DEFAULT_MAX_BAG_SIZE",
    "longest_exact_bag",
    "ONCHIP_MEMORIES",
    "OnChip",
    "TableSpec",
    "EmbeddingSpec",
    "make_spec",
    "default_acc_type",
    "rowwise_param_type",
    "quantize_table",
    "quantize_checked",
    "OVERFLOW_POLICIES",
    "make_kernel",
    "hold_on_chip",
    "feature_tensors",
    "container_dtype",
    "validate",
    "reference",
    "Lookup",
    "lookup_of",
    "fused_plan",
    "run_checked",
    "bind_checked",
    "bind_native",
    "float32_of",
    "bag_counts",
    "combine_partials",
    "check_tensors",
    "tensor_shapes",
    "SPEC_SCHEMA",
    "KIND",
]

DEFAULT_WEIGHT_TYPE = FixedType.parse("ap_fixed<20,8,AP_RND_CONV,AP_SAT>")
# The longest bag the default accumulator is sized for: 65535 = 2^16 - 1. Real traffic: TorchRec
# and FBGEMM pooling factors run from 1 (one-hot ids) to a few hundred on average, with
# user-history tails in the thousands; 2^16 - 1 covers those tails 10x over. It is the longest bag
# whose 16-bit raw values (ap_fixed<16,6>, the default format) provably sum in an int32 partial
# sum (65535 * 2^15 < 2^31), which the fused CPU path uses for unweighted bags. Cost: 16 integer
# bits on the accumulator, so ap_fixed<16,6> with the default weight_type accumulates weighted sums
# in ap_fixed<52,30>, every product bit kept (the 62-bit limit leaves room up to 2^26). A bag
# longer than the declared bound is still pooled with the same per-step acc_t arithmetic (no
# run-time refusal): exact while its running sum stays inside acc_t's range (real data sits far
# inside the worst case the bound is proved for), saturating (AP_SAT) where it would leave it.
DEFAULT_MAX_BAG_SIZE = (1 << 16) - 1
_INDEX_DTYPES = (np.int32, np.int64)
# acc_t must keep 2*|raw| inside int64 for the mean's rounded division (sim and C++ alike).
_MAX_ACC_WIDTH = 62
# Exact products e*w are formed in int64 (sim) and int64 (C++ raw container).
_MAX_PRODUCT_WIDTH = 63


# On-chip memories a table can be held in (the HLS generator's ``bind_storage impl``).
ONCHIP_MEMORIES = ("bram", "uram")


@dataclass(frozen=True)
class OnChip:
    """A table held inside the kernel rather than behind a memory port: ``memory`` (``"bram"`` or
    ``"uram"``) and the table's raw contents, which the HLS generator compiles into the kernel as
    constants (as hls4ml does with weights), so the spec, and with it the kernel's name, carries
    them. ``table``: the raw codes, row-major (``num_rows * dim``); ``params``: a row-wise table's
    raw ``(scale, bias)`` pairs, row-major (``2 * num_rows``), empty otherwise.

    Example: ``OnChip("bram", (1, 2, 3, 4))`` holds a 2 x 2 table in block RAM.
    """

    memory: str
    table: tuple[int, ...]
    params: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.memory not in ONCHIP_MEMORIES:
            raise InputError(f"onchip.memory: must be one of {list(ONCHIP_MEMORIES)}, got {self.memory!r}")
        for name in ("table", "params"):
            v = getattr(self, name)
            object.__setattr__(self, name, tuple(int(x) for x in (v.ravel().tolist() if isinstance(v, np.ndarray) else v)))

    @classmethod
    def of(cls, memory: str, tensors: Mapping[str, np.ndarray]) -> "OnChip":
        """From a table's resident arrays (``{"table": ..., "params": ...}``, as :func:`quantize_table` gives)."""
        return cls(memory, np.asarray(tensors["table"]), np.asarray(tensors["params"]) if "params" in tensors else ())

    def to_json(self) -> dict:
        return {"memory": self.memory, "table": list(self.table), "params": list(self.params)}


@dataclass(frozen=True)
class TableSpec:
    """One table: name, shape, storage format, optional padding row and m_axi bundle, or on chip.

    ``fmt`` is a :data:`~offload.kernels.table_format.TableFormat`: given as text
    (``"ap_fixed<16,6>"``, or ``"int8_rowwise"`` with ``param_type``) or as the object, it is
    held parsed; ``param_type`` is the row-wise scale/bias type (a :class:`FixedType`, None for a
    plain table). ``padding_idx`` entries are skipped when pooling (torch.nn.EmbeddingBag
    semantics). ``bundle`` groups tables on one memory port (default: a port per table, ``gmem{t}``).
    ``onchip`` (an :class:`OnChip`, or its JSON) holds the table in the kernel's URAM/BRAM instead,
    its contents compiled in; build it with :func:`hold_on_chip`.

    Example: ``TableSpec("user", 1000, 16, "ap_fixed<16,6>").value_type()`` is ``ap_fixed<16,6>``.
    """

    name: str
    num_rows: int
    dim: int
    fmt: TableFormat
    param_type: FixedType | None = None
    padding_idx: int | None = None
    bundle: str | None = None
    onchip: OnChip | None = None

    def __post_init__(self) -> None:
        # Text from JSON and callers is parsed here, once; a replace(param_type=...) of a row-wise
        # table gives it the new scale/bias type.
        fmt = table_format(self.fmt, self.param_type, what=f"table {self.name!r}")
        object.__setattr__(self, "fmt", fmt)
        if isinstance(fmt, RowwiseInt8):
            object.__setattr__(self, "param_type", fmt.param_type)
        elif self.param_type is not None:
            object.__setattr__(self, "param_type", FixedType.parse(self.param_type))
        if isinstance(self.onchip, Mapping):
            object.__setattr__(self, "onchip", OnChip(**self.onchip))
        if self.onchip is not None:
            # A replace(num_rows=...) of an on-chip table (a shard of it) must give it its own contents.
            want = (int(self.num_rows) * int(self.dim), 2 * int(self.num_rows) if isinstance(fmt, RowwiseInt8) else 0)
            got = (len(self.onchip.table), len(self.onchip.params))
            if got != want:
                raise InputError(f"table {self.name!r}: onchip holds {got[0]} codes and {got[1]} params, "
                                 f"a {self.num_rows} x {self.dim} {fmt} table has {want[0]} and {want[1]}")

    @property
    def rowwise(self) -> bool:
        return isinstance(self.fmt, RowwiseInt8)

    def value_type(self) -> FixedType:
        """Exact type of one element as the kernel reads it."""
        return self.fmt.value_type if self.rowwise else self.fmt

    def storage_dtype(self) -> np.dtype:
        return self.fmt.storage_dtype if self.rowwise else container_dtype(self.fmt)

    def bytes(self) -> int:
        """Resident bytes (table plus row-wise params)."""
        n = self.num_rows * self.dim * self.storage_dtype().itemsize
        if self.rowwise:
            n += self.num_rows * 2 * self.fmt.params_dtype.itemsize
        return n

    def to_json(self) -> dict:
        """The table as JSON: the formats as their ap_types text (``fmt`` ``"int8_rowwise"``)."""
        return {"name": self.name, "num_rows": self.num_rows, "dim": self.dim, "fmt": str(self.fmt),
                "param_type": None if self.param_type is None else str(self.param_type),
                "padding_idx": self.padding_idx, "bundle": self.bundle,
                # Only when set, so the JSON (and the HLS digest) of every off-chip table is unchanged.
                **({} if self.onchip is None else {"onchip": self.onchip.to_json()})}


@dataclass(frozen=True)
class EmbeddingSpec:
    """A table-batched embedding kernel. Build with :func:`make_spec` (fills the default types)."""

    kind: ClassVar[str] = "embedding"
    tables: tuple[TableSpec, ...]
    mode: str
    max_bag_size: int
    acc_type: FixedType
    out_type: FixedType
    weight_type: FixedType = DEFAULT_WEIGHT_TYPE
    # FBGEMM's feature_table_map: feature f looks up table feature_table_map[f]. A shared table is
    # stored (and uploaded) once; calls then carry F*B+1 offsets and return B x sum(dim of each
    # feature's table). None: one feature per table, in order.
    feature_table_map: tuple[int, ...] | None = None
    # Partial output (row-wise shards): ``out`` is the raw accumulator before the mean's division
    # and the output cast, and ``count`` (B x F) each bag's non-padding entries, so shards of one
    # table combine exactly and round once (:func:`combine_partials`).
    partial: bool = False
    # Derived views (per_feature, the fused plan, rows): not an argument, so replace() starts empty.
    _cache: dict = field(default_factory=dict, init=False, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        # JSON and callers give the types as strings; the spec keeps them parsed, once.
        for name in ("acc_type", "out_type", "weight_type"):
            object.__setattr__(self, name, FixedType.parse(getattr(self, name)))
        if self.feature_table_map is not None:
            object.__setattr__(self, "feature_table_map", tuple(int(t) for t in self.feature_table_map))

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def total_dim(self) -> int:
        return sum(t.dim for t in self.tables)

    @property
    def num_features(self) -> int:
        """Bag groups per call (``F`` in ``F*B+1`` offsets): the tables, or the mapped features."""
        return self.num_tables if self.feature_table_map is None else len(self.feature_table_map)

    @property
    def out_dim(self) -> int:
        """Columns of a call's result: each feature's table dim, in feature order."""
        if self.feature_table_map is None:
            return self.total_dim
        return sum(self.tables[t].dim for t in self.feature_table_map)

    def per_feature(self) -> "EmbeddingSpec":
        """The same kernel seen one table per feature (shared tables repeated under feature names),
        which is what a call computes (its checks and golden cases take this view); cached."""
        if self.feature_table_map is None:
            return self
        c = self._cache.get("per_feature")
        if c is None:
            tables = tuple(replace(self.tables[t], name=f"{self.tables[t].name}/f{f}") for f, t in enumerate(self.feature_table_map))
            c = self._cache["per_feature"] = replace(self, tables=tables, feature_table_map=None)
        return c

    def col_offsets(self) -> list[int]:
        return list(np.cumsum([0] + [t.dim for t in self.tables])[:-1].tolist())

    @property
    def value_types(self) -> tuple[FixedType, ...]:
        """Each table's element type as the kernel reads it (cached)."""
        c = self._cache.get("values")
        if c is None:
            c = self._cache["values"] = tuple(t.value_type() for t in self.tables)
        return c

    def digest(self) -> str:
        """SHA-256 (hex) of the spec's canonical JSON, computed once: an on-chip table's contents
        are part of that JSON, and generated kernel names are derived from it.

        Example::

            name = f"offload_embedding_{spec.digest()[:10]}"
        """
        d = self._cache.get("digest")
        if d is None:
            d = self._cache["digest"] = hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()
        return d

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "tables": [t.to_json() for t in self.tables],
            "mode": self.mode,
            "max_bag_size": self.max_bag_size,
            "acc_type": str(self.acc_type),
            "out_type": str(self.out_type),
            "weight_type": str(self.weight_type),
            # Only when set, so the JSON (and the HLS digest) of every other kernel is unchanged.
            **({} if self.feature_table_map is None else {"feature_table_map": list(self.feature_table_map)}),
            **({"partial": True} if self.partial else {}),
        }

    @staticmethod
    def from_json(d: dict) -> "EmbeddingSpec":
        d = dict(d)
        d.pop("kind", None)
        tables = tuple(TableSpec(**t) for t in d.pop("tables"))
        spec = EmbeddingSpec(tables=tables, **d)
        _check_spec(spec)
        return spec


# The JSON Schema of EmbeddingSpec.to_json() (KernelKind.spec_schema). Ranges: the generated C++
# (offload.hls.embedding) declares dim, col, total_dim and max_bag as ``int`` and rows as int64_t;
# rows are bounded like a bundle manifest's dimensions (2^44). A memory-port bundle name is written
# into an HLS pragma, so it is a C identifier. At most 1,024 tables: a bundle's kernel holds at most
# 1,024 tensors.
_INT_MAX = (1 << 31) - 1
_MAX_ROWS = 1 << 44
_MAX_TABLES = 1024
_TYPE_TEXT = {"type": "string", "maxLength": 128, "pattern": r"^ap_u?(fixed|int)<[0-9A-Z_, +-]+>\Z"}
SPEC_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["tables", "mode", "max_bag_size", "acc_type", "out_type"],
    "properties": {
        "kind": {"const": "embedding"},
        "tables": {
            "type": "array",
            "minItems": 1,
            "maxItems": _MAX_TABLES,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "num_rows", "dim", "fmt"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 256},
                    "num_rows": {"type": "integer", "minimum": 1, "maximum": _MAX_ROWS},
                    "dim": {"type": "integer", "minimum": 1, "maximum": _INT_MAX},
                    "fmt": {"anyOf": [{"const": ROWWISE}, _TYPE_TEXT]},
                    "param_type": {"anyOf": [{"type": "null"}, _TYPE_TEXT]},
                    "padding_idx": {"type": ["integer", "null"], "minimum": 0, "maximum": _MAX_ROWS - 1},
                    "bundle": {"type": ["string", "null"], "pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z"},
                    "onchip": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["memory", "table"],
                        "properties": {
                            "memory": {"enum": list(ONCHIP_MEMORIES)},
                            "table": {"type": "array", "int64Items": True},
                            "params": {"type": "array", "int64Items": True},
                        },
                    },
                },
            },
        },
        "mode": {"enum": list(_sim.MODES)},
        "max_bag_size": {"type": "integer", "minimum": 1, "maximum": _INT_MAX},
        "acc_type": _TYPE_TEXT,
        "out_type": _TYPE_TEXT,
        "weight_type": _TYPE_TEXT,
        "feature_table_map": {"type": "array", "minItems": 1, "maxItems": _INT_MAX,
                              "items": {"type": "integer", "minimum": 0, "maximum": _MAX_TABLES - 1}},
        "partial": {"type": "boolean"},
    },
}


def _log2_ceil(n: int) -> int:
    return max(0, int(n - 1).bit_length())


def _signed_int_bits(t: FixedType) -> int:
    i = int(t.integer)
    return i if t.signed else i + 1


def _acc_base(tables: Sequence[TableSpec], mode: str, weight_type: FixedType) -> tuple[int, int, bool]:
    """The default accumulator's integer bits before the bag length's ``log2`` term, the values'
    fraction bits it always keeps, and whether the bag length adds integer bits (sum, mean)."""
    vts = [t.value_type() for t in tables]
    iv = max(_signed_int_bits(v) for v in vts)
    fv = max(int(v.F) for v in vts)
    if mode == "sum":
        return iv + _signed_int_bits(weight_type), fv, True
    return iv, fv, mode == "mean"


def default_acc_type(tables: Sequence[TableSpec], mode: str, max_bag_size: int,
                     weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE) -> FixedType:
    """The default accumulator: no bag of up to ``max_bag_size`` entries can overflow it.

    Values ``|e| <= 2^(Iv-1)`` and weights ``|w| <= 2^(Iw-1)`` give terms ``|e*w| <= 2^(Iv+Iw-2)``;
    ``n <= 2^L`` of them (``L = ceil(log2 max_bag_size)``) sum to at most ``2^(Iv+Iw+L-2)``, inside
    ``ap_fixed<., Iv+Iw+L>``'s range with a factor 2 to spare (which also absorbs the product's
    rounding). Frac bits keep products exact (``Fv + Fw``) unless that would pass 62 bits, then as
    many as fit, never fewer than the values' own (so unweighted sums stay exact).
    """
    weight_type = FixedType.parse(weight_type)
    ia0, fv, grows = _acc_base(tables, mode, weight_type)
    ia = ia0 + _log2_ceil(max_bag_size) if grows else ia0
    fa = fv + int(weight_type.F) if mode == "sum" else fv
    if ia + fa > _MAX_ACC_WIDTH:
        fa = max(fv, _MAX_ACC_WIDTH - ia)
    if ia + fa > _MAX_ACC_WIDTH:
        raise ValueError(
            f"acc_type: the default accumulator would need {ia + fa} bits (> {_MAX_ACC_WIDTH}); "
            "pass a narrower acc_type explicitly (its overflow mode then applies)"
        )
    return FixedType(ia + fa, ia, rounding="AP_RND_CONV", overflow="AP_SAT")


def longest_exact_bag(tables: Sequence[TableSpec], mode: str, weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE) -> int:
    """The longest declared bag, at most :data:`DEFAULT_MAX_BAG_SIZE`, whose default accumulator
    (:func:`default_acc_type`) fits in 62 bits with the values' fraction bits kept.

    Tables whose values carry many fraction bits (FBGEMM's row-wise tables hold their fp32 scale and
    bias exactly) cannot take :data:`DEFAULT_MAX_BAG_SIZE`; they get the longest bag that still
    sums exactly instead of a conversion error.
    """
    ia0, fv, grows = _acc_base(tables, mode, FixedType.parse(weight_type))
    room = _MAX_ACC_WIDTH - ia0 - fv  # integer bits left for the bag length's log2 term
    if not grows or room >= _log2_ceil(DEFAULT_MAX_BAG_SIZE):
        return DEFAULT_MAX_BAG_SIZE
    return max(1, 1 << max(room, 0))


def make_spec(
    tables: Sequence[TableSpec],
    *,
    mode: str = "sum",
    max_bag_size: int = DEFAULT_MAX_BAG_SIZE,
    acc_type: FixedType | str | None = None,
    out_type: FixedType | str | None = None,
    weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE,
    feature_table_map: Sequence[int] | None = None,
) -> EmbeddingSpec:
    """Build and check a spec; ``acc_type`` defaults to :func:`default_acc_type`, ``out_type`` to it
    (types as :class:`FixedType` or their text)."""
    if mode not in _sim.MODES:
        raise ValueError(f"mode: must be one of {_sim.MODES}, got {mode!r}")
    tables = tuple(replace(t, num_rows=int(t.num_rows), dim=int(t.dim)) for t in tables)
    # EmbeddingSpec parses the types given as text.
    acc = acc_type or default_acc_type(tables, mode, max_bag_size, weight_type)
    out = out_type or acc
    ftm = None if feature_table_map is None else tuple(feature_table_map)
    spec = EmbeddingSpec(tables, mode, int(max_bag_size), acc, out, weight_type, ftm)
    _check_spec(spec)
    return spec


def _check_spec(spec: EmbeddingSpec) -> None:
    if spec.mode not in _sim.MODES:
        raise ValueError(f"mode: must be one of {_sim.MODES}, got {spec.mode!r}")
    if not spec.tables:
        raise ValueError("tables: at least one table is needed")
    if spec.max_bag_size < 1:
        raise ValueError(f"max_bag_size: must be >= 1, got {spec.max_bag_size}")
    names = [t.name for t in spec.tables]
    if len(set(names)) != len(names):
        raise ValueError(f"tables: duplicate names {names}")
    ftm = spec.feature_table_map
    if ftm is not None:
        if not ftm:
            raise ValueError("feature_table_map: at least one feature is needed")
        bad = [t for t in ftm if not 0 <= t < spec.num_tables]
        if bad:
            raise ValueError(f"feature_table_map: table {bad[0]} outside [0, {spec.num_tables})")
    acc, out, wt = spec.acc_type, spec.out_type, spec.weight_type
    if int(acc.width) > _MAX_ACC_WIDTH:
        raise ValueError(f"acc_type: {acc} is wider than {_MAX_ACC_WIDTH} bits")
    if int(out.width) > 64:
        raise ValueError(f"out_type: {out} is wider than 64 bits")
    for t in spec.tables:
        if t.num_rows < 1 or t.dim < 1:
            raise ValueError(f"table {t.name!r}: num_rows and dim must be >= 1, got {t.num_rows} x {t.dim}")
        if t.padding_idx is not None and not (0 <= t.padding_idx < t.num_rows):
            raise ValueError(f"table {t.name!r}: padding_idx {t.padding_idx} outside [0, {t.num_rows})")
        vt = t.value_type()
        if int(vt.width) + int(wt.width) > _MAX_PRODUCT_WIDTH:
            raise ValueError(
                f"table {t.name!r}: value type {vt} times weight_type {wt} is {int(vt.width) + int(wt.width)} bits "
                f"(limit {_MAX_PRODUCT_WIDTH}); use a narrower format or weight_type"
            )


# ---------------------------------------------------------------------------------- quantization


def rowwise_param_type(weights: np.ndarray, width: int = 24) -> FixedType:
    """An ap_fixed for the per-row scale and bias of ``weights``: ``width`` bits, integer bits
    just enough for ``max(|row min|, row range / 255)`` (so the frac bits carry the precision)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        m = 1.0
    else:
        mn, mx = w.min(axis=1), w.max(axis=1)
        m = float(max(np.abs(mn).max(), ((mx - mn) / 255.0).max(), 2.0 ** -(width - 2)))
    ip = max(1, int(np.floor(np.log2(m))) + 2)
    return FixedType(width, ip, rounding="AP_RND_CONV", overflow="AP_SAT")


def _quantize_rowwise(weights: np.ndarray, param_type: FixedType) -> tuple[np.ndarray, np.ndarray]:
    """uint8 codes and raw (scale, bias): ``bias = floor(min)``, ``scale = ceil((max-bias)/255)`` in
    ``param_type``'s lsb, so every element lies in ``[bias, bias + 255*scale]`` and its code error
    is at most ``scale/2``."""
    w = np.asarray(weights, dtype=np.float64)
    f = int(param_type.F)
    lo, hi = param_type.min_raw, param_type.max_raw
    mn = w.min(axis=1) if w.shape[1] else np.zeros(w.shape[0])
    mx = w.max(axis=1) if w.shape[1] else np.zeros(w.shape[0])
    bias = np.floor(np.ldexp(mn, f)).astype(np.int64)
    scale = np.ceil((np.ldexp(mx, f) - bias) / 255.0).astype(np.int64)
    scale = np.maximum(scale, 1)
    if bias.min(initial=0) < lo or scale.max(initial=0) > hi or bias.max(initial=0) > hi:
        raise ValueError(f"param_type {param_type}: too narrow for these rows' scale/bias")
    codes = np.rint((np.ldexp(w, f) - bias[:, None]) / scale[:, None])
    codes = np.clip(codes, 0, 255).astype(np.uint8)
    return codes, np.stack([scale, bias], axis=1)


OVERFLOW_POLICIES = ("warn", "raise", "saturate")


def quantize_checked(t: FixedType, x: np.ndarray, field: str, on_overflow: str | None) -> np.ndarray:
    """Raw ``t`` values of floats ``x`` with ``t``'s rounding; values ``t`` cannot hold (their
    rounded value falls outside ``t``'s range) are handled by ``on_overflow``: ``"warn"`` saturates
    them and warns (:class:`FormatOverflowWarning` with the count and the worst value),
    ``"raise"`` refuses (:class:`FormatOverflowError`), ``"saturate"`` saturates silently, None
    applies ``t``'s own overflow mode (``AP_WRAP`` wraps: what a C++ cast does)."""
    x = np.asarray(x, dtype=np.float64)
    if on_overflow is None:
        return np.asarray(t.quantize(x))
    if on_overflow not in OVERFLOW_POLICIES:
        raise InputError(f"on_overflow: must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")
    extra = min(16, 64 - int(t.width))
    if extra > 0 and not t.is_int:
        # The same F and rounding with 16 more integer bits, saturating: where its raw value leaves
        # t's raw range, t cannot hold the rounded value (a value just past the top that rounds
        # back down is held).
        wide = FixedType(int(t.width) + extra, int(t.integer) + extra, signed=t.signed, rounding=t.rounding, overflow="AP_SAT")
        raw = np.asarray(wide.quantize(x), dtype=np.int64)
        bad = (raw < t.min_raw) | (raw > t.max_raw)
    else:
        raw = None
        bad = (x < t.min_float) | (x > t.max_float)
    if bad.any():
        vals = x[bad]
        worst = float(vals[np.argmax(np.abs(vals))])
        msg = (f"{field}: {int(bad.sum())} of {x.size} values outside {t}'s range [{t.min_float}, {t.max_float}], "
               f"worst {worst!r}")
        if on_overflow == "raise":
            raise FormatOverflowError(msg + " (on_overflow='raise')")
        if on_overflow == "warn":
            warnings.warn(FormatOverflowWarning(msg + "; saturated (on_overflow='saturate' silences this, 'raise' refuses)"),
                          stacklevel=3)
    if raw is None:
        return np.asarray(t.quantize(np.clip(x, t.min_float, t.max_float)))
    return np.clip(raw, t.min_raw, t.max_raw).astype(t.raw_dtype)


def quantize_table(table: TableSpec, weights: np.ndarray, on_overflow: str | None = None) -> dict[str, np.ndarray]:
    """Float rows -> the resident raw arrays of one table (``{"table": ..., "params": ...}``);
    ``on_overflow`` as in :func:`quantize_checked` (row-wise tables fit their params to the data)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (table.num_rows, table.dim):
        raise ValueError(f"table {table.name!r}: weights shape {w.shape} != {(table.num_rows, table.dim)}")
    if table.rowwise:
        codes, params = _quantize_rowwise(w, table.param_type)
        return {"table": codes, "params": params.astype(table.fmt.params_dtype)}
    t = table.fmt
    return {"table": quantize_checked(t, w, f"table {table.name!r}", on_overflow).astype(container_dtype(t))}


def make_kernel(name: str, spec: EmbeddingSpec, weights: Sequence[np.ndarray], on_overflow: str | None = None) -> Kernel:
    """Quantize each table's float rows into a :class:`Kernel` of kind ``embedding``
    (``on_overflow``: see :func:`quantize_checked`; None keeps each format's own overflow mode)."""
    if len(weights) != spec.num_tables:
        raise ValueError(f"weights: {len(weights)} arrays for {spec.num_tables} tables")
    tensors: dict[str, np.ndarray] = {}
    for i, (t, w) in enumerate(zip(spec.tables, weights)):
        q = quantize_table(t, w, on_overflow)
        tensors[f"table{i}"] = q["table"]
        if "params" in q:
            tensors[f"params{i}"] = q["params"]
    return Kernel(name, spec, tensors)


def hold_on_chip(kernel: Kernel, memories: Mapping[str, str]) -> Kernel:
    """``kernel`` with the tables named in ``memories`` (table name -> ``"bram"`` or ``"uram"``)
    held on chip: each one's resident arrays become its :class:`OnChip` contents, which the HLS
    kernel compiles in (no memory port). The tensors stay, so every device computes as before.

    Example: ``hold_on_chip(make_kernel("k", spec, weights), {"country": "bram"})``
    """
    spec = kernel.spec
    unknown = sorted(set(memories) - {t.name for t in spec.tables})
    if unknown:
        raise InputError(f"memories: no table named {unknown} in kernel {kernel.name!r}; its tables are {[t.name for t in spec.tables]}")
    tables = []
    for t, ts in enumerate(spec.tables):
        mem = memories.get(ts.name)
        if mem is not None:
            own = {"table": kernel.tensors[f"table{t}"], **({"params": kernel.tensors[f"params{t}"]} if ts.rowwise else {})}
            ts = replace(ts, onchip=OnChip.of(mem, own), bundle=None)
        tables.append(ts)
    new = replace(spec, tables=tuple(tables))
    check_tensors(new, kernel.tensors)
    return Kernel(kernel.name, new, dict(kernel.tensors))


def feature_tensors(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The resident tensors as :meth:`EmbeddingSpec.per_feature` names them: views of the shared
    tables, never copies."""
    if spec.feature_table_map is None:
        return dict(tensors)
    out = {}
    for f, t in enumerate(spec.feature_table_map):
        out[f"table{f}"] = tensors[f"table{t}"]
        if f"params{t}" in tensors:
            out[f"params{f}"] = tensors[f"params{t}"]
    return out


# ------------------------------------------------------------------------------------ validation


def _int_array(inputs: Mapping[str, np.ndarray], key: str, allowed=_INDEX_DTYPES) -> np.ndarray:
    a = inputs[key]
    if not isinstance(a, np.ndarray):
        raise IndexDtypeError(f"{key}: expected a NumPy array, got {type(a).__name__}")
    if a.dtype.type not in allowed:
        names = ", ".join(np.dtype(d).name for d in allowed)
        raise IndexDtypeError(f"{key}: dtype must be one of {names}, got {a.dtype}")
    if a.ndim != 1:
        raise OffsetsError(f"{key}: must be 1-D, got shape {a.shape}")
    return a


def _inputs_ok(spec: EmbeddingSpec, idx: np.ndarray, off: np.ndarray) -> bool:
    """The offsets and index rules in one compiled pass (a call's dozen NumPy reductions cost ~10 us
    at batch 1); False where numba is missing or a rule breaks, and :func:`validate` then finds
    the fault and names it."""
    fused = _fused()
    if not (fused.available() and idx.dtype.isnative and off.dtype.isnative):  # numba types native order only
        return False
    rows = spec._cache.get("rows")
    if rows is None:
        rows = spec._cache["rows"] = np.array([t.num_rows for t in spec.tables], dtype=np.int64)
    # int64 offsets, as the fused run takes them: the variants warm_up compiled, none mid-request.
    return bool(fused.inputs_ok(idx, off.astype(np.int64, copy=False), rows, (off.shape[0] - 1) // spec.num_tables))


def validate(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> None:
    """Check one call's inputs; raises before any device work and changes nothing.

    Every error is an :class:`~offload.sim.errors.OffloadError` and also the builtin torch's
    ``embedding_bag`` raises for the same input: :class:`IndexDtypeError` (TypeError and
    RuntimeError) for dtypes; :class:`OffsetsError` (ValueError and RuntimeError) for offsets
    (start 0, non-decreasing, end at ``len(indices)``, length ``T*B+1``); :class:`IndexRangeError`
    (IndexError and RuntimeError) for an index outside its table; :class:`UnsupportedError`
    (NotImplementedError) for weights in mode ``max``; :class:`InputError` for mis-sized or
    out-of-range ``per_sample_weights``. Bag length is not limited here: ``max_bag_size`` sizes the
    default accumulator, and a longer bag pools with the same per-step ``acc_t`` arithmetic.
    With a ``feature_table_map`` the offsets count features (``F*B+1``).
    """
    if spec.feature_table_map is not None:
        return validate(spec.per_feature(), feature_tensors(spec, tensors), inputs)
    for key in ("indices", "offsets"):
        if key not in inputs:
            raise InputError(f"inputs: missing {key!r}")
    idx = _int_array(inputs, "indices")
    off = _int_array(inputs, "offsets")
    n = idx.shape[0]
    T = spec.num_tables
    if off.shape[0] < 1 or (off.shape[0] - 1) % T:
        raise OffsetsError(f"offsets: length must be T*B+1 with T={T} tables, got {off.shape[0]}")
    w = inputs.get("per_sample_weights")
    if w is None and _inputs_ok(spec, idx, off):
        return
    if off[0] != 0:
        raise OffsetsError(f"offsets: must start at 0, got {int(off[0])}")
    if off.size and int(off.max()) > n:
        p = int(np.argmax(off > n))
        raise OffsetsError(f"offsets: offsets[{p}]={int(off[p])} runs past the indices (len(indices)={n})")
    lens = np.diff(off.astype(np.int64, copy=False))
    if lens.size and lens.min() < 0:
        p = int(np.argmax(lens < 0))
        raise OffsetsError(f"offsets: must not decrease, offsets[{p + 1}]={int(off[p + 1])} < offsets[{p}]={int(off[p])}")
    if int(off[-1]) != n:
        raise OffsetsError(f"offsets: must end at len(indices)={n}, got {int(off[-1])}")
    if w is not None:
        # FBGEMM's TBE weights mean bags too (sum of w*row over the bag's length); max has no weights.
        # torch.nn.EmbeddingBag refuses weighted mean: offload.nn.EmbeddingBag checks that itself.
        if spec.mode == "max":
            raise UnsupportedError(f"per_sample_weights: only supported in modes 'sum' and 'mean', this kernel's mode is {spec.mode!r}")
        if not isinstance(w, np.ndarray) or w.dtype.kind not in "iu":
            raise InputTypeError(f"per_sample_weights: expected raw integers in {spec.weight_type}, got {getattr(w, 'dtype', type(w).__name__)}")
        if w.shape != (n,):
            raise InputError(f"per_sample_weights: shape {w.shape} must match indices ({n},)")
        lo, hi = spec.weight_type.min_raw, spec.weight_type.max_raw
        if w.size and (w.min() < lo or w.max() > hi):
            raise InputError(f"per_sample_weights: raw values outside {spec.weight_type}'s range [{lo}, {hi}]")
    B = (off.shape[0] - 1) // T
    for t, ts in enumerate(spec.tables):
        a, b = int(off[t * B]), int(off[(t + 1) * B])
        seg = idx[a:b]
        if seg.size and (seg.min() < 0 or seg.max() >= ts.num_rows):
            p = int(np.flatnonzero((seg < 0) | (seg >= ts.num_rows))[0])
            raise IndexRangeError(
                f"indices[{a + p}] = {int(seg[p])} is out of range for table {ts.name!r} with {ts.num_rows} rows"
            )


def check_tensors(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray]) -> None:
    """Refuse resident tensors that do not fit ``spec`` (checked once, when a device loads them).

    Every table ``table{t}`` must be ``num_rows x dim`` in its storage dtype with raw values inside
    its format's range; row-wise tables need ``params{t}`` (``num_rows x 2`` raw scale, bias in
    ``param_type``, scale >= 1). Unknown tensor names are refused too, so a typo cannot hide a table.
    """
    expected = set()
    for t, ts in enumerate(spec.tables):
        key = f"table{t}"
        expected.add(key)
        a = tensors.get(key)
        if a is None:
            raise ValueError(f"tensors: missing {key!r} for table {ts.name!r}")
        if not isinstance(a, np.ndarray) or a.dtype != ts.storage_dtype():
            raise TypeError(f"tensors[{key!r}]: table {ts.name!r} is stored as {ts.storage_dtype()}, got {getattr(a, 'dtype', type(a).__name__)}")
        if a.shape != (ts.num_rows, ts.dim):
            raise ValueError(f"tensors[{key!r}]: table {ts.name!r} must be {ts.num_rows} x {ts.dim}, got shape {a.shape}")
        if ts.rowwise:
            pkey = f"params{t}"
            expected.add(pkey)
            pt, pdt = ts.param_type, ts.fmt.params_dtype
            p = tensors.get(pkey)
            if p is None:
                raise ValueError(f"tensors: missing {pkey!r} (row-wise scale and bias) for table {ts.name!r}")
            if not isinstance(p, np.ndarray) or p.dtype != pdt or p.shape != (ts.num_rows, 2):
                raise TypeError(f"tensors[{pkey!r}]: expected {ts.num_rows} x 2 {pdt}, got {getattr(p, 'dtype', '?')} {getattr(p, 'shape', '')}")
            if p.size and (p.min() < pt.min_raw or p.max() > pt.max_raw or p[:, 0].min() < 1):
                raise ValueError(f"tensors[{pkey!r}]: raw scale/bias outside {pt} (range [{pt.min_raw}, {pt.max_raw}], scale >= 1)")
        else:
            ft = ts.fmt
            if a.size and (a.min() < ft.min_raw or a.max() > ft.max_raw):
                raise ValueError(f"tensors[{key!r}]: raw values of table {ts.name!r} outside {ft}'s range [{ft.min_raw}, {ft.max_raw}]")
        if ts.onchip is not None:
            # The HLS kernel reads its compiled-in contents, every other device these tensors.
            held = {key: ts.onchip.table, **({f"params{t}": ts.onchip.params} if ts.rowwise else {})}
            for k, v in held.items():
                if np.asarray(tensors[k]).ravel().tolist() != list(v):
                    raise ValueError(f"tensors[{k!r}]: differs from table {ts.name!r}'s on-chip contents (compiled into the kernel)")
    extra = sorted(set(tensors) - expected)
    if extra:
        raise ValueError(f"tensors: unexpected {extra} for an embedding kernel of {spec.num_tables} table(s)")


def tensor_shapes(spec: EmbeddingSpec) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every resident tensor: ``table{t}`` and, for row-wise tables, ``params{t}``."""
    out: dict[str, tuple[int, ...]] = {}
    for t, ts in enumerate(spec.tables):
        out[f"table{t}"] = (ts.num_rows, ts.dim)
        if ts.rowwise:
            out[f"params{t}"] = (ts.num_rows, 2)
    return out


# ------------------------------------------------------------------------------------- reference


@dataclass(frozen=True)
class Lookup:
    """The spec as the simulator's arithmetic takes it: one pooled table per feature, and the
    resident tensors each reads (a shared table's, under its own name: no copy)."""

    pooling: Pooling
    tables: tuple[str, ...]
    params: tuple[str | None, ...]

    def arrays(self, tensors: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], Sequence[np.ndarray | None]]:
        """Each pooled table's resident array and its row-wise params (None for an ap_fixed table)."""
        # map() and the all-None tuple: a small call pays ~0.4 us less than two comprehensions.
        tables = list(map(tensors.__getitem__, self.tables))
        if not self.rowwise:
            return tables, self.params
        return tables, [None if k is None else tensors[k] for k in self.params]

    @property
    def rowwise(self) -> bool:
        return self.pooling.rowwise


def lookup_of(spec: EmbeddingSpec) -> Lookup:
    """The spec in the simulator's types (cached on the spec).

    Example::

        lk = lookup_of(spec)
        tables, params = lk.arrays(kernel.tensors)
        out = offload.sim.embedding.lookup(lk.pooling, tables, params, indices, offsets)
    """
    c = spec._cache.get("lookup")
    if c is None:
        feats = range(spec.num_tables) if spec.feature_table_map is None else spec.feature_table_map
        vts = spec.value_types
        pooled = tuple(PooledTable(spec.tables[t].dim, vts[t], spec.tables[t].rowwise, spec.tables[t].padding_idx) for t in feats)
        if spec.partial:  # the accumulator as it stands: no mean division, no output cast (acc_t to acc_t is exact)
            pooling = Pooling(pooled, "sum" if spec.mode == "mean" else spec.mode, spec.max_bag_size, spec.acc_type, spec.acc_type,
                              spec.weight_type)
        else:
            pooling = Pooling(pooled, spec.mode, spec.max_bag_size, spec.acc_type, spec.out_type, spec.weight_type)
        c = spec._cache["lookup"] = Lookup(pooling, tuple(f"table{t}" for t in feats),
                                            tuple(f"params{t}" if spec.tables[t].rowwise else None for t in feats))
    return c


def reference(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The exact kernel output ``{"out": raw out_type, int64, B x out_dim}`` (inputs validated):
    :func:`offload.sim.embedding.lookup`, step by step."""
    lk = lookup_of(spec)
    tables, params = lk.arrays(tensors)
    out = {"out": _sim.lookup(lk.pooling, tables, params, inputs["indices"], inputs["offsets"], inputs.get("per_sample_weights"))}
    if spec.partial:
        out["count"] = bag_counts(spec, inputs)
    return out


def golden_inputs(spec: EmbeddingSpec, rng: np.random.Generator, case: int) -> dict[str, np.ndarray]:
    """Golden case ``case``: case 0 is adversarial (empty, full and single-entry bags, first, last
    and padding rows, extreme weights), later cases random; index dtypes alternate int64/int32."""
    if spec.feature_table_map is not None:
        return golden_inputs(spec.per_feature(), rng, case)
    B = 3 + case
    lens_all, idx_all = [], []
    for ts in spec.tables:
        if case == 0:  # empty bag, full bag, single entry, then random
            lens = np.array([0, spec.max_bag_size, 1][:B] + [0] * max(0, B - 3))
        else:
            lens = rng.integers(0, spec.max_bag_size + 1, size=B)
        n = int(lens.sum())
        idx = rng.integers(0, ts.num_rows, size=n)
        if case == 0 and n:
            edge = [0, ts.num_rows - 1] + ([ts.padding_idx] if ts.padding_idx is not None else [])
            idx[: len(edge)] = edge[: n]
        lens_all.append(lens)
        idx_all.append(idx)
    dtype = np.int64 if case % 2 == 0 else np.int32
    lens = np.concatenate(lens_all)
    out = {
        "indices": np.concatenate(idx_all).astype(dtype),
        "offsets": np.concatenate([[0], np.cumsum(lens)]).astype(dtype),
    }
    if spec.mode == "sum" and case % 2 == 1:
        wt = spec.weight_type
        n = out["indices"].shape[0]
        w = rng.integers(wt.min_raw, wt.max_raw + 1, size=n, dtype=np.int64)
        w[: min(2, n)] = [wt.min_raw, wt.max_raw][: min(2, n)]
        out["per_sample_weights"] = w
    return out


# The fused path (offload.sim.embedding.fused) imports numba, 0.37 s measured with -X importtime:
# loaded on a device's first load, not by every `import offload.kernels` (`offload --help` among them).
_FUSED: list = []


def _fused():
    """The fused module, imported once (an import statement inside run_checked cost ~1 us per call)."""
    if not _FUSED:
        from offload.sim.embedding import fused

        _FUSED.append(fused)
    return _FUSED[0]


def fused_plan(spec: EmbeddingSpec):
    """The spec's :class:`offload.sim.embedding.fused.Plan` (cached on the spec); importing it loads numba."""
    p = spec._cache.get("fused_plan")
    if p is None:
        p = spec._cache["fused_plan"] = _fused().plan(lookup_of(spec).pooling)
    return p


def prepare(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """The fused path compiled (or loaded from numba's disk cache) for this spec, so no request pays
    the JIT. The tables are the device's aligned resident copies and are kept as they are."""
    tables, params = lookup_of(spec).arrays(tensors)
    return dict(tensors), _fused().warm_up(fused_plan(spec), tables, params)


def run_checked(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`validate` then :func:`reference` in one pass: the one place the path is chosen. The
    fused compiled path runs where numba is present and the spec fits its int64 casts; it checks
    the inputs inside its loops, before any table read they guard. Whatever it leaves (numba
    missing, a spec outside its casts, weighted ``mean``, a bag past ``max_bag_size``, any input
    that breaks a rule) takes :func:`validate`, which raises its own error, then the reference."""
    lk = lookup_of(spec)
    tables, params = lk.arrays(tensors)
    w = inputs.get("per_sample_weights")
    if spec.partial:
        # The partial pooling of a mean runs as a sum: check the inputs against the spec's own mode first.
        validate(spec, tensors, inputs)
        out = _fused().run(fused_plan(spec), tables, params, inputs["indices"], inputs["offsets"], w)
        if out is None:
            out = _sim.lookup(lk.pooling, tables, params, inputs["indices"], inputs["offsets"], w)
        return {"out": out, "count": bag_counts(spec, inputs)}
    out = _fused().run(fused_plan(spec), tables, params, inputs.get("indices"), inputs.get("offsets"), w)
    if out is None:
        validate(spec, tensors, inputs)
        out = _sim.lookup(lk.pooling, tables, params, inputs["indices"], inputs["offsets"], w)
    return {"out": out}


def float32_of(raw: np.ndarray, out_t: FixedType) -> np.ndarray:
    """Raw ``out_t`` values as float32: ``float32(raw) * 2^-F``, which is ``raw * 2^-F`` rounded once
    where ``0 <= F <= 126`` (a power of two scales exactly while results stay normal), else the
    same two steps with ``ldexp`` (2^-F is no normal float32 there). What the fused kernels write
    when asked for float32 (:func:`bind_checked`)."""
    y = raw.astype(np.float32)
    if 0 <= out_t.F <= 126:
        y *= np.float32(2.0 ** -out_t.F)
    else:
        np.ldexp(y, np.int32(-out_t.F), out=y)
    return y


def bind_checked(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray], *, fp32: bool = False):
    """:func:`run_checked`'s ``out`` as one prepared call ``(indices, offsets, per_sample_weights)
    -> out`` for these (from now on constant) resident tensors: the same checks, errors and path,
    with the spec's lookups done once. ``fp32``: ``out`` as float32, bit for bit
    :func:`float32_of` of the raw one, which the fused kernels write directly (no int64 array, no
    conversion pass) where the output type allows. None for a ``partial`` spec (its call returns
    the counts too: :func:`run_checked`).

    Example::

        lookup = bind_checked(spec, tensors, fp32=True)
        y = lookup(indices, offsets, None)        # float32 B x out_dim
    """
    if spec.partial:
        return None
    lk = lookup_of(spec)
    tables, params = lk.arrays(tensors)
    plan, run = fused_plan(spec), _fused().run
    direct = fp32 and plan.scale32 is not None
    out_t, pooling = spec.out_type, lk.pooling

    def lookup(indices: np.ndarray, offsets: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        out = run(plan, tables, params, indices, offsets, w, direct)
        if out is None:
            inputs = {"indices": indices, "offsets": offsets}
            if w is not None:
                inputs["per_sample_weights"] = w
            validate(spec, tensors, inputs)
            out = _sim.lookup(pooling, tables, params, indices, offsets, w)
        elif direct:
            return out
        return float32_of(out, out_t) if fp32 else out

    return lookup


def bind_native(spec: EmbeddingSpec, tensors: Mapping[str, np.ndarray]):
    """:func:`bind_checked`'s float32 call behind a C ABI: the fused kernels' entry for this
    one-table kernel (:func:`offload.sim.embedding.fused.native_entry`), or None where it has none
    (several tables, ``partial``, row-wise params, numba missing...). Answers only calls that pass
    every check; the caller runs :func:`bind_checked`'s call for the rest, which raises the errors.

    Example::

        entry = bind_native(spec, tensors)   # entry.address[np.dtype(np.int64)]: a C function
    """
    if spec.partial or spec.num_tables != 1:
        return None
    tables, params = lookup_of(spec).arrays(tensors)
    return _fused().native_entry(fused_plan(spec), tables, params)


def bag_counts(spec: EmbeddingSpec, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Non-padding entries of every bag, ``B x F`` int64 (feature ``f``'s bag ``b`` at ``[b, f]``):
    what a mean divides by, and which bags a max has seen. Inputs validated."""
    ps = spec.per_feature()
    off = np.asarray(inputs["offsets"], dtype=np.int64)
    idx = np.asarray(inputs["indices"])
    F = ps.num_tables
    B = (off.shape[0] - 1) // F
    counts = np.diff(off).reshape(F, B)
    for f, ts in enumerate(ps.tables):
        if ts.padding_idx is None:
            continue
        o = off[f * B:(f + 1) * B + 1]
        pad = np.concatenate(([0], np.cumsum(idx[int(o[0]):int(o[-1])] == ts.padding_idx, dtype=np.int64)))
        counts[f] -= np.diff(pad[o - o[0]])
    return np.ascontiguousarray(counts.T)


def combine_partials(spec: EmbeddingSpec, accs: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> np.ndarray:
    """One feature's row shards, combined then rounded once: the raw ``out_type`` result (``B x D``)
    the unsharded kernel returns. ``accs[s]`` is shard ``s``'s partial ``out`` columns (raw
    ``acc_type``), ``counts[s]`` its bag counts (``B``).

    Sum and mean add the partial accumulators exactly (int64) and the counts, then apply the
    accumulator's type once, the mean's rounded division and the output cast; max takes the largest
    partial among shards that saw the bag. Equal to one device bit for bit whenever the bag's
    running sum stays inside ``acc_type`` (which the default accumulator guarantees for bags up to
    ``max_bag_size``) or the accumulator wraps; a saturating sum that left ``acc_type`` is refused
    (:class:`FormatOverflowError`), as its single-device value depends on the order of the entries.
    """
    acc_t, out_t = spec.acc_type, spec.out_type
    if not accs:
        raise ValueError("accs: at least one shard")
    n = np.sum(np.stack([np.asarray(c, dtype=np.int64) for c in counts]), axis=0)
    if spec.mode == "max":
        stack = np.stack([np.where(np.asarray(c)[:, None] > 0, a, np.iinfo(np.int64).min) for a, c in zip(accs, counts)])
        acc = np.where(n[:, None] > 0, stack.max(axis=0), 0)
        return out_t.cast(acc, acc_t)
    total = np.zeros_like(np.asarray(accs[0], dtype=np.int64))
    for a in accs:
        total = total + np.asarray(a, dtype=np.int64)  # |acc| < 2^61 each: a few shards' sum stays in int64
    if acc_t.overflow != "AP_WRAP" and len(accs) > 1:
        saturated = any(((a == acc_t.min_raw) | (a == acc_t.max_raw)).any() for a in accs)
        if saturated or total.min(initial=0) < acc_t.min_raw or total.max(initial=0) > acc_t.max_raw:
            raise FormatOverflowError(f"acc_type {acc_t}: a row-sharded bag's sum left the accumulator's range; its "
                                      "single-device value depends on the order of its entries (use a wider acc_type)")
    acc = acc_t.cast(total, FixedType(64, int(acc_t.integer) + 64 - int(acc_t.width), signed=True))
    if spec.mode == "mean":
        acc = _sim.round_div(acc, n[:, None])
    return out_t.cast(acc, acc_t)


KIND = register_kind(KernelKind("embedding", EmbeddingSpec.from_json, validate, reference, check_tensors, golden_inputs=golden_inputs,
                                tensor_shapes=tensor_shapes, prepare=prepare, run_checked=run_checked,
                                bind_checked=bind_checked, bind_native=bind_native, spec_schema=SPEC_SCHEMA))

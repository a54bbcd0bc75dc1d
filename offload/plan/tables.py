"""What the planner places: :class:`Table` (rows, dim, storage format, pooling factor, one-hot,
optional row-access histogram) and :func:`tables_of`, which reads them off a module.

Example::

    tables = [Table("user", 40_000_000, 128, fmt="int8_rowwise", pooling_factor=3.0)]
    tables = tables_of(torchrec_ebc)          # or an offload EBC / TBE
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from offload.host.bundle import KernelSource
from offload.kernels.embedding import ROWWISE, EmbeddingSpec, TableSpec
from offload.sim.errors import FormatError, InputError, InputTypeError

__all__ = ["Table", "TableSource", "tables_of", "tables_of_specs", "row_bytes", "DEFAULT_FMT", "PLAN_PARAM_TYPE"]

DEFAULT_FMT = "ap_fixed<16,6>"
# Row-wise tables keep a 24-bit scale and bias per row (rowwise_param_type's width), stored in int32:
# 8 bytes a row. The planner sizes them with this type; the real one is chosen from the data.
PLAN_PARAM_TYPE = "ap_fixed<24,8>"


def row_bytes(dim: int, fmt: str) -> int:
    """Resident bytes of one row of ``dim`` columns in ``fmt`` (row-wise: codes plus scale and bias)."""
    return _row_bytes(int(dim), fmt)


# The planner asks this for every (piece, bank) pair it weighs: parsing the format each time was
# most of its planning time.
@functools.lru_cache(maxsize=1024)
def _row_bytes(dim: int, fmt: str) -> int:
    try:
        ts = TableSpec("t", 1, dim, fmt, PLAN_PARAM_TYPE if fmt == ROWWISE else None)
        return ts.bytes()
    except ValueError as e:
        raise FormatError(f"fmt {fmt!r}: {e}") from e


@dataclass(frozen=True)
class Table:
    """One embedding table as the planner sees it.

    ``pooling_factor``: mean lookups per sample (bag length); ``one_hot``: every bag holds exactly
    one index (a Cartesian-merge candidate); ``access``: optional relative access counts over equal
    row buckets (from an index trace), so row-wise splits balance traffic, not rows; ``features``:
    the features that look this table up (default: the table's name), each costing its lookups.

    Example::

        Table("country", rows=250, dim=16, one_hot=True)
    """

    name: str
    rows: int
    dim: int
    fmt: str = DEFAULT_FMT
    pooling_factor: float = 1.0
    one_hot: bool = False
    access: tuple[float, ...] | None = None
    features: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"Table.name: a non-empty string, got {self.name!r}")
        for f in ("rows", "dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"table {self.name!r}: {f} must be an integer >= 1, got {v!r}")
        if not (self.pooling_factor >= 0):
            raise InputError(f"table {self.name!r}: pooling_factor must be >= 0, got {self.pooling_factor!r}")
        if self.access is not None:
            acc = tuple(float(a) for a in self.access)
            if not acc or min(acc) < 0 or sum(acc) <= 0:
                raise InputError(f"table {self.name!r}: access must be non-negative counts with a positive total")
            object.__setattr__(self, "access", acc)
        object.__setattr__(self, "features", tuple(self.features) or (self.name,))
        row_bytes(self.dim, self.fmt)  # refuse an unknown format here, naming it

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.dim, self.fmt)

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def lookups_per_sample(self) -> float:
        return self.pooling_factor * len(self.features)

    def mass(self, r0: int, r1: int) -> float:
        """Share of this table's lookups that fall in rows ``[r0, r1)`` (uniform without ``access``)."""
        if self.access is None:
            return (r1 - r0) / self.rows
        n = len(self.access)
        total = sum(self.access)
        m = 0.0
        for i, a in enumerate(self.access):  # bucket i covers rows [i*rows/n, (i+1)*rows/n)
            lo, hi = i * self.rows / n, (i + 1) * self.rows / n
            ov = min(hi, r1) - max(lo, r0)
            if ov > 0:
                m += a * ov / (hi - lo)
        return m / total


@runtime_checkable
class TableSource(Protocol):
    """What :func:`tables_of` asks an embedding module that knows its tables (``offload.nn``'s
    ``EmbeddingBagCollection`` implements it): the tables as the planner sees them."""

    def plan_tables(self) -> list[Table]: ...


@runtime_checkable
class _TorchrecCollection(Protocol):
    # torchrec's EmbeddingBagCollection, float and quantized (torchrec 1.8: both define it).
    def embedding_bag_configs(self) -> Sequence: ...


def tables_of_specs(groups: Iterable[tuple[EmbeddingSpec, Sequence[str] | None]]) -> list[Table]:
    """The tables of embedding kernel specs, each with the names of its features in the spec's
    feature order (``None``: each feature named after its table); a table in several specs once.

    Example::

        tables_of_specs([(kernel.spec, ["user", "item"])])
    """
    tables: dict[str, Table] = {}
    for spec, names in groups:
        ftm = spec.feature_table_map or tuple(range(spec.num_tables))
        per_table: dict[int, list[str]] = {}
        for f, t in enumerate(ftm):
            per_table.setdefault(t, []).append(names[f] if names else spec.tables[t].name)
        for t, ts in enumerate(spec.tables):
            tables.setdefault(ts.name, Table(ts.name, ts.num_rows, ts.dim, str(ts.fmt), features=tuple(per_table.get(t, [ts.name]))))
    return list(tables.values())


def tables_of(obj: Any, fmt: str | None = None) -> list[Table]:
    """The tables of ``obj``: a ``torchrec.EmbeddingBagCollection`` (float or quantized), an
    ``offload.nn.EmbeddingBagCollection`` (its :meth:`plan_tables`, the :class:`TableSource`
    hook), an ``offload.nn.TableBatchedEmbeddingBags`` or anything else whose ``offload_kernels()``
    are embedding kernels, or a list of :class:`Table`. ``fmt`` sets the planned storage format of
    a float torchrec collection's tables (default ``ap_fixed<16,6>``, what
    ``EmbeddingBagCollection.from_torchrec`` uses); a quantized one's INT8 tables are planned
    ``int8_rowwise`` (each config's ``data_type``).

    Example::

        plan = offload.plan.shard(offload.plan.tables_of(ebc), topo)
    """
    if isinstance(obj, (list, tuple)):
        out = list(obj)
        bad = [type(t).__name__ for t in out if not isinstance(t, Table)]
        if bad:
            raise InputTypeError(f"tables: a list of offload.plan.Table, got {bad[0]}")
        return out
    if isinstance(obj, TableSource):
        return tables_of(obj.plan_tables())
    if isinstance(obj, KernelSource):
        specs = [k.spec for k in obj.offload_kernels() if isinstance(k.spec, EmbeddingSpec)]
        if not specs:
            raise InputTypeError(f"tables_of: {type(obj).__name__} holds no embedding kernel")
        return tables_of_specs((spec, None) for spec in specs)
    if not isinstance(obj, _TorchrecCollection):
        raise InputTypeError(f"tables_of: expected a torchrec or offload embedding collection, or a list of Table; got {type(obj).__name__}")
    out = []
    for c in obj.embedding_bag_configs():
        out.append(Table(c.name, int(c.num_embeddings), int(c.embedding_dim), _torchrec_fmt(c, fmt), features=tuple(c.feature_names)))
    return out


def _torchrec_fmt(cfg: Any, fmt: str | None) -> str:
    """A torchrec table config's planned format from its ``data_type`` (a ``DataType`` enum, FP32
    unless torchrec's quantization set it): INT8/UINT8 as FBGEMM stores them, row-wise; a float
    type as ``fmt``."""
    kind = cfg.data_type.name
    if kind in ("INT8", "UINT8"):
        return ROWWISE
    if kind in ("FP32", "FP16", "BF16"):
        return fmt or DEFAULT_FMT
    raise FormatError(f"table {cfg.name!r}: data_type {kind}; offload plans FP32/FP16/BF16 (as fmt) and INT8 (int8_rowwise) tables")

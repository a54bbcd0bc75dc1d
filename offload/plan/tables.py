"""What the planner places: :class:`Table` (rows, dim, storage format, pooling factor, one-hot,
optional row-access histogram) and :func:`tables_of`, which reads them off a module.

Example::

    tables = [Table("user", 40_000_000, 128, fmt="int8_rowwise", pooling_factor=3.0)]
    tables = tables_of(torchrec_ebc)          # or an offload EBC / TBE
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from offload.kernels.embedding import ROWWISE, TableSpec
from offload.sim.errors import FormatError, InputError, InputTypeError

__all__ = ["Table", "tables_of", "row_bytes", "DEFAULT_FMT", "PLAN_PARAM_TYPE"]

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


def tables_of(obj: Any, fmt: str | None = None) -> list[Table]:
    """The tables of ``obj``: a ``torchrec.EmbeddingBagCollection`` (float or quantized), an
    ``offload.nn.EmbeddingBagCollection`` or ``TableBatchedEmbeddingBags``, or a list of
    :class:`Table`. ``fmt`` sets the planned storage format of a float torchrec collection's tables
    (default ``ap_fixed<16,6>``, what ``EmbeddingBagCollection.from_torchrec`` uses).

    Example::

        plan = offload.plan.shard(offload.plan.tables_of(ebc), topo)
    """
    if isinstance(obj, (list, tuple)):
        out = list(obj)
        bad = [type(t).__name__ for t in out if not isinstance(t, Table)]
        if bad:
            raise InputTypeError(f"tables: a list of offload.plan.Table, got {bad[0]}")
        return out
    specs = _specs_of(obj)
    if specs is not None:
        tables: dict[str, Table] = {}
        for spec, names in specs:
            for ts, feats in names:
                tables.setdefault(ts.name, Table(ts.name, ts.num_rows, ts.dim, ts.fmt, features=tuple(feats)))
        return list(tables.values())
    cfgs = _torchrec_configs(obj)
    if cfgs is None:
        raise InputTypeError(f"tables_of: expected a torchrec or offload embedding collection, or a list of Table; got {type(obj).__name__}")
    quant = _is_quant(obj)
    out = []
    for c in cfgs:
        f = ROWWISE if quant else (fmt or DEFAULT_FMT)
        out.append(Table(c.name, int(c.num_embeddings), int(c.embedding_dim), f, features=tuple(c.feature_names)))
    return out


def _torchrec_configs(obj: Any) -> Sequence | None:
    getter = getattr(obj, "embedding_bag_configs", None)
    if getter is None:
        return None
    cfgs = getter() if callable(getter) else getter
    return list(cfgs)


def _is_quant(obj: Any) -> bool:
    return type(obj).__module__.startswith("torchrec.quant")


def _specs_of(obj: Any) -> list | None:
    # offload.nn modules carry their kernel specs: TBEs directly, EBCs through their groups.
    tbes: Iterable = getattr(obj, "tbes", None) or ([obj] if hasattr(obj, "kernel") and hasattr(obj, "dims") else None) or ()
    out = []
    for tbe in tbes:
        spec = tbe.kernel.spec
        ftm = spec.feature_table_map or tuple(range(spec.num_tables))
        feats = getattr(obj, "group_features", None)
        names = None if feats is None else feats[list(obj.tbes).index(tbe)]
        per_table: dict[int, list[str]] = {}
        for f, t in enumerate(ftm):
            per_table.setdefault(t, []).append(names[f] if names else spec.tables[t].name)
        out.append((spec, [(ts, per_table.get(t, [ts.name])) for t, ts in enumerate(spec.tables)]))
    return out or None

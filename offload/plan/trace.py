"""Index traces: synthetic generators (uniform, Zipf/Pareto, stack distance; seeded) and the
dlrm_datasets trace format, and what the planner takes from a trace (pooling factors and per-table
row-access histograms).

The format is facebookresearch/dlrm_datasets' (``fbgemm_t856_bs65536.pt``, which FBGEMM's TBE
benchmark reads with ``indices, offsets, lengths = torch.load(path)``): a torch-saved tuple of
``indices`` (int64, all lookups), ``offsets`` (int64, ``T*B+1``, TBE layout: table ``t``'s bag
``b`` at ``t*B+b``) and ``lengths`` (int64, ``T x B``), optionally gzip-compressed. It is read
with ``torch.load(weights_only=True)`` (tensors only: no arbitrary pickle) and checked.

Example::

    tr = generate([1000, 50], batch=512, pooling=[20, 1], mode="zipf", alpha=1.1, seed=0)
    tr.save("t.pt"); tr = IndexTrace.load("t.pt")
    plan = offload.plan.shard(tables, topo, trace=tr)
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from offload.plan.tables import Table
from offload.sim.errors import InputError, InputTypeError

__all__ = ["IndexTrace", "generate", "MODES"]

MODES = ("uniform", "zipf", "stack")
_BUCKETS = 64  # access-histogram buckets a table


@dataclass(frozen=True)
class IndexTrace:
    """``T`` tables' lookups for ``B`` samples in TBE layout; ``names`` (optional) name the tables.

    Example::

        tr = IndexTrace.load("day_0.pt", names=["items", "country"])
        plan = offload.plan.shard(tables, topo, trace=tr)
    """

    indices: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        idx = np.asarray(self.indices, dtype=np.int64)
        off = np.asarray(self.offsets, dtype=np.int64)
        lens = np.asarray(self.lengths, dtype=np.int64)
        if idx.ndim != 1 or off.ndim != 1 or lens.ndim != 2:
            raise InputError(f"trace: indices and offsets 1-D, lengths T x B; got {idx.shape}, {off.shape}, {lens.shape}")
        if off.shape[0] != lens.size + 1 or off[0] != 0 or off[-1] != idx.shape[0] or (np.diff(off) != lens.reshape(-1)).any():
            raise InputError("trace: offsets must be 0, then the running sum of lengths (T*B+1 entries), ending at len(indices)")
        if idx.size and idx.min() < 0:
            raise InputError(f"trace: negative index {int(idx.min())}")
        if self.names is not None and len(self.names) != lens.shape[0]:
            raise InputError(f"trace: {len(self.names)} names for {lens.shape[0]} tables")
        for k, v in (("indices", idx), ("offsets", off), ("lengths", lens)):
            object.__setattr__(self, k, v)

    @property
    def num_tables(self) -> int:
        return self.lengths.shape[0]

    @property
    def batch(self) -> int:
        return self.lengths.shape[1]

    def table(self, t: int) -> np.ndarray:
        """Table ``t``'s indices."""
        B = self.batch
        return self.indices[self.offsets[t * B]:self.offsets[(t + 1) * B]]

    def pooling_factors(self) -> list[float]:
        return [float(x) for x in self.lengths.mean(axis=1)]

    def access(self, t: int, rows: int, buckets: int = _BUCKETS) -> tuple[float, ...]:
        """Table ``t``'s lookups counted over ``buckets`` equal row ranges of a ``rows``-row table."""
        idx = self.table(t)
        if idx.size and idx.max() >= rows:
            raise InputError(f"trace: table {t} has index {int(idx.max())}, past its {rows} rows")
        n = min(buckets, rows)
        b = (idx * n) // rows
        return tuple(float(c) for c in np.bincount(b, minlength=n))

    def apply(self, tables: Sequence[Table]) -> list[Table]:
        """``tables`` with the trace's pooling factors and access histograms (matched by name when
        the trace has names, else by position). A table the trace never touches keeps pooling 0."""
        if self.names is not None:
            pos = {n: i for i, n in enumerate(self.names)}
            missing = [t.name for t in tables if t.name not in pos]
            if missing:
                raise InputError(f"trace: no lookups recorded for tables {missing}")
        elif len(tables) != self.num_tables:
            raise InputError(f"trace: {self.num_tables} tables for {len(tables)} planned ones (give the trace names)")
        pf = self.pooling_factors()
        out = []
        for i, t in enumerate(tables):
            k = pos[t.name] if self.names is not None else i
            acc = self.access(k, t.rows)
            out.append(replace(t, pooling_factor=pf[k] / max(1, len(t.features)), access=acc if sum(acc) > 0 else None))
        return out

    def save(self, path: str | os.PathLike, compress: bool = False) -> None:
        """Write the dlrm_datasets format (``torch.save((indices, offsets, lengths))``, gzip if ``compress``)."""
        import torch

        obj = (torch.from_numpy(self.indices), torch.from_numpy(self.offsets), torch.from_numpy(self.lengths))
        if compress:
            with gzip.open(path, "wb") as f:
                torch.save(obj, f)
        else:
            torch.save(obj, path)

    @classmethod
    def load(cls, path: str | os.PathLike, names: Sequence[str] | None = None) -> "IndexTrace":
        """Read a dlrm_datasets trace (plain or gzip), tensors only (``weights_only=True``)."""
        import torch

        with open(path, "rb") as f:
            head = f.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            try:
                obj = torch.load(f, weights_only=True, map_location="cpu")
            except Exception as e:  # torch raises UnpicklingError/RuntimeError for anything not tensors
                raise InputError(f"trace {os.fspath(path)!r}: not a tensors-only torch file ({type(e).__name__}: {e})") from None
        if not isinstance(obj, (tuple, list)) or len(obj) != 3 or not all(isinstance(x, torch.Tensor) for x in obj):
            raise InputTypeError(f"trace {os.fspath(path)!r}: expected (indices, offsets, lengths) tensors")
        return cls(*(x.numpy().astype(np.int64) for x in obj), names=None if names is None else tuple(names))


def generate(rows: Sequence[int], batch: int, pooling: float | Sequence[float] = 1.0, *, mode: str = "uniform",
             alpha: float = 1.1, reuse: float = 0.6, seed: int = 0, names: Sequence[str] | None = None) -> IndexTrace:
    """A synthetic trace of ``batch`` samples over tables of ``rows`` rows.

    Bag lengths: ``pooling`` (per table or one for all) is the mean; a pooling of 1 gives one-hot
    bags, larger ones ``1 + Poisson(pooling - 1)``. Indices: ``"uniform"``; ``"zipf"`` (row ``r``
    drawn with probability ``~ (r+1)^-alpha``, a Zipf/Pareto tail, hot rows first); ``"stack"``
    (stack-distance reuse, as the synthetic traces of dlrm_data_pytorch after Hassan et al.: with
    probability ``reuse`` a recently used row at a Zipf-distributed stack depth, else a fresh uniform one).

    Example::

        tr = generate([1000, 50], batch=512, pooling=[20, 1], mode="zipf", names=["items", "country"])
    """
    if mode not in MODES:
        raise InputError(f"mode: one of {MODES}, got {mode!r}")
    if batch < 1:
        raise InputError(f"batch: >= 1, got {batch}")
    if len(rows) < 1:
        raise InputError("rows: at least one table, got none")
    rng = np.random.default_rng(seed)
    pools = [float(pooling)] * len(rows) if np.isscalar(pooling) else [float(p) for p in pooling]
    if len(pools) != len(rows):
        raise InputError(f"pooling: {len(pools)} values for {len(rows)} tables")
    lens, idx = [], []
    for n, pf in zip(rows, pools):
        if n < 1 or pf < 0:
            raise InputError(f"rows must be >= 1 and pooling >= 0, got {n}, {pf}")
        ln = np.ones(batch, np.int64) if pf == 1 else (1 + rng.poisson(max(pf - 1, 0), size=batch) if pf > 1 else rng.poisson(pf, size=batch))
        k = int(ln.sum())
        if mode == "uniform":
            ix = rng.integers(0, n, size=k)
        elif mode == "zipf":
            ix = _zipf(rng, n, alpha, k)
        else:
            ix = _stack(rng, n, alpha, reuse, k)
        lens.append(ln)
        idx.append(ix.astype(np.int64))
    lengths = np.stack(lens)
    offsets = np.concatenate(([0], np.cumsum(lengths.reshape(-1))))
    return IndexTrace(np.concatenate(idx), offsets, lengths,
                      None if names is None else tuple(names))


def _zipf(rng: np.random.Generator, n: int, alpha: float, k: int) -> np.ndarray:
    # Inverse CDF over the n ranks (exact for any alpha > 0, bounded to the table).
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha if n <= 1 << 22 else None
    if w is None:  # huge tables: a continuous Pareto tail, truncated to the table
        return np.minimum(np.floor(rng.pareto(alpha, size=k)).astype(np.int64), n - 1)
    cdf = np.cumsum(w)
    return np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right").clip(0, n - 1)


def _stack(rng: np.random.Generator, n: int, alpha: float, reuse: float, k: int) -> np.ndarray:
    stack: list[int] = []
    out = np.empty(k, np.int64)
    fresh = rng.integers(0, n, size=k)
    depth = _zipf(rng, 1 << 12, alpha, k)
    coin = rng.random(k)
    for i in range(k):
        if stack and coin[i] < reuse:
            d = int(depth[i]) % len(stack)
            v = stack.pop(len(stack) - 1 - d)
        else:
            v = int(fresh[i])
            if v in stack:  # a fresh row already on the stack moves to the top
                stack.remove(v)
        stack.append(v)
        if len(stack) > 1 << 12:
            stack.pop(0)
        out[i] = v
    return out

"""Build offload modules for partition candidates, against the ``offload.nn`` factory APIs.

Kept apart from the graph surgery so the calls into ``offload.nn`` (owned by the embedding and MLP
modules) live in one place. Every builder raises on what the kernel cannot do; the caller turns
the error into a "kept on host" report line.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

__all__ = ["build_bag", "build_embedding", "build_mlp", "build_multi", "table_bytes", "BatchedBags", "FloatBags", "BUILD_ERRORS"]

# What a factory raises for a model it cannot offload (unsupported layer, format, size...).
BUILD_ERRORS = (ValueError, TypeError, NotImplementedError, IndexError, KeyError, AttributeError, ImportError, RuntimeError)


def _call(fn: Callable, *args: Any, **kw: Any) -> Any:
    """Call ``fn`` passing only the keyword arguments its signature accepts (device, name...)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return fn(*args, **kw)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kw)
    return fn(*args, **{k: v for k, v in kw.items() if k in params})


def _nn() -> Any:
    import offload.nn as onn

    return onn


def table_bytes(rows: int, dim: int, fmt: str) -> int:
    """Bytes a table occupies on the card in ``fmt`` (raw fixed-point in its power-of-two container;
    int8 row-wise: one byte a value plus a raw (scale, bias) pair a row, 2 x 4 bytes)."""
    if fmt == "int8_rowwise":
        return rows * (dim + 8)
    m = re.match(r"\s*ap_u?(?:fixed|int)<\s*(\d+)", fmt)
    if m is None:
        raise ValueError(f"fmt {fmt!r}: expected 'ap_fixed<W,I>', 'ap_int<W>' or 'int8_rowwise'")
    w = int(m.group(1))
    container = next(b for b in (8, 16, 32, 64) if w <= b) if w <= 64 else w
    return rows * dim * container // 8


def build_bag(bag: nn.EmbeddingBag, fmt: str, device: Any, name: str) -> nn.Module:
    return _call(_nn().EmbeddingBag.from_float, bag, fmt=fmt, device=device, name=name)


def build_embedding(emb: nn.Embedding, fmt: str, device: Any, name: str) -> nn.Module:
    return _call(_nn().Embedding.from_float, emb, fmt=fmt, device=device, name=name)


def build_mlp(seq: nn.Sequential, calib: torch.Tensor, precision: Any, reuse_factor: int, device: Any, name: str) -> nn.Module:
    return _call(_nn().MLP.from_float, seq, calib=calib, precision=precision, reuse_factor=reuse_factor, device=device, name=name)


_MULTI_NAMES = ("EmbeddingBagCollection", "TableBatchedEmbeddingBags", "MultiTableEmbeddingBag", "EmbeddingBags")


def multi_class() -> type | None:
    """The multi-table (table-batched) module class of ``offload.nn``, or None while it is missing."""
    onn = _nn()
    for n in _MULTI_NAMES:
        cls = getattr(onn, n, None)
        if cls is not None and hasattr(cls, "from_float"):
            return cls
    return None


def build_multi(bags: Sequence[nn.EmbeddingBag], fmt: str, device: Any, name: str) -> nn.Module:
    cls = multi_class()
    if cls is None:
        raise NotImplementedError(f"offload.nn has no multi-table module (looked for {', '.join(_MULTI_NAMES)})")
    return _call(cls.from_float, list(bags), fmt=fmt, device=device, name=name)


def _as_bags(indices: torch.Tensor, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``nn.EmbeddingBag`` inputs (2-D fixed bags, or 1-D + offsets) as 1-D indices, B+1 offsets, B."""
    if indices.dim() == 2:
        b, n = indices.shape
        return indices.reshape(-1), torch.arange(0, b * n + 1, n, device=indices.device, dtype=indices.dtype), b
    if offsets is None:
        raise ValueError("embedding_bag: 1-D input needs offsets")
    b = offsets.numel()
    end = torch.tensor([indices.numel()], device=offsets.device, dtype=offsets.dtype)
    return indices, torch.cat([offsets, end]), b


class BatchedBags(nn.Module):
    """Several tables' bag lookups as one table-batched call (FBGEMM TBE layout).

    ``forward(idx0, off0, idx1, off1, ...)`` with each pair as ``nn.EmbeddingBag`` takes them
    returns one pooled tensor per table. ``impl`` is the multi-table module
    (``forward(indices, offsets) -> B x sum(dims)`` with offsets of length ``T*B + 1``).
    """

    def __init__(self, impl: nn.Module, dims: Sequence[int]):
        super().__init__()
        self.impl = impl
        self.dims = [int(d) for d in dims]

    def forward(self, *pairs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        if len(pairs) != 2 * len(self.dims):
            raise ValueError(f"BatchedBags: expected {2 * len(self.dims)} arguments (indices, offsets per table), got {len(pairs)}")
        idx, offs, batch = [], [], None
        base = 0
        for t in range(len(self.dims)):
            i, o, b = _as_bags(pairs[2 * t], pairs[2 * t + 1])
            if batch is None:
                batch = b
            elif b != batch:
                raise ValueError(f"BatchedBags: table {t} has {b} bags, table 0 has {batch}; a table-batched call needs one batch size")
            idx.append(i.to(torch.int64))
            o = o.to(torch.int64) + base
            offs.append(o if t == len(self.dims) - 1 else o[:-1])
            base += i.numel()
        out = self.impl(torch.cat(idx), torch.cat(offs))
        return tuple(torch.split(out, self.dims, dim=1))


class FloatBags(nn.Module):
    """The float counterpart of :class:`BatchedBags`: each table's own ``nn.EmbeddingBag``."""

    def __init__(self, bags: Sequence[nn.EmbeddingBag]):
        super().__init__()
        self.bags = nn.ModuleList(bags)

    def forward(self, *pairs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        return tuple(bag(pairs[2 * t], pairs[2 * t + 1]) for t, bag in enumerate(self.bags))

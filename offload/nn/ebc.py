"""TorchRec users: ``offload.nn.EmbeddingBagCollection``, a ``KeyedJaggedTensor`` in and a
``KeyedTensor`` out like ``torchrec.EmbeddingBagCollection``, its tables in table-batched kernels
(one per pooling mode, so one device call each), shared tables (several features on one table)
stored once through the kernel's ``feature_table_map``.

``from_torchrec(ebc)`` takes a float ``torchrec.EmbeddingBagCollection`` (tables quantized to
``fmt``) or a quantized ``torchrec.quant.EmbeddingBagCollection`` (its IntNBit TBEs' INT8 row-wise
tables loaded exactly, see :mod:`offload.nn.fbgemm`). Output keys and their order are the source
module's (torchrec 1.8: ``_embedding_names``); the input KJT's keys may come in any order.

Example::

    ebc = torchrec.EmbeddingBagCollection(tables=[EmbeddingBagConfig(...), ...], device=torch.device("cpu"))
    m = offload.nn.EmbeddingBagCollection.from_torchrec(ebc, fmt="ap_fixed<16,6>")
    kt = m(kjt)                          # KeyedTensor, same keys and layout as ebc(kjt)
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from offload.host import Device
from offload.kernels.embedding import DEFAULT_WEIGHT_TYPE
from offload.nn.embedding import TableBatchedEmbeddingBags
from offload.nn.embedding_kernel import embedding_kernel, float_table, table_spec
from offload.nn.fbgemm import from_fbgemm
from offload.sim.errors import FormatError, InputError
from offload.sim.fixed import FixedType

__all__ = ["EmbeddingBagCollection", "check_features", "key_order"]

# torchrec.modules.embedding_configs.PoolingType names -> offload modes.
_POOLING = {"SUM": "sum", "MEAN": "mean"}


def key_order(keys: Sequence[str], features: Sequence[str], widths: dict[str, int]) -> Optional[torch.Tensor]:
    """The columns of outputs concatenated in ``features`` order (feature ``f`` is ``widths[f]``
    wide), listed in ``keys`` order: a gather index, or None when the order is already ``keys``'."""
    start, col = {}, 0
    for f in features:
        start[f] = col
        col += widths[f]
    perm = [c for k in keys for c in range(start[k], start[k] + widths[k])]
    return None if perm == list(range(col)) else torch.tensor(perm, dtype=torch.int64)


def check_features(features, keys, weighted: bool, weighted_mean_refused: bool) -> None:
    """The checks a collection makes of a ``KeyedJaggedTensor`` before any lookup: every feature of
    ``keys`` present, weights where the collection is ``weighted``, and none for MEAN tables where
    the float torchrec collection refuses them (``weighted_mean_refused``), as torch.nn.EmbeddingBag.

    Example::

        check_features(kjt, ebc.keys, ebc.is_weighted, False)
    """
    have = features.keys()
    missing = [f for f in keys if f not in have]
    if missing:
        raise InputError(f"features: the KeyedJaggedTensor lacks {missing} (it has {have})")
    if weighted and features.weights_or_none() is None:
        raise InputError("features: this collection is weighted; the KeyedJaggedTensor has no weights")
    if weighted_mean_refused:
        raise NotImplementedError("per_sample_weights: only supported with SUM pooling in this (float torchrec) collection, "
                                  "as torch.nn.EmbeddingBag; a MEAN table was given weighted features")


class EmbeddingBagCollection(torch.nn.Module):
    """Groups of features, each group one :class:`TableBatchedEmbeddingBags`; ``forward(kjt)``
    returns a ``torchrec.KeyedTensor`` with ``keys`` (one per feature) of widths ``dims``."""

    def __init__(self, groups: Sequence[tuple[TableBatchedEmbeddingBags, Sequence[str]]], keys: Sequence[str], *, is_weighted: bool = False,
                 weighted_mean: bool = True) -> None:
        super().__init__()
        self.tbes = torch.nn.ModuleList([g for g, _ in groups])
        self.group_features = [list(f) for _, f in groups]
        order = [f for fs in self.group_features for f in fs]
        if sorted(order) != sorted(keys) or len(set(keys)) != len(keys):
            raise InputError(f"keys: must name each grouped feature once, got {list(keys)} for {order}")
        for tbe, fs in zip(self.tbes, self.group_features):
            if len(tbe.dims) != len(fs):
                raise InputError(f"groups: a kernel with {len(tbe.dims)} features was given {len(fs)} names")
        width = {f: d for tbe, fs in zip(self.tbes, self.group_features) for f, d in zip(fs, tbe.dims)}
        self.keys = list(keys)
        self.dims = [width[k] for k in self.keys]
        self.is_weighted = bool(is_weighted)
        # torchrec's float EBC pools with torch.nn.EmbeddingBag, which refuses weighted means
        # (NotImplementedError); its quantized EBC (FBGEMM) weights them. Each source's behaviour is kept.
        self.weighted_mean = bool(weighted_mean)
        # Columns of the groups' concatenated output, in key order (None when that order is already it).
        self._perm = key_order(self.keys, order, width)

    @classmethod
    def from_torchrec(cls, ebc: torch.nn.Module, fmt: str = "ap_fixed<16,6>", *, max_bag_size: Optional[int] = None,
                      weight_type: FixedType | str = DEFAULT_WEIGHT_TYPE, device: str | Device | None = None,
                      dtype: torch.dtype = torch.float32, on_overflow: str = "warn") -> "EmbeddingBagCollection":
        """From ``torchrec.EmbeddingBagCollection`` (tables quantized to ``fmt``; values it cannot hold
        handled per ``on_overflow``, as ``EmbeddingBag.from_float``) or
        ``torchrec.quant.EmbeddingBagCollection`` (INT8 row-wise tables loaded exactly; ``fmt`` unused)."""
        import torchrec
        from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

        if isinstance(ebc, QuantEBC):
            # None: the longest bag each quantized table sums exactly (offload.nn.fbgemm).
            return cls._from_quant(ebc, max_bag_size=max_bag_size, weight_type=weight_type, device=device)
        if not isinstance(ebc, torchrec.EmbeddingBagCollection):
            raise TypeError(f"ebc: expected a torchrec EmbeddingBagCollection (float or quantized), got {type(ebc).__name__}")
        by_mode: dict[str, list] = {}
        for cfg in ebc.embedding_bag_configs():
            mode = _POOLING.get(cfg.pooling.name)
            if mode is None:
                raise FormatError(f"table {cfg.name!r}: pooling {cfg.pooling.name}; offload pools SUM or MEAN")
            by_mode.setdefault(mode, []).append(cfg)
        groups = []
        for mode, cfgs in by_mode.items():
            bags = [ebc.embedding_bags[c.name] for c in cfgs]
            ws = [float_table(c.name, b.weight) for c, b in zip(cfgs, bags)]
            tables = [table_spec(c.name, w, fmt) for c, w in zip(cfgs, ws)]
            ftm = [t for t, c in enumerate(cfgs) for _ in c.feature_names]
            kernel = embedding_kernel(f"ebc_{mode}", tables, ws, on_overflow=on_overflow, mode=mode, max_bag_size=max_bag_size,
                                      weight_type=weight_type, weighted_mean=ebc.is_weighted(),
                                      feature_table_map=None if ftm == list(range(len(cfgs))) else ftm)
            features = [f for c in cfgs for f in c.feature_names]
            groups.append((TableBatchedEmbeddingBags(kernel, device=device, dtype=dtype), features))
        return cls(groups, list(ebc._embedding_names), is_weighted=ebc.is_weighted(), weighted_mean=False)

    @classmethod
    def _from_quant(cls, qebc, *, max_bag_size: Optional[int], weight_type: FixedType | str, device) -> "EmbeddingBagCollection":
        # torchrec/quant/embedding_modules.py (1.8): one IntNBit TBE per (pooling, virtual table) key,
        # its features in _feature_names order, split by _feature_splits; output keys _embedding_names.
        groups, pos = [], 0
        for i, (tbe, n) in enumerate(zip(qebc._emb_modules, qebc._feature_splits)):
            groups.append((from_fbgemm(TableBatchedEmbeddingBags, tbe, max_bag_size=max_bag_size, weight_type=weight_type,
                                       device=device, name=f"qebc{i}"), qebc._feature_names[pos:pos + n]))
            pos += n
        return cls(groups, list(qebc._embedding_names), is_weighted=qebc.is_weighted())

    def forward(self, features):
        """``features``: a ``KeyedJaggedTensor`` holding at least this collection's features (any
        key order, one stride); returns a ``KeyedTensor`` (``B x sum(dims)``, ``key_dim=1``)."""
        from torchrec.sparse.jagged_tensor import KeyedTensor

        check_features(features, self.keys, self.is_weighted, self.is_weighted and not self.weighted_mean and any(t.mode == "mean" for t in self.tbes))
        jts = features.to_dict()
        outs = []
        for tbe, fs in zip(self.tbes, self.group_features):
            values = [jts[f].values() for f in fs]
            lengths = torch.cat([jts[f].lengths() for f in fs]).to(torch.int64)
            offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
            psw = torch.cat([jts[f].weights() for f in fs]) if self.is_weighted else None
            outs.append(tbe(torch.cat(values), offsets, psw))
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self._perm is not None:
            y = y.index_select(1, self._perm.to(y.device))
        return KeyedTensor(keys=list(self.keys), length_per_key=list(self.dims), values=y, key_dim=1)

    def plan_tables(self) -> list:
        """The tables as the planner sees them (``offload.plan.tables_of`` calls this, its
        ``TableSource`` hook): each group kernel's tables with the features that look them up.

        Example::

            plan = offload.plan.shard(offload.plan.tables_of(m), offload.plan.Topology.uniform("u55c"))
        """
        from offload.plan.tables import tables_of_specs

        return tables_of_specs((tbe.offload_kernels()[0].spec, fs) for tbe, fs in zip(self.tbes, self.group_features))

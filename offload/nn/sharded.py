"""``ShardedEmbeddingBagCollection``: a TorchRec collection whose tables are spread over cards and
hosts as an :class:`offload.plan.Plan` says, returning what one device returns, bit for bit.

Every card runs the partial kernels :mod:`offload.plan.cut` cuts from the collection's: a row
shard returns its raw accumulator and bag counts, which are combined over the table's row shards
and rounded once (:func:`offload.kernels.embedding.combine_partials`); column shards fill their
own columns. A Cartesian merge of one-hot tables is one product table looked up at ``i * rows_b + j``.

Example::

    plan = offload.plan.shard(offload.plan.tables_of(ebc), offload.plan.Topology.uniform("u55c", 2, 2))
    sharded = ShardedEmbeddingBagCollection.from_torchrec(ebc, plan, engine="local")
    kt = sharded(kjt)      # == offload.nn.EmbeddingBagCollection.from_torchrec(ebc)(kjt), bit for bit
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from offload.kernels.embedding import DEFAULT_WEIGHT_TYPE, combine_partials
from offload.nn.ebc import EmbeddingBagCollection, check_features, key_order
from offload.nn import fbgemm
from offload.ops.embedding import quantize_weights, raw_to_tensor
from offload.plan import cut
from offload.plan.engine import open_engine
from offload.plan.plan import Plan
from offload.sim.errors import IndexRangeError, InputError

__all__ = ["ShardedEmbeddingBagCollection"]


class ShardedEmbeddingBagCollection(torch.nn.Module):
    """A TorchRec ``EmbeddingBagCollection`` over the cards of a :class:`~offload.plan.Plan`;
    ``forward(kjt)`` returns the ``KeyedTensor`` the single-device
    :class:`~offload.nn.EmbeddingBagCollection` returns, bit for bit."""

    def __init__(self, single: EmbeddingBagCollection, plan: Plan, engine: str = "local", *, device: str = "sim") -> None:
        super().__init__()
        self.plan = plan
        self.keys = list(single.keys)
        self.dims = list(single.dims)
        self.is_weighted = single.is_weighted
        self.weighted_mean = single.weighted_mean
        self.group_features = [list(f) for f in single.group_features]
        widths = {f: d for fs, tbe in zip(self.group_features, single.tbes) for f, d in zip(fs, tbe.dims)}
        self._perm = key_order(self.keys, [f for fs in self.group_features for f in fs], widths)
        self._groups = []  # (full spec, dtype, on_overflow, bounds_check, feature rows, lookups)
        for tbe in single.tbes:
            k = tbe.offload_kernels()[0]
            rows = [k.spec.tables[t].num_rows for t in (k.spec.feature_table_map or range(k.spec.num_tables))]
            self._groups.append((k.spec, tbe.dtype, tbe.on_overflow, tbe.bounds_check, rows, cut.lookups(k, plan, weighted=self.is_weighted)))
        self._cards = cut.assign([g[-1] for g in self._groups], plan)
        kernels = {card: [cut.card_kernel(card, g, self._groups[g][0], self._groups[g][-1], slots) for g, slots in by_group]
                   for card, by_group in self._cards.items()}
        self.engine = open_engine(engine, plan.topology, device=device)
        self.engine.load(kernels)

    @classmethod
    def from_torchrec(cls, ebc: torch.nn.Module, plan: Plan, engine: str = "local", *, fmt: Optional[str] = None,
                      max_bag_size: Optional[int] = None, weight_type: str = DEFAULT_WEIGHT_TYPE, device: str = "sim",
                      dtype: torch.dtype = torch.float32, on_overflow: str = "warn") -> "ShardedEmbeddingBagCollection":
        """From a float or quantized ``torchrec.EmbeddingBagCollection``, quantized as
        :meth:`offload.nn.EmbeddingBagCollection.from_torchrec` does (``fmt``: the plan's format
        when all its tables share one), then cut into the plan's shards on ``engine``'s cards."""
        if fmt is None:
            fmts = {t.fmt for t in plan.tables}
            fmt = fmts.pop() if len(fmts) == 1 else "ap_fixed<16,6>"
        single = EmbeddingBagCollection.from_torchrec(ebc, fmt, max_bag_size=max_bag_size, weight_type=weight_type,
                                                      device="sim", dtype=dtype, on_overflow=on_overflow)
        return cls(single, plan, engine, device=device)

    # ------------------------------------------------------------------------------ call

    def forward(self, features):
        """``features``: a ``KeyedJaggedTensor`` with this collection's features; returns a ``KeyedTensor``."""
        from torchrec.sparse.jagged_tensor import KeyedTensor

        check_features(features, self.keys, self.is_weighted, self.is_weighted and not self.weighted_mean and any(g[0].mode == "mean" for g in self._groups))
        jts = features.to_dict()
        streams = []  # per group: per lookup (indices int64, lengths, weights raw | None)
        B = None
        for g, (spec, dtype, on_overflow, bounds, rows, lookups) in enumerate(self._groups):
            fs = self.group_features[g]
            values = [jts[f].values() for f in fs]
            lengths = torch.cat([jts[f].lengths() for f in fs]).to(torch.int64)
            offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
            idx = torch.cat(values)
            if bounds != "fatal":
                idx, offsets = fbgemm.bounds_check(bounds, rows, idx, offsets)
            idx = idx.to(torch.int64).numpy()
            off = offsets.numpy()
            F = len(fs)
            B = (off.shape[0] - 1) // F
            w = None
            if self.is_weighted:
                wt = torch.cat([jts[f].weights() for f in fs]).detach().to(torch.float64).numpy()
                w = quantize_weights(wt, spec.weight_type, on_overflow)
            per = []
            for lk in lookups:
                parts = []
                for f in lk.features:
                    a, b = int(off[f * B]), int(off[(f + 1) * B])
                    fi = idx[a:b]
                    if fi.size and (fi.min() < 0 or fi.max() >= rows[f]):
                        p = int(np.flatnonzero((fi < 0) | (fi >= rows[f]))[0])
                        raise IndexRangeError(f"indices[{a + p}] = {int(fi[p])} is out of range for feature {fs[f]!r} with {rows[f]} rows")
                    parts.append((fi, np.diff(off[f * B:(f + 1) * B + 1]), None if w is None else w[a:b]))
                if lk.part_rows:
                    (ia, la, _), (ib, lb, _) = parts
                    if (la != 1).any() or (lb != 1).any():
                        bad = int(np.flatnonzero((la != 1) | (lb != 1))[0])
                        raise InputError(f"features {fs[lk.features[0]]!r}, {fs[lk.features[1]]!r}: planned one-hot (merged table "
                                         f"{lk.plan_name!r}) but bag {bad} holds {int(la[bad])} and {int(lb[bad])} entries")
                    per.append((ia * lk.part_rows[1] + ib, la, None))
                else:
                    per.append(parts[0])
            streams.append(per)
        calls = {card: [self._inputs(streams[g], slots, B) for g, slots in by_group] for card, by_group in self._cards.items()}
        outs = self.engine.run(calls)
        partial: dict = {}  # (group, lookup, c0, c1) -> [(acc cols, counts)]
        for card, by_group in self._cards.items():
            for (g, slots), res in zip(by_group, outs[card]):
                col = 0
                for i, sl in enumerate(slots):
                    w_ = sl.c1 - sl.c0
                    partial.setdefault((g, sl.lookup, sl.c0, sl.c1), []).append((res["out"][:, col:col + w_], res["count"][:, i]))
                    col += w_
        ys = []
        for g, (spec, dtype, *_, lookups) in enumerate(self._groups):
            fcol = np.cumsum([0] + [spec.tables[t].dim for t in (spec.feature_table_map or range(spec.num_tables))])
            raw = np.zeros((B, int(fcol[-1])), dtype=np.int64)
            for li, lk in enumerate(lookups):
                full = np.zeros((B, lk.table.dim), dtype=np.int64)
                for (gg, ll, c0, c1), parts in partial.items():
                    if (gg, ll) == (g, li):
                        full[:, c0:c1] = combine_partials(spec, [p[0] for p in parts], [p[1] for p in parts])
                dims = lk.part_dims or (lk.table.dim,)
                c = 0
                for f, d in zip(lk.features, dims):
                    raw[:, fcol[f]:fcol[f] + d] = full[:, c:c + d]
                    c += d
            ys.append(raw_to_tensor(raw, spec.out_type, dtype))
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)
        if self._perm is not None:
            y = y.index_select(1, self._perm)
        return KeyedTensor(keys=list(self.keys), length_per_key=list(self.dims), values=y, key_dim=1)

    @staticmethod
    def _inputs(per: list, slots: Sequence[cut.Slot], B: int) -> dict:
        idx_parts, lens, ws = [], [], []
        for sl in slots:
            fi, fl, fw = per[sl.lookup]
            keep = (fi >= sl.r0) & (fi < sl.r1)
            cum = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
            bag_end = np.cumsum(fl)
            lens.append(np.diff(np.concatenate(([0], cum[bag_end]))))
            idx_parts.append(fi[keep] - sl.r0)
            if fw is not None:
                ws.append(fw[keep])
        lengths = np.concatenate(lens)
        x = {"indices": np.concatenate(idx_parts).astype(np.int64), "offsets": np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)}
        if ws:
            x["per_sample_weights"] = np.concatenate(ws)
        return x

    def close(self) -> None:
        """Release the cards (the engine's devices or actors)."""
        self.engine.close()

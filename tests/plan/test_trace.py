"""Index traces: seeded generators with their distributions' shape, the dlrm_datasets file round
trip (plain and gzip, tensors only), and what the planner takes from a trace."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import offload.plan as P
from offload.plan.trace import IndexTrace, generate
from offload.sim.errors import InputError


@pytest.mark.parametrize("mode", ["uniform", "zipf", "stack"])
def test_generators_are_seeded_and_shaped(mode):
    a = generate([1000, 7], batch=300, pooling=[12, 1], mode=mode, seed=5)
    b = generate([1000, 7], batch=300, pooling=[12, 1], mode=mode, seed=5)
    assert (a.indices == b.indices).all() and (a.lengths == b.lengths).all()
    assert not np.array_equal(generate([1000, 7], 300, [12, 1], mode=mode, seed=6).indices, a.indices)
    assert (a.lengths[1] == 1).all() and abs(a.pooling_factors()[0] - 12) < 1.0
    assert a.table(0).max() < 1000 and a.table(1).max() < 7
    x = a.table(0)
    top = np.bincount(x, minlength=1000)
    share = np.sort(top)[::-1][:10].sum() / top.sum()  # popularity: the hottest 1 % of rows' share
    recent = np.mean([x[i] in x[max(0, i - 16):i] for i in range(1, x.size)])  # locality: seen in the last 16
    assert (share > 0.15) == (mode == "zipf")
    if mode != "zipf":  # Zipf's hot rows recur too; uniform rows hardly do
        assert (recent > 0.2) == (mode == "stack")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch, on the refused non-tensor file
def test_dlrm_datasets_format_round_trip(tmp_path):
    tr = generate([50, 9, 400], batch=33, pooling=[3, 1, 7], mode="zipf", seed=1)
    for comp in (False, True):
        p = tmp_path / f"t{comp}.pt"
        tr.save(p, compress=comp)
        back = IndexTrace.load(p)
        assert (back.indices == tr.indices).all() and (back.offsets == tr.offsets).all() and (back.lengths == tr.lengths).all()
    # Anything but three tensors is refused, and a pickled object never runs.
    bad = tmp_path / "bad.pt"
    bad.write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(InputError):
        IndexTrace.load(bad)
    with pytest.raises(InputError, match="offsets"):
        IndexTrace(tr.indices, tr.offsets[:-1], tr.lengths)


def test_planner_takes_pooling_and_access_from_a_trace():
    tables = [P.Table("hot", 1_000_000, 64), P.Table("cold", 1_000_000, 64)]
    tr = generate([1_000_000, 1_000_000], batch=256, pooling=[30, 2], mode="zipf", alpha=1.2, seed=0, names=["hot", "cold"])
    topo = P.Topology.uniform("u55c")
    plan = P.shard(tables, topo, trace=tr, batch_size=256)
    hot = plan.table("hot")
    assert abs(hot.pooling_factor - tr.pooling_factors()[0]) < 1e-12
    # Zipf puts the traffic in the first rows: equal-traffic row shards are far from equal in rows.
    if len(hot.shards) > 1:
        sizes = [s.row1 - s.row0 for s in hot.shards]
        assert min(sizes) * 4 < max(sizes)
    assert sum(s.lookups for s in hot.shards) == pytest.approx(256 * tr.pooling_factors()[0])

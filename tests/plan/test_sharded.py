"""Sharded lookups against one device: zero mismatches over table-, row-, column- and
table-row-wise shards and Cartesian merges, sum and mean, weighted or not, in fixed-point and
int8 row-wise formats, on the local engine (the Ray engine: test_ray.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

torchrec = pytest.importorskip("torchrec")

import offload  # noqa: E402
import offload.plan as P  # noqa: E402
from offload.sim.errors import IndexRangeError, InputError  # noqa: E402

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType  # noqa: E402

ROWS = {"big": 900, "wide": 120, "user": 60, "ctx": 7, "dev": 5, "geo": 9}
DIM = {"big": 16, "wide": 24, "user": 8, "ctx": 4, "dev": 4, "geo": 4}


def make_ebc(weighted: bool, seed: int):
    m, s = PoolingType.MEAN, PoolingType.SUM
    feats = {"big": ["b1", "b2"], "wide": ["w"], "user": ["u"], "ctx": ["c"], "dev": ["d"], "geo": ["g"]}
    # torchrec's float collection refuses weighted MEAN bags (torch.nn.EmbeddingBag); weighted means: test_partial.py.
    pool = {"big": s, "wide": s if weighted else m, "user": s if weighted else m, "ctx": s, "dev": s, "geo": s}
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=DIM[n], num_embeddings=ROWS[n], feature_names=feats[n],
                                                            pooling=pool[n]) for n in ROWS], is_weighted=weighted, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in ebc.embedding_bags.values():
            b.weight.copy_(torch.randn(tuple(b.weight.shape), generator=g) * 3)
    return ebc


def make_kjt(weighted: bool, seed: int, B: int, one_hot=("c", "d", "g")):
    rng = np.random.default_rng(seed)
    rows = {"b1": 900, "b2": 900, "w": 120, "u": 60, "c": 7, "d": 5, "g": 9}
    keys = list(rows)
    lens = np.concatenate([np.ones(B, np.int64) if k in one_hot else rng.integers(0, 9, size=B) for k in keys])
    vals = np.concatenate([rng.integers(0, rows[keys[i // B]], size=n) for i, n in enumerate(lens)])
    w = torch.from_numpy(rng.standard_normal(vals.shape[0]) * 2).float() if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(vals), lengths=torch.from_numpy(lens), weights=w)


def plan_for(ebc, fmt, weighted, cards_per_host=2):
    tables = [t if t.name not in ("ctx", "dev", "geo") or weighted else P.Table(t.name, t.rows, t.dim, t.fmt, one_hot=True, features=t.features)
              for t in P.tables_of(ebc, fmt=fmt)]
    # U250s (four DDR banks a card, on-chip share off): few banks keep the shard count, hence the test, small.
    topo = P.Topology(hosts=[["u250"] * cards_per_host] * 2, onchip_share=0.0)
    cons = {"big": {"sharding": "row_wise"}, "wide": {"sharding": "column_wise"}, "user": {"sharding": "table_row_wise"}}
    return P.shard(tables, topo, cons, merge_budget=4096)


@pytest.mark.parametrize("fmt", ["ap_fixed<16,6>", "ap_fixed<8,3>", "int8_rowwise"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sharded_equals_single_device_bit_for_bit(fmt, weighted):
    ebc = make_ebc(weighted, seed=3)
    plan = plan_for(ebc, fmt, weighted)
    kinds = {t.name: t.sharding for t in plan.tables}
    assert kinds["big"] == "row_wise" and kinds["wide"] == "column_wise" and kinds["user"] in ("table_row_wise", "table_wise")
    assert len(plan.table("big").shards) > 1 and len(plan.table("wide").shards) > 1
    assert len(plan.cards) > 1
    if not weighted and fmt != "int8_rowwise":
        assert any(t.parts for t in plan.tables)  # a Cartesian merge of one-hot tables
    single = offload.nn.EmbeddingBagCollection.from_torchrec(ebc, fmt, on_overflow="saturate")
    sharded = offload.nn.ShardedEmbeddingBagCollection.from_torchrec(ebc, plan, engine="local", fmt=fmt, on_overflow="saturate")
    try:
        mism = total = 0
        for seed, B in [(1, 1), (2, 7), (3, 64)]:
            kjt = make_kjt(weighted, seed, B)
            want, got = single(kjt), sharded(kjt)
            assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
            a, b = want.values().numpy().view(np.int32), got.values().numpy().view(np.int32)
            mism += int((a != b).sum())
            total += a.size
        assert total > 0 and mism == 0, f"{mism} of {total} values differ"
    finally:
        sharded.close()


def test_bad_inputs_are_refused_not_dropped():
    ebc = make_ebc(False, seed=4)
    plan = plan_for(ebc, "ap_fixed<16,6>", False)
    sharded = offload.nn.ShardedEmbeddingBagCollection.from_torchrec(ebc, plan)
    try:
        kjt = make_kjt(False, 5, 4)
        vals = kjt.values().clone()
        vals[0] = 900  # one past table 'big' (row shards would otherwise just not see it)
        bad = KeyedJaggedTensor.from_lengths_sync(keys=kjt.keys(), values=vals, lengths=kjt.lengths())
        with pytest.raises(IndexRangeError, match="out of range"):
            sharded(bad)
        with pytest.raises(InputError, match="one-hot"):
            sharded(make_kjt(False, 6, 4, one_hot=()))
    finally:
        sharded.close()


def test_the_local_engine_refuses_a_run_before_load_and_a_second_load():
    from offload.plan.engine import LocalEngine
    from offload.plan import Topology
    from offload.sim.errors import DeviceError

    eng = LocalEngine(Topology.uniform("u55c", hosts=1, cards_per_host=1))
    with pytest.raises(DeviceError, match="nothing loaded"):
        eng.run({})
    eng.load({})
    with pytest.raises(DeviceError, match="already loaded"):
        eng.load({})
    eng.close()
    eng.load({})  # closed: loads again
    eng.close()

"""bench/bench_plan.py's TorchRec comparison: its rows are what TorchRec's EmbeddingShardingPlanner
returns for the same tables (planned here in the test, independently of the helper), the topology,
data type and pooling factors reach the planner, and every table is in both columns."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

try:
    import torch
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import KernelConfig, PlannerError, TopologyFactory, TrainerConfig
    from torchrec.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder
    from torchrec.modules.embedding_configs import DataType
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection
except Exception as e:  # torchrec missing, or its planner's imports (fbgemm_gpu) failing here
    pytest.skip(f"torchrec's planner does not import here: {type(e).__name__}: {e}", allow_module_level=True)

import offload.plan as P

_spec = importlib.util.spec_from_file_location("bench_plan", Path(__file__).resolve().parents[2] / "bench" / "bench_plan.py")
bench_plan = importlib.util.module_from_spec(_spec)
sys.modules["bench_plan"] = bench_plan  # its dataclasses look their module up while being made
_spec.loader.exec_module(bench_plan)

DIM = 16
BATCH = 64
# The third table (200000 x 16 fp32: 12.8 MB) is larger than one GPU of GPU_GB below, so it must be cut.
TABLES = [P.Table("a", 1000, DIM, "ap_fixed<32,16>", pooling_factor=1.0, one_hot=True),
          P.Table("b", 50, DIM, "ap_fixed<32,16>", pooling_factor=2.0),
          P.Table("c", 200000, DIM, "ap_fixed<32,16>", pooling_factor=20.0),
          P.Table("d", 8, DIM, "ap_fixed<32,16>", pooling_factor=1.0, one_hot=True)]
GPUS = 4
GPU_GB = 8e6 / 2**30


def _planner_directly(data_type: str):
    """TorchRec's plan for TABLES, set up as torchrec.inference.modules.shard_quant_model does (less its table-wise pin)."""
    ebc = QuantEmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name],
                                   data_type=DataType[data_type]) for t in TABLES], is_weighted=False, device=torch.device("meta"))
    topo = TopologyFactory.create_topology(TrainerConfig(world_size=GPUS, local_world_size=GPUS, hbm_cap_bytes=int(GPU_GB * 2**30)),
                                           kernel_config=KernelConfig(compute_device="cuda"))
    cons = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in TABLES}
    planner = EmbeddingShardingPlanner(
        topology=topo, batch_size=BATCH, constraints=cons,
        enumerator=EmbeddingEnumerator(topology=topo, batch_size=BATCH, constraints=cons, estimator=[
            EmbeddingPerfEstimator(topology=topo, constraints=cons, is_inference=True),
            EmbeddingStorageEstimator(topology=topo, constraints=cons)]),
        storage_reservation=FixedPercentageStorageReservation(percentage=0.0), debug=False)
    sp = planner.plan(ebc, [QuantEmbeddingBagCollectionSharder()])
    return {name: (ps.sharding_type, ps.compute_kernel, list(ps.ranks)) for params in sp.plan.values() for name, ps in params.items()}


@pytest.fixture(scope="module")
def fp32():
    return bench_plan.torchrec_plan(TABLES, "FP32", gpus=GPUS, gpu_gb=GPU_GB, batch=BATCH)


def test_rows_are_torchrecs_plan(fp32):
    want = _planner_directly("FP32")
    assert sorted(want) == sorted(t.name for t in TABLES)
    assert {n: v[:3] for n, v in fp32.tables.items()} == want


def test_topology_reaches_the_planner(fp32):
    # 12.8 MB of table "c" does not fit one 8 MB GPU.
    assert fp32.tables["c"][0] != "table_wise"
    assert len(set(fp32.tables["c"][2])) > 1
    assert all(0 <= r < GPUS for v in fp32.tables.values() for r in v[2])
    assert max(fp32.rank_bytes.values()) <= GPU_GB * 2**30
    assert sum(fp32.rank_bytes.values()) == sum(v[3] for v in fp32.tables.values())
    assert fp32.rank_bytes[max(fp32.rank_ms, key=fp32.rank_ms.get)] > 0


def test_fewest_gpus_is_the_fewest():
    few = bench_plan.fewest_gpus(TABLES, "FP32", gpu_gb=GPU_GB, batch=BATCH, up_to=GPUS, hbm_only=True)
    n = len(few.rank_bytes)
    assert n >= 2  # 13 MB of tables, 8 MB GPUs
    assert all(v[1] == "quant" and v[4] == 0 for v in few.tables.values())
    with pytest.raises(PlannerError):
        bench_plan.torchrec_plan(TABLES, "FP32", gpus=n - 1, gpu_gb=GPU_GB, batch=BATCH, hbm_only=True)


def test_data_type_reaches_the_planner(fp32):
    int8 = bench_plan.torchrec_plan(TABLES, "INT8", gpus=GPUS, gpu_gb=GPU_GB, batch=BATCH)
    assert {n: v[:3] for n, v in int8.tables.items()} == _planner_directly("INT8")
    # FBGEMM's INT8 row: 16 codes + 4 bytes of scale/bias against 64 bytes of fp32, both padded to 16.
    assert sum(int8.rank_bytes.values()) < sum(fp32.rank_bytes.values())


def test_every_table_in_both_columns(fp32):
    plan = P.shard(TABLES, P.Topology.uniform("u55c", hosts=1, cards_per_host=2), batch_size=BATCH)
    rows = bench_plan.compare_rows(plan, fp32)
    assert [r[0] for r in rows] == [t.name for t in TABLES]
    for name, sharding, cards, kinds, ts, kernel, ranks in rows:
        tp = plan.table(name)
        assert sharding == (tp.sharding if not tp.parts else f"merge:{tp.name}")
        assert cards == sorted({s.where for s in tp.shards}) and kinds
        assert (ts, kernel, ranks) == tuple(fp32.tables[name][:3])

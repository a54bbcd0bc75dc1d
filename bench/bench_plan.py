"""DLRM-v2 tables planned onto Alveo cards, and sharded lookups at reduced scale (local and Ray).

Tables: MLPerf DLRM-v2 (DCNv2, Criteo 1TB multi-hot): 26 tables at dimension 128 with the rows of
``--num_embeddings_per_feature`` and the pooling factors of ``--multi_hot_sizes`` in the MLPerf
training reference (mlcommons/training recommendation_v2/torchrec_dlrm README; torchrec's
examples/dlrm uses the same rows). "fp32" is planned as ``ap_fixed<32,16>`` (4 bytes an element,
fp32's size), "int8" as ``int8_rowwise`` (128 codes + 8 bytes of scale and bias a row).

Part 1 finds the fewest cards (hosts of four) each format fits on, plans them (``offload.plan.shard``,
batch 512) and prints planning time, bytes per HBM channel, predicted time per batch and the
busiest channel over the mean. Part 2 divides every table's rows by ``--scale`` (same dims and
pooling factors, a card's banks divided alike), builds the TorchRec collection and compares the
sharded lookups (4 sim cards, 2 hosts) with one device, local and on a two-node Ray cluster, and
times a batch of ``--batch`` samples.

``--torchrec`` runs part 1 and then TorchRec's own planner (``EmbeddingShardingPlanner.plan``, single
process: ``collective_plan`` only adds a process group's broadcast, planners.py) on the same tables
for ``--gpus`` GPUs of ``--gpu-gb`` GiB, in place of part 2: per table TorchRec's sharding type, compute
kernel and ranks beside offload's sharding, cards and memory, then devices used, bytes per device
and TorchRec's perf estimate. It plans inference the way ``torchrec.inference.modules.shard_quant_model``
does (a quantized ``EmbeddingBagCollection`` on the meta device, ``QuantEmbeddingBagCollectionSharder``,
``is_inference=True`` estimators, no storage reserve) but lets the planner choose among the sharding
types that sharder offers (table-, row-, column-wise) rather than pinning table-wise;
``compute_device="cuda"`` only selects its cost model, so planning needs no GPU. The sharding choices
and device counts compare; the times do not (GPU HBM and NVLink against FPGA HBM pseudo-channels, PCIe
and the network, each in its own planner's model).

    .venv/bin/python bench/bench_plan.py [--scale 20000] [--batch 512] [--batches 5] [--no-ray]
    .venv/bin/python bench/bench_plan.py --torchrec [--gpus 8] [--gpu-gb 80]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import Counter

ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14,
        40000000, 40000000, 40000000, 590152, 12973, 108, 36]
POOLING = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DIM = 128
FORMATS = {"fp32": "ap_fixed<32,16>", "int8": "int8_rowwise"}
# torchrec.modules.embedding_configs.DataType member per bench format.
TORCHREC_TYPES = {"fp32": "FP32", "int8": "INT8"}


def dlrm_tables(fmt: str, scale: int = 1):
    import offload.plan as P

    return [P.Table(f"t{i}", max(1, r // scale), DIM, fmt, pooling_factor=float(p), one_hot=p == 1) for i, (r, p) in enumerate(zip(ROWS, POOLING))]


def fewest_cards(tables, card, batch):
    import offload.plan as P

    for n in range(1, 65):
        topo = P.Topology.uniform(card, hosts=(n + 3) // 4, cards_per_host=min(n, 4)) if n <= 4 or n % 4 == 0 else None
        if topo is None:
            continue
        t0 = time.perf_counter()
        try:
            plan = P.shard(tables, topo, batch_size=batch)
        except P.PlanError:
            continue
        return n, plan, time.perf_counter() - t0
    raise SystemExit("no topology up to 64 cards holds the tables")


def part1(batch):
    print(f"{'format':<6} {'card':<5} {'cards':>5} {'plan s':>7} {'GB':>7} {'HBM PCs':>8} {'MB/PC max':>10} {'MB/PC mean':>11} "
          f"{'us/batch':>9} {'busiest/mean':>13}")
    plans = {}
    for fname, fmt in FORMATS.items():
        tables = dlrm_tables(fmt)
        for card in ("u55c", "u280"):
            n, plan, dt = fewest_cards(tables, card, batch)
            ub = [v for k, v in plan.unit_bytes().items() if k[2] == "HBM"]
            total = sum(t.bytes for t in plan.tables)
            print(f"{fname:<6} {card:<5} {n:>5} {dt:>7.2f} {total / 1e9:>7.2f} {len(ub):>8} {max(ub) / 1e6:>10.1f} "
                  f"{sum(ub) / len(ub) / 1e6:>11.1f} {plan.batch_s() * 1e6:>9.1f} {plan.channel_balance():>13.3f}")
            plans[(fname, card)] = plan
    return plans


def _scaled_card(name, scale):
    from offload.hls.cards import get_card

    c = get_card(name)
    mem = {k: (None if m is None else dataclasses.replace(m, bank_bytes=max(1, m.bank_bytes // scale))) for k, m in (("hbm", c.hbm), ("ddr", c.ddr))}
    return dataclasses.replace(c, **mem)


def part2(scale, batch, batches, use_ray):
    import numpy as np
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

    import offload
    import offload.plan as P
    from offload.plan.trace import generate

    fmt = "ap_fixed<16,6>"
    tables = dlrm_tables(fmt, scale)
    card = _scaled_card("u55c", scale)
    topo = P.Topology(hosts=[[card, card], [card, card]], onchip_share=0.5 / scale)
    plan = P.shard(tables, topo, batch_size=batch)
    kinds = {}
    for t in plan.tables:
        kinds[t.sharding] = kinds.get(t.sharding, 0) + 1
    print(f"\nreduced scale: rows / {scale} ({sum(t.rows for t in tables)} rows), {fmt}, 4 sim U55C (banks / {scale}) on 2 hosts; "
          f"{len(plan.cards)} cards used, shardings {kinds}, merges {[t.name for t in plan.tables if t.parts]}")
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=DIM, num_embeddings=t.rows, feature_names=[t.name],
                                                            pooling=PoolingType.SUM) for t in tables], device=torch.device("cpu"))
    trace = generate([t.rows for t in tables], batch * batches, POOLING, mode="zipf", seed=0)
    lengths = torch.from_numpy(trace.lengths)
    vals = torch.from_numpy(trace.indices)

    def kjt(i):
        # Samples [i*batch, (i+1)*batch) of every table, in the KJT's key-major layout.
        B = batch * batches
        sel = [(t * B + i * batch, t * B + (i + 1) * batch) for t in range(len(tables))]
        ls = torch.cat([lengths.reshape(-1)[a:b] for a, b in sel])
        vs = torch.cat([vals[int(trace.offsets[a]):int(trace.offsets[b])] for a, b in sel])
        return KeyedJaggedTensor.from_lengths_sync(keys=[t.name for t in tables], values=vs, lengths=ls)

    single = offload.nn.EmbeddingBagCollection.from_torchrec(ebc, fmt, on_overflow="saturate")
    inputs = [kjt(i) for i in range(batches)]
    want = [single(x).values() for x in inputs]

    def run(engine):
        m = offload.nn.ShardedEmbeddingBagCollection.from_torchrec(ebc, plan, engine=engine, on_overflow="saturate")
        try:
            m(inputs[0])  # warm: first-call compiles
            times, mism = [], 0
            for x, w in zip(inputs, want):
                t0 = time.perf_counter()
                y = m(x).values()
                times.append(time.perf_counter() - t0)
                mism += int((y.numpy().view(np.int32) != w.numpy().view(np.int32)).sum())
            return statistics.median(times), mism
        finally:
            m.close()

    t_single = statistics.median([_timed(single, x) for x in inputs])
    t_local, m_local = run("local")
    print(f"batch {batch}: one device {t_single * 1e3:.1f} ms; sharded local {t_local * 1e3:.1f} ms, {m_local} mismatches of "
          f"{sum(w.numel() for w in want)}")
    if use_ray:
        import ray
        from ray.cluster_utils import Cluster

        res = offload.plan.engine.card_resource("u55c")
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {res: 2}})
        c.add_node(num_cpus=1, resources={res: 2})
        ray.init(address=c.address, include_dashboard=False, logging_level="error", configure_logging=False)
        try:
            t_ray, m_ray = run("ray")
        finally:
            ray.shutdown()
            c.shutdown()
        print(f"sharded Ray (2 nodes, 4 actors) {t_ray * 1e3:.1f} ms, {m_ray} mismatches; Ray adds {(t_ray - t_local) * 1e3:.1f} ms a batch "
              f"over local")


@dataclasses.dataclass(frozen=True)
class TorchrecPlan:
    """TorchRec's plan for some tables: ``sharding_plan`` as ``EmbeddingShardingPlanner.plan``
    returned it, ``tables`` per table (sharding type, compute kernel, ranks, its storage estimate in
    HBM and in host DDR bytes: DDR only for a ``quant_uvm*`` kernel), ``rank_bytes``, ``rank_ddr``
    and ``rank_ms`` (its storage and perf estimates summed per rank; the largest ``rank_ms`` is the
    rating its ``NoopPerfModel`` minimised) and ``seconds`` to plan."""

    sharding_plan: object
    tables: dict
    rank_bytes: dict
    rank_ddr: dict
    rank_ms: dict
    seconds: float

    @property
    def ranks_used(self) -> list:
        return sorted(r for r, b in self.rank_bytes.items() if b > 0)


def torchrec_plan(tables, data_type: str, *, gpus: int = 8, gpu_gb: float = 80, batch: int = 512,
                  hbm_only: bool = False) -> TorchrecPlan:
    """Plan ``tables`` (``offload.plan.Table``s: name, rows, dim, pooling factor) with TorchRec's
    ``EmbeddingShardingPlanner`` for inference on ``gpus`` GPUs of ``gpu_gb`` GiB in ``data_type``
    (a ``torchrec`` ``DataType`` name: "FP32", "INT8"); ``hbm_only`` allows only the ``quant``
    kernel (no UVM caching from host memory). Needs no GPU and no process group.

    Example::

        tr = torchrec_plan(dlrm_tables("int8_rowwise"), "INT8")
        tr.tables["t20"]  # ('row_wise', 'quant', [0, 1, ..., 7], 5927995392)
    """
    import torch
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import KernelConfig, Stats, TopologyFactory, TrainerConfig
    from torchrec.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder
    from torchrec.modules.embedding_configs import DataType
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

    class _Kept(Stats):
        # The planner hands its chosen ShardingOptions (with per-shard rank, storage and perf) only to
        # its Stats; keeping them here is the public way to read its estimates.
        best_plan: list = []

        def log(self, sharding_plan, topology, batch_size, storage_reservation, num_proposals, num_plans, run_time,
                best_plan, *args, **kwargs):
            self.best_plan = list(best_plan)

    dt = DataType[data_type]
    ebc = QuantEmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name], data_type=dt)
                for t in tables], is_weighted=False, device=torch.device("meta"))
    topo = TopologyFactory.create_topology(
        TrainerConfig(world_size=gpus, local_world_size=gpus, hbm_cap_bytes=int(gpu_gb * 2**30)), kernel_config=KernelConfig(compute_device="cuda"))
    kernels = [EmbeddingComputeKernel.QUANT.value] if hbm_only else None
    cons = {t.name: ParameterConstraints(pooling_factors=[float(t.pooling_factor)], compute_kernels=kernels) for t in tables}
    kept = _Kept()
    planner = EmbeddingShardingPlanner(
        topology=topo, batch_size=batch, constraints=cons,
        enumerator=EmbeddingEnumerator(topology=topo, batch_size=batch, constraints=cons, estimator=[
            EmbeddingPerfEstimator(topology=topo, constraints=cons, is_inference=True),
            EmbeddingStorageEstimator(topology=topo, constraints=cons)]),
        storage_reservation=FixedPercentageStorageReservation(percentage=0.0), stats=[kept], debug=False)
    t0 = time.perf_counter()
    sp = planner.plan(ebc, [QuantEmbeddingBagCollectionSharder()])
    dt_s = time.perf_counter() - t0
    rank_bytes = {r: 0 for r in range(gpus)}
    rank_ddr = {r: 0 for r in range(gpus)}
    rank_ms = {r: 0.0 for r in range(gpus)}
    bytes_of = {}
    for so in kept.best_plan:
        bytes_of[so.name] = (sum(sh.storage.hbm for sh in so.shards), sum(sh.storage.ddr for sh in so.shards))
        for sh in so.shards:
            rank_bytes[sh.rank] += sh.storage.hbm
            rank_ddr[sh.rank] += sh.storage.ddr
            rank_ms[sh.rank] += sh.perf.total
    rows = {name: (ps.sharding_type, ps.compute_kernel, list(ps.ranks), *bytes_of[name])
            for params in sp.plan.values() for name, ps in params.items()}
    return TorchrecPlan(sp, rows, rank_bytes, rank_ddr, rank_ms, dt_s)


def fewest_gpus(tables, data_type: str, *, gpu_gb: float, batch: int, up_to: int, hbm_only: bool) -> TorchrecPlan:
    """TorchRec's plan on the fewest GPUs (1 to ``up_to``) it finds a plan for: its planner spreads
    over every rank it is given, so this is the device count to set beside offload's fewest cards."""
    from torchrec.distributed.planner.types import PlannerError

    for n in range(1, up_to + 1):
        try:
            return torchrec_plan(tables, data_type, gpus=n, gpu_gb=gpu_gb, batch=batch, hbm_only=hbm_only)
        except PlannerError:
            continue
    raise SystemExit(f"TorchRec finds no plan on up to {up_to} GPUs of {gpu_gb:g} GiB")


def compare_rows(plan, tr: TorchrecPlan) -> list:
    """One row per source table: name, offload's sharding (``merge:<name>`` for a Cartesian merge),
    cards and memory kinds, then TorchRec's sharding type, compute kernel and ranks."""
    out = []
    for name in sorted(tr.tables, key=lambda n: (len(n), n)):
        t = plan.table(name)
        cards = sorted({s.where for s in t.shards})
        kinds = "+".join(sorted({s.kind for s in t.shards}))
        sharding = t.sharding if not t.parts else f"merge:{t.name}"
        ts, kernel, ranks = tr.tables[name][:3]
        out.append((name, sharding, cards, kinds, ts, kernel, ranks))
    return out


def _ranks(rs) -> str:
    rs = sorted(set(rs))
    return f"{rs[0]}-{rs[-1]}" if len(rs) > 1 and rs == list(range(rs[0], rs[-1] + 1)) else ",".join(map(str, rs))


def compare_torchrec(plans, batch, gpus, gpu_gb):
    print(f"\nTorchRec {_torchrec_version()} EmbeddingShardingPlanner.plan, inference, {gpus} GPUs x {gpu_gb:g} GiB "
          f"(compute_device='cuda' cost model, planned on this CPU), batch {batch}, same rows/dim/pooling; offload: part 1's U55C plan")
    for fname in FORMATS:
        plan = plans[(fname, "u55c")]
        tr = torchrec_plan(dlrm_tables(FORMATS[fname]), TORCHREC_TYPES[fname], gpus=gpus, gpu_gb=gpu_gb, batch=batch)
        print(f"\n{fname}: offload {FORMATS[fname]} / TorchRec DataType.{TORCHREC_TYPES[fname]}")
        print(f"{'table':<5} {'rows':>9} {'pf':>4}  {'offload sharding':<18} {'cards':<12} {'memory':<11} {'TorchRec sharding':<18} {'kernel':<7} ranks")
        for (name, sh, cards, kinds, ts, kernel, ranks), t in zip(compare_rows(plan, tr), sorted(dlrm_tables(FORMATS[fname]), key=lambda t: (len(t.name), t.name))):
            cs = ",".join(f"h{h}c{c}" for h, c in cards) if len(cards) <= 2 else f"{len(cards)} cards"
            print(f"{name:<5} {t.rows:>9} {t.pooling_factor:>4g}  {sh:<18} {cs:<12} {kinds:<11} {ts:<18} {kernel:<7} {_ranks(ranks)}")
        ob = [sum(s.bytes for t in plan.tables for s in t.shards if s.where == w) for w in plan.cards]
        tb = [tr.rank_bytes[r] for r in tr.ranks_used]
        kinds_o = _counts(t.sharding if not t.parts else "merge" for t in plan.tables)
        kinds_t = _counts(v[0] for v in tr.tables.values())
        print(f"offload : {len(plan.cards)} U55C cards, GB per card max/mean {max(ob) / 1e9:.2f}/{sum(ob) / len(ob) / 1e9:.2f}, {kinds_o}, "
              f"predicted {plan.batch_s() * 1e6:.1f} us/batch (offload's model: card HBM channels, PCIe, network)")
        print(f"TorchRec: {len(tr.ranks_used)} of {gpus} GPUs, GB per GPU max/mean {max(tb) / 1e9:.2f}/{sum(tb) / len(tb) / 1e9:.2f} "
              f"(its storage estimate, lookup buffers included), {kinds_t}, planned in {tr.seconds:.2f} s; "
              f"perf estimate busiest GPU {max(tr.rank_ms.values()):.3f} ms/batch (TorchRec's model: GPU HBM, NVLink/network)")
        for hbm_only in (True, False):
            few = fewest_gpus(dlrm_tables(FORMATS[fname]), TORCHREC_TYPES[fname], gpu_gb=gpu_gb, batch=batch, up_to=gpus, hbm_only=hbm_only)
            uvm = [n for n, v in few.tables.items() if v[4] > 0]
            print(f"TorchRec, fewest {gpu_gb:g} GiB GPUs, {'HBM only' if hbm_only else 'UVM caching allowed'}: "
                  f"{len(few.rank_bytes)} GPU(s), {_counts(v[0] for v in few.tables.values())}, "
                  f"kernels {_counts(v[1] for v in few.tables.values())}"
                  + (f" ({','.join(uvm)}: {sum(few.rank_ddr.values()) / 1e9:.1f} GB in host DDR)" if uvm else "")
                  + f", perf estimate busiest GPU {max(few.rank_ms.values()):.3f} ms/batch")
    print("\ncomparable: which tables are cut and how, and how many devices hold them; not comparable: the times "
          "(different machines, each planner's own cost model) nor bytes to the byte (TorchRec adds lookup buffers; FBGEMM's "
          "INT8 row is 128 codes + 4 bytes of scale/bias padded to 16 bytes, offload's int8_rowwise 128 + 8)")


def _counts(xs) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(Counter(xs).items()))


def _torchrec_version() -> str:
    from importlib.metadata import version

    return version("torchrec")


def _timed(m, x):
    t0 = time.perf_counter()
    m(x)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--torchrec", action="store_true", help="after part 1, TorchRec's planner on the same tables (no part 2)")
    ap.add_argument("--gpus", type=int, default=8, help="--torchrec: GPUs in TorchRec's topology")
    ap.add_argument("--gpu-gb", type=float, default=80, help="--torchrec: HBM per GPU, GiB")
    a = ap.parse_args(argv)
    print(f"command: .venv/bin/python bench/bench_plan.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    plans = part1(a.batch)
    if a.torchrec:
        compare_torchrec(plans, a.batch, a.gpus, a.gpu_gb)
        return
    part2(a.scale, a.batch, a.batches, not a.no_ray)


if __name__ == "__main__":
    main()

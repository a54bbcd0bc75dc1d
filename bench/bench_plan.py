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

    .venv/bin/python bench/bench_plan.py [--scale 20000] [--batch 512] [--batches 5] [--no-ray]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14,
        40000000, 40000000, 40000000, 590152, 12973, 108, 36]
POOLING = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DIM = 128
FORMATS = {"fp32": "ap_fixed<32,16>", "int8": "int8_rowwise"}


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
    a = ap.parse_args(argv)
    print(f"command: .venv/bin/python bench/bench_plan.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    part1(a.batch)
    part2(a.scale, a.batch, a.batches, not a.no_ray)


if __name__ == "__main__":
    main()

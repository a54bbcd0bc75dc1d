"""The Ray engine on a local two-node cluster (``ray.cluster_utils.Cluster``), each node
advertising one sim card as an ``alveo_u250`` resource: one actor per card, spread over the nodes
by the placement group, bit for bit against one device. Slow: every actor is a fresh process whose
sim device compiles the fused lookup (numba) on load."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ray = pytest.importorskip("ray")
pytest.importorskip("torchrec")

import offload  # noqa: E402
from offload.plan.engine import card_resource  # noqa: E402

from test_sharded import make_ebc, make_kjt, plan_for  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {card_resource("u250"): 1}})
    c.add_node(num_cpus=1, resources={card_resource("u250"): 1})
    ray.init(address=c.address, include_dashboard=False, logging_level="error", configure_logging=False)
    yield c
    ray.shutdown()
    c.shutdown()


def test_ray_engine_equals_single_device_and_spreads_hosts(cluster):
    ebc = make_ebc(True, seed=8)
    plan = plan_for(ebc, "ap_fixed<16,6>", True, cards_per_host=1)
    assert len({h for h, _ in plan.cards}) == 2
    single = offload.nn.EmbeddingBagCollection.from_torchrec(ebc, on_overflow="saturate")
    sharded = offload.nn.ShardedEmbeddingBagCollection.from_torchrec(ebc, plan, engine="ray", on_overflow="saturate")
    try:
        nodes = {ray.get(a.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
                 for a in sharded.engine.actors.values()}
        assert len(nodes) == 2  # the two plan hosts on the two nodes
        mism = total = 0
        for seed, B in [(1, 3), (2, 40)]:
            kjt = make_kjt(True, seed, B)
            a = single(kjt).values().numpy().view(np.int32)
            b = sharded(kjt).values().numpy().view(np.int32)
            mism += int((a != b).sum())
            total += a.size
        assert total > 0 and mism == 0
    finally:
        sharded.close()

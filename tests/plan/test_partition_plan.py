"""``offload.offload(model, inputs, plan=plan)``: every TorchRec EBC becomes a sharded collection
over the plan's cards, and the model's output is the unplanned offload's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

torchrec = pytest.importorskip("torchrec")

import offload  # noqa: E402
import offload.plan as P  # noqa: E402

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402


class _Rec(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=400 * (i + 1),
                                                                     feature_names=[f"f{i}"]) for i in range(3)], device=torch.device("cpu"))

    def forward(self, kjt):
        kt = self.ebc(kjt)
        return torch.cat([kt[f"f{i}"] for i in range(3)], dim=1).sum(dim=1, keepdim=True)


def _kjt(seed, B=16):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 6, size=3 * B)
    vals = np.concatenate([rng.integers(0, 400 * (i // B + 1), size=k) for i, k in enumerate(lens)])
    return KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1", "f2"], values=torch.from_numpy(vals), lengths=torch.from_numpy(lens))


def test_offload_with_a_plan_shards_every_ebc_and_keeps_the_result():
    model = _Rec().eval()
    plan = P.shard(P.tables_of(model.ebc), P.Topology(hosts=[["u250", "u250"]], onchip_share=0.0), {"t2": {"sharding": "row_wise"}})
    assert len(plan.table("t2").shards) > 1
    plain = offload.offload(model, (_kjt(0),), ops=("embedding_bag",))
    planned = offload.offload(model, (_kjt(0),), ops=("embedding_bag",), plan=plan)
    sharded = [m for m in planned.modules() if isinstance(m, offload.nn.ShardedEmbeddingBagCollection)]
    assert len(sharded) == 1
    try:
        for seed in (1, 2):
            x = _kjt(seed)
            a, b = plain(x).detach().numpy(), planned(x).detach().numpy()
            assert (a.view(np.int32) == b.view(np.int32)).all()
    finally:
        sharded[0].close()
    with pytest.raises(TypeError, match="plan"):
        offload.offload(model, (_kjt(0),), ops=("embedding_bag",), plan={"t0": 1})

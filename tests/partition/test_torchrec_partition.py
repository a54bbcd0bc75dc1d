"""``offload.offload`` on TorchRec / FBGEMM models: the EBC's tables in one device call whatever
follows each lookup (``.float()``), functional activations and torchrec's ``MLP`` in MLP chains,
FBGEMM modules offloaded or kept with a reason, quantized EBCs never missing from the report."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

torchrec = pytest.importorskip("torchrec")

import offload  # noqa: E402
from offload.hls.cards import get_card  # noqa: E402
from offload.partition.report import untraceable  # noqa: E402

LSB = 2.0 ** -10  # ap_fixed<16,6>, truncating: each table entry within one lsb of its float


@pytest.fixture(scope="module")
def trec():
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.modules.mlp import MLP
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    return dict(EBC=EmbeddingBagCollection, Cfg=EmbeddingBagConfig, KJT=KeyedJaggedTensor, MLP=MLP, QEBC=QuantEBC,
                IntNBit=IntNBitTableBatchedEmbeddingBagsCodegen, SparseType=SparseType, Loc=EmbeddingLocation)


def _ebc(trec, n=3):
    torch.manual_seed(0)
    cfgs = [trec["Cfg"](name=f"t{i}", embedding_dim=8, num_embeddings=50 + 10 * i, feature_names=[f"f{i}"]) for i in range(n)]
    return trec["EBC"](tables=cfgs, device=torch.device("cpu"))


def _kjt(trec, n=3, B=16, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 5, size=n * B)
    vals = np.concatenate([rng.integers(0, 50 + 10 * (i // B), size=k) for i, k in enumerate(lens)])
    return trec["KJT"].from_lengths_sync(keys=[f"f{i}" for i in range(n)], values=torch.from_numpy(vals), lengths=torch.from_numpy(lens))


class _Rec(nn.Module):
    def __init__(self, trec, ebc):
        super().__init__()
        self.ebc = ebc
        self.keys = [f"f{i}" for i in range(3)]
        self.bottom = trec["MLP"](4, [8, 8])  # Perceptrons: Linear then torch.relu
        self.top = nn.Linear(32, 1)

    def forward(self, dense, kjt):
        kt = self.ebc(kjt)
        embs = [kt[k].float() for k in self.keys]
        return torch.sigmoid(self.top(torch.cat([self.bottom(dense)] + embs, dim=1)))


def test_dlrm_style_model_offloads_the_ebc_in_one_call_and_joins_functional_chains(trec):
    model = _Rec(trec, _ebc(trec)).eval()
    kjt = _kjt(trec)
    dense = torch.randn(16, 4)
    gm = offload.offload(model, (dense, kjt), device="sim")
    rows = {d.node: d for d in gm.offload_report.decisions}
    assert rows["ebc"].offloaded and rows["ebc"].kind == "ebc"
    ebc = gm.get_submodule(rows["ebc"].replacement)
    assert isinstance(ebc, offload.nn.EmbeddingBagCollection) and len(ebc.tbes) == 1  # one device call for 3 tables
    chains = {d.target: d for d in gm.offload_report.decisions if d.kind == "mlp"}
    # torchrec's MLP: Linear, torch.relu, Linear, torch.relu as one chain; top: Linear then torch.sigmoid.
    assert "bottom._mlp.0._linear,relu,bottom._mlp.1._linear,relu" in chains
    assert "top,sigmoid" in chains and all(d.offloaded for d in chains.values())
    # The offloaded pooled values: within one lsb per entry of the float EBC (ap_fixed<16,6> truncates).
    kt_off, kt_ref = ebc(kjt), model.ebc(kjt)
    lens = kjt.lengths().view(3, 16).T.repeat_interleave(8, dim=1).double()
    err = (kt_off.values().double() - kt_ref.values().detach().double()).abs()
    assert torch.all(err <= lens * LSB + (lens + 1) * 2.0 ** -24 * 8)


def test_quantized_ebc_and_fbgemm_modules_get_rows(trec):
    ebc = _ebc(trec)
    ebc.qconfig = torch.ao.quantization.QConfig(
        activation=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.float),
        weight=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.qint8))
    q = trec["QEBC"].from_float(ebc)
    int4 = trec["IntNBit"]([("t", 20, 8, trec["SparseType"].INT4, trec["Loc"].HOST)], device="cpu")
    int4.fill_random_weights()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.int4 = q, int4

        def forward(self, kjt, idx, off):
            return torch.cat([self.q(kjt).values(), self.int4(idx, off)], dim=1)

    kjt = _kjt(trec)
    idx, off = torch.randint(0, 20, (16,), dtype=torch.int32), torch.arange(17, dtype=torch.int32)
    gm = offload.offload(M(), (kjt, idx, off), device="sim")
    rows = {d.node: d for d in gm.offload_report.decisions}
    assert rows["q"].offloaded and rows["q"].kind == "ebc"
    assert not rows["int4"].offloaded and "int4" in rows["int4"].reason
    y = gm(kjt, idx, off)
    # Exact INT8 loads: each pooled value is the exact sum of FBGEMM's dequantized rows rounded once;
    # FBGEMM's float32 sums of up to 4 rows lie within gamma_7 * sum|rows| of it.
    deq = [c.double() * s.double() + b.double() for tbe in q._emb_modules for c, s, b in tbe.split_embedding_weights_with_scale_bias(2)]
    jt = kjt.to_dict()
    absum = torch.cat([torch.stack([deq[i][jt[f"f{i}"].values()[a:b]].abs().sum(0) for a, b in
                                    zip(jt[f"f{i}"].offsets()[:-1], jt[f"f{i}"].offsets()[1:])]) for i in range(3)], dim=1)
    err = (y[:, :24].double() - q(kjt).values().double()).abs()
    assert torch.all(err <= 8 * 2.0 ** -24 * absum)
    # An untraceable model holding a quantized EBC keeps it with a row, not silently.
    kept = untraceable(M(), RuntimeError("boom"), "sim", get_card("u55c"))
    names = {d.node: d for d in kept.offload_report.decisions}
    assert "q" in names and "int4" in names and "boom" in names["q"].reason


def test_fused_ebc_is_kept_with_a_reason(trec):
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    fused = FusedEmbeddingBagCollection(tables=[trec["Cfg"](name="t0", embedding_dim=8, num_embeddings=50, feature_names=["f0"])],
                                        optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}, device=torch.device("cpu"))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fused = fused

        def forward(self, kjt):
            return self.fused(kjt).values()

    kjt = _kjt(trec, n=1)
    gm = offload.offload(M(), (kjt,), device="sim")
    rows = {d.node: d for d in gm.offload_report.decisions}
    assert not rows["fused"].offloaded and "FusedEmbeddingBagCollection" in rows["fused"].reason


def test_torchrec_dlrm_example_is_the_same_model():
    from offload.examples.dlrm import DLRM, DLRMConfig, TorchRecDLRM, make_clicks, to_kjt

    torch.manual_seed(0)
    model = DLRM(DLRMConfig.small()).eval()
    data = make_clicks(model.cfg, 64, seed=1)
    trm = TorchRecDLRM(model).eval()
    with torch.no_grad():
        # Same weights and the same float32 ops in the same order (torchrec's EBC pools each feature
        # through its own nn.EmbeddingBag, as DLRM does), so the probabilities are identical.
        assert torch.equal(trm(data.dense, to_kjt(data)), model(*data.inputs))

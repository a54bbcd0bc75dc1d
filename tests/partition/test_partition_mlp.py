"""offload.offload on MLP chains: chain boundaries, calibration recording, bit-exact kernels, the risk example."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import offload
import offload.partition.replace as partition_replace


class Mixed(nn.Module):
    """An embedding bag feeding an MLP chain (BN, LeakyReLU, Dropout, Tanh) whose output is used three times."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(100, 8, mode="mean")
        self.l1, self.bn, self.act, self.drop = nn.Linear(12, 16), nn.BatchNorm1d(16), nn.LeakyReLU(0.1), nn.Dropout(0.2)
        self.l2, self.tanh = nn.Linear(16, 8), nn.Tanh()
        self.head = nn.Linear(8, 1)
        self.gelu = nn.GELU()  # no kernel: stays on the host
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def features(self, i, o, d):
        return torch.cat([self.emb(i, o), d], 1)

    def forward(self, i, o, d):
        t = self.tanh(self.l2(self.drop(self.act(self.bn(self.l1(self.features(i, o, d)))))))
        return self.head(t) + t.sum(1, keepdim=True), self.gelu(t)


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 100, (3 * n,), generator=g), torch.arange(0, 3 * n, 3), torch.randn(n, 4, generator=g)


def test_chain_boundaries_and_calibration_recording(monkeypatch):
    model = Mixed().eval()
    seen = {}
    real = partition_replace.build_mlp

    def spy(seq, calib, *a, **kw):
        seen[tuple(type(m).__name__ for m in seq)] = calib
        return real(seq, calib, *a, **kw)

    monkeypatch.setattr(partition_replace, "build_mlp", spy)
    calib = [_batch(64, 1), _batch(32, 2)]
    gm = offload.offload(model, _batch(8, 0), ops=("mlp",), calib=calib, device="sim")
    rep = gm.offload_report
    by = {d.node: d for d in rep.decisions}
    # l1..tanh stops where tanh's output has three users; head is its own one-layer chain.
    assert by["l1..tanh"].offloaded and by["head"].offloaded, rep
    assert not by["gelu"].offloaded and "GELU" in by["gelu"].reason
    assert gm.get_submodule("gelu") is model.gelu
    chain_calib = seen[("Linear", "BatchNorm1d", "LeakyReLU", "Dropout", "Linear", "Tanh")]
    with torch.no_grad():
        want = torch.cat([model.features(*b) for b in calib])
    torch.testing.assert_close(chain_calib, want, rtol=0, atol=0)  # the chain's inputs on every calib batch
    assert seen[("Linear",)].shape == (96, 8)


def test_offloaded_chain_is_the_bit_exact_kernel():
    model = Mixed().eval()
    gm = offload.offload(model, _batch(8, 0), ops=("mlp",), calib=[_batch(256, 1)], device="sim")
    mod = gm.get_submodule(gm.offload_report.decision("l1..tanh").replacement)
    with torch.no_grad():
        h = model.features(*_batch(50, 3))
        got = mod(h).double().numpy()
    np.testing.assert_array_equal(got, mod.simulate(h.double().numpy()))
    cmp = offload.compare(model, gm, _batch(50, 3))
    assert len(cmp.outputs) == 2 and {d.name for d in cmp.local} >= {"offload_l1_to_tanh", "offload_head"}
    # precision="auto" searches for the narrowest types keeping cosine >= 0.999 on the calibration
    # set (offload.quant.ptq); held-out data from the same distribution stays close to that.
    assert cmp.min_cosine > 0.99


def test_risk_model_fully_offloaded_keeps_its_auc():
    from offload.examples.risk import make_transactions, train_float_model
    from offload.quant.metrics import auc

    x, y = make_transactions(17000, seed=0)
    xtr, ytr, xte, yte = x[:12000], y[:12000], x[12000:], y[12000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny layers: extra intra-op threads only slow training on a busy machine
    try:
        model = train_float_model(xtr, ytr, epochs=15, seed=0)
    finally:
        torch.set_num_threads(threads)
    xt = torch.from_numpy(xte)
    gm = offload.offload(model, (xt[:64],), ops=("mlp",), calib=[torch.from_numpy(xtr[:2000])], device="sim")
    rep = gm.offload_report
    assert len(rep.decisions) == 1 and rep.decisions[0].offloaded, rep  # the whole Sequential is one chain
    with torch.no_grad():
        s_float = model(xt).numpy().ravel()
        s_off = gm(xt).numpy().ravel()
    # The same kernel the service builds: offload.offload passes the chain and calibration unchanged.
    ref = offload.nn.MLP.from_float(model, calib=xtr[:2000], precision="auto")
    np.testing.assert_array_equal(s_off, ref.simulate(xte.astype(np.float64)).ravel().astype(np.float32))
    auc_f, auc_q = auc(yte, s_float), auc(yte, s_off)
    assert auc_f > 0.7  # the model learned the propensity (the generator's noise caps AUC near 0.76)
    # Acceptance criterion of the risk example: quantization costs at most 0.01 AUC.
    assert auc_q >= auc_f - 0.01, (auc_f, auc_q)

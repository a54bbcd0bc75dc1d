"""TorchRec users: ``offload.nn.EmbeddingBagCollection`` against torchrec 1.8's own
``EmbeddingBagCollection`` and its quantized form on the same KeyedJaggedTensor.

Tables and weights are dyadic and held exactly by ``ap_fixed<16,6>`` / the default ``weight_type``,
so offload's bags are exact up to one float32 rounding (plus half an accumulator lsb for mean);
torchrec pools in float32 (``torch.nn.EmbeddingBag``, FBGEMM for the quantized module), within
``gamma_(n+3) * sum|terms|`` of the exact value (see test_fbgemm_compat.py for the derivation).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

torchrec = pytest.importorskip("torchrec")

import offload  # noqa: E402
from offload.sim.errors import InputError  # noqa: E402

U = 2.0 ** -24


@pytest.fixture(scope="module")
def trec():
    """One import of torchrec's pieces for the module (its import is slow)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor, PoolingType
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    return EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor, PoolingType, QuantEBC


def _ebc(trec, weighted: bool, seed: int, mean: bool = True):
    EBC, Cfg, _, _, Pool, _ = trec
    m = Pool.MEAN if mean else Pool.SUM
    tables = [
        Cfg(name="user", embedding_dim=8, num_embeddings=30, feature_names=["u_id", "u_hist"], pooling=m),
        Cfg(name="item", embedding_dim=4, num_embeddings=20, feature_names=["i_id"], pooling=Pool.SUM),
        Cfg(name="ctx", embedding_dim=4, num_embeddings=10, feature_names=["c"], pooling=m),
    ]
    ebc = EBC(tables=tables, is_weighted=weighted, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in ebc.embedding_bags.values():
            b.weight.copy_(torch.randint(-512, 512, tuple(b.weight.shape), generator=g) / 256.0)
    return ebc


def _kjt(trec, weighted: bool, seed: int, B: int = 5):
    KJT = trec[2]
    rng = np.random.default_rng(seed)
    keys = ["c", "i_id", "u_hist", "u_id"]  # not the EBC's order
    rows = {"c": 10, "i_id": 20, "u_hist": 30, "u_id": 30}
    lens = rng.integers(0, 7, size=len(keys) * B)
    lens[0] = 0
    vals = np.concatenate([rng.integers(0, rows[keys[i // B]], size=n) for i, n in enumerate(lens)])
    w = torch.from_numpy(rng.integers(-256, 256, size=vals.shape[0]) / 128.0).float() if weighted else None
    return KJT.from_lengths_sync(keys=keys, values=torch.from_numpy(vals), lengths=torch.from_numpy(lens), weights=w)


def _exact(ebc, kjt, weighted):
    """Float64 values and sum|terms| per column, in the EBC's key order."""
    jt = kjt.to_dict()
    ys, abss = [], []
    for cfg in ebc.embedding_bag_configs():
        W = ebc.embedding_bags[cfg.name].weight.detach().double().numpy()
        for f in cfg.feature_names:
            v, off = jt[f].values().numpy(), jt[f].offsets().numpy()
            wt = jt[f].weights().double().numpy() if weighted else np.ones(v.shape[0])
            y = np.zeros((len(off) - 1, cfg.embedding_dim))
            a = np.zeros_like(y)
            for b in range(len(off) - 1):
                terms = W[v[off[b]:off[b + 1]]] * wt[off[b]:off[b + 1], None]
                if terms.shape[0]:
                    y[b] = terms.sum(0) / (terms.shape[0] if cfg.pooling.name == "MEAN" else 1)
                    a[b] = np.abs(terms).sum(0)
            ys.append(y)
            abss.append(a)
    return np.concatenate(ys, 1), np.concatenate(abss, 1)


@pytest.mark.parametrize("weighted", [False, True])
def test_ebc_matches_torchrec_keys_layout_and_values(trec, weighted):
    KeyedTensor = trec[3]
    # torch.nn.EmbeddingBag (so torchrec's float EBC) weights sum bags only.
    ebc = _ebc(trec, weighted, seed=1, mean=not weighted)
    kjt = _kjt(trec, weighted, seed=2)
    m = offload.nn.EmbeddingBagCollection.from_torchrec(ebc, fmt="ap_fixed<16,6>")
    # The shared "user" table is stored once, in one kernel with ctx (same pooling), item in another
    # unless all pool alike.
    mean = [t for t in m.tbes if t.mode == ("sum" if weighted else "mean")][0]
    assert [ts.name for ts in mean.spec.tables][0] == "user" and mean.spec.feature_table_map[:2] == (0, 0)
    assert len(mean.spec.tables) == len(mean.spec.feature_table_map) - 1
    ref = ebc(kjt)
    out = m(kjt)
    assert isinstance(out, KeyedTensor)
    assert out.keys() == ref.keys() and out.length_per_key() == ref.length_per_key()
    assert out.values().dtype == ref.values().dtype and out.values().shape == ref.values().shape
    exact, absum = _exact(ebc, kjt, weighted)
    tol_off = U * np.abs(exact) + 2.0 ** -(int(mean.spec.out_type.F) + 1)
    y = out.values().numpy().astype(np.float64)
    y_ref = ref.values().detach().numpy().astype(np.float64)
    assert np.all(np.abs(y - exact) <= tol_off)
    assert np.all(np.abs(y_ref - exact) <= (6 + 3) * U / (1 - 9 * U) * absum)
    for k in ref.keys():  # per-key views agree with torchrec's
        assert np.all(np.abs(out[k].numpy() - ref[k].detach().numpy()) <= np.abs(y - y_ref).max())


def test_quantized_ebc_matches_torchrec(trec):
    QuantEBC = trec[5]
    ebc = _ebc(trec, False, seed=3)
    ebc.qconfig = torch.ao.quantization.QConfig(
        activation=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.float),
        weight=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.qint8))
    q = QuantEBC.from_float(ebc)
    m = offload.nn.EmbeddingBagCollection.from_torchrec(q)
    kjt = _kjt(trec, False, seed=4)
    ref, out = q(kjt), m(kjt)
    assert out.keys() == ref.keys() and out.length_per_key() == ref.length_per_key()
    # Exact row-wise loads: offload's bag is the exact sum of FBGEMM's dequantized rows, rounded once.
    deq = {}
    for tbe in q._emb_modules:
        for (name, *_), (c, s, b) in zip(tbe.embedding_specs, tbe.split_embedding_weights_with_scale_bias(2)):
            deq[name] = c.double().numpy() * s.double().numpy() + b.double().numpy()
    float_ebc = _ebc(trec, False, seed=3)
    with torch.no_grad():
        for name, b in float_ebc.embedding_bags.items():
            b.weight.copy_(torch.from_numpy(deq[name]))  # dyadic, exact in float64 sums
    exact, absum = _exact(float_ebc, kjt, False)
    order = [ebc._embedding_names.index(k) for k in ref.keys()]
    cols = np.cumsum([0] + [8, 8, 4, 4])
    exact = np.concatenate([exact[:, cols[i]:cols[i + 1]] for i in order], 1)
    absum = np.concatenate([absum[:, cols[i]:cols[i + 1]] for i in order], 1)
    y = out.values().numpy().astype(np.float64)
    y_ref = ref.values().numpy().astype(np.float64)
    half = max(2.0 ** -(int(t.spec.out_type.F) + 1) for t in m.tbes)
    assert np.all(np.abs(y - exact) <= U * np.abs(exact) + half)
    assert np.all(np.abs(y_ref - exact) <= 9 * U / (1 - 9 * U) * absum)


def test_ebc_refuses_missing_features_and_unweighted_input(trec):
    KJT = trec[2]
    ebc = _ebc(trec, True, seed=5)
    m = offload.nn.EmbeddingBagCollection.from_torchrec(ebc)
    short = KJT.from_lengths_sync(keys=["c"], values=torch.tensor([1, 2]), lengths=torch.tensor([2]), weights=torch.ones(2))
    with pytest.raises(InputError, match="lacks"):
        m(short)
    unweighted = _kjt(trec, False, seed=6)
    with pytest.raises(InputError, match="weights"):
        m(unweighted)
    both = _ebc(trec, True, seed=7, mean=True)
    kjt = _kjt(trec, True, seed=8)
    with pytest.raises(NotImplementedError):
        both(kjt)
    with pytest.raises(NotImplementedError):
        offload.nn.EmbeddingBagCollection.from_torchrec(both)(kjt)
    with pytest.raises(TypeError, match="ebc"):
        offload.nn.EmbeddingBagCollection.from_torchrec(torch.nn.EmbeddingBag(3, 2))

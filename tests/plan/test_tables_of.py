"""``tables_of`` on each source it names: a float and a quantized torchrec collection (the format
from each config's public ``data_type``), an offload collection through its ``plan_tables`` hook,
an offload TBE through its kernels, and a refusal naming what it got."""

from __future__ import annotations

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

import offload  # noqa: E402
import offload.plan as P  # noqa: E402
from offload.sim.errors import FormatError, InputTypeError  # noqa: E402

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType  # noqa: E402
from torchrec.modules.embedding_configs import DataType  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC  # noqa: E402


def _ebc():
    cfgs = [EmbeddingBagConfig(name="user", embedding_dim=8, num_embeddings=30, feature_names=["u_id", "u_hist"], pooling=PoolingType.SUM),
            EmbeddingBagConfig(name="item", embedding_dim=4, num_embeddings=20, feature_names=["i_id"], pooling=PoolingType.MEAN)]
    return EmbeddingBagCollection(tables=cfgs, device=torch.device("cpu"))


def _shape(tables):
    return [(t.name, t.rows, t.dim, str(t.fmt), t.features) for t in tables]


def test_a_float_torchrec_collection_plans_in_the_given_format():
    want = [("user", 30, 8, "ap_fixed<8,3>", ("u_id", "u_hist")), ("item", 20, 4, "ap_fixed<8,3>", ("i_id",))]
    assert _shape(P.tables_of(_ebc(), fmt="ap_fixed<8,3>")) == want
    assert {str(t.fmt) for t in P.tables_of(_ebc())} == {"ap_fixed<16,6>"}


def test_a_quantized_torchrec_collection_plans_int8_rowwise_from_its_data_type():
    ebc = _ebc()
    ebc.qconfig = torch.ao.quantization.QConfig(activation=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.float),
                                                weight=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.qint8))
    q = QuantEBC.from_float(ebc)
    assert {c.data_type for c in q.embedding_bag_configs()} == {DataType.INT8}
    assert [(n, str(f)) for n, _, _, f, _ in _shape(P.tables_of(q, fmt="ap_fixed<8,3>"))] == [("user", "int8_rowwise"), ("item", "int8_rowwise")]


def test_a_torchrec_type_offload_cannot_plan_is_refused_naming_the_table():
    ebc = _ebc()
    ebc.embedding_bag_configs()[1].data_type = DataType.INT4
    with pytest.raises(FormatError, match="'item'.*INT4"):
        P.tables_of(ebc)


def test_offload_modules_give_their_own_tables():
    m = offload.nn.EmbeddingBagCollection.from_torchrec(_ebc(), "ap_fixed<8,3>")
    want = sorted(_shape(P.tables_of(_ebc(), fmt="ap_fixed<8,3>")))
    assert isinstance(m, P.tables.TableSource)
    assert sorted(_shape(P.tables_of(m))) == want  # features as named in the collection
    tbe = m.tbes[0]
    got = _shape(P.tables_of(tbe))  # a TBE names its features after their tables
    spec = tbe.offload_kernels()[0].spec
    assert [(n, r, d) for n, r, d, _, _ in got] == [(t.name, t.num_rows, t.dim) for t in spec.tables]


def test_anything_else_is_refused_naming_its_type():
    with pytest.raises(InputTypeError, match="Linear"):
        P.tables_of(torch.nn.Linear(2, 2))
    with pytest.raises(InputTypeError, match="int"):
        P.tables_of([P.Table("t", 4, 4), 3])

"""offload.offload / offload.compare on embedding models (sim device): graph surgery, batching, report, errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

import offload
from offload.hls.cards import CARDS

FMT = "ap_fixed<16,6>"
LSB = 2.0**-10  # ap_fixed<16,6>: 10 fractional bits


def _bound(bag_len: int) -> float:
    """Largest |offloaded - float| of one pooled value.

    Each table entry is quantized to ap_fixed<16,6> (AP_TRN by default): error < 1 LSB. A sum of
    ``bag_len`` entries (exact in the wide default accumulator) is off by < bag_len LSB; a mean by
    < 1 LSB plus at most 1 LSB of rounding to the output type. ``bag_len + 1`` LSB covers both, plus
    the float32 reference's own rounding: bag_len terms of magnitude < 8 at 2^-24 relative each.
    """
    return (bag_len + 1) * LSB + bag_len * 8 * 2.0**-24


class Toy(nn.Module):
    """Two sum bags on the inputs (batchable), a functional mean bag, an Embedding, a Conv1d."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = nn.EmbeddingBag(50, 8, mode="sum")
        self.b = nn.EmbeddingBag(70, 8, mode="sum")
        self.w = nn.Parameter(torch.randn(30, 8, generator=g))
        self.e = nn.Embedding(40, 8)
        self.conv = nn.Conv1d(1, 1, 3, padding=1)
        for m in (self.a, self.b, self.e):
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=g))

    def forward(self, ia, oa, ib, ob, ic, oc, ie):
        x = self.a(ia, oa) + self.b(ib, ob) + F.embedding_bag(ic, self.w, oc, mode="mean")
        x = x + self.e(ie).sum(1)
        return self.conv(x.unsqueeze(1)).squeeze(1)


def _bags(n_rows: int, batch: int, max_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.randint(1, max_len + 1, (batch,), generator=gen)
    idx = torch.randint(0, n_rows, (int(lens.sum()),), generator=gen)
    off = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]])
    return idx, off


def _inputs(batch: int = 16, max_len: int = 5, seed: int = 1) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (*_bags(50, batch, max_len, g), *_bags(70, batch, max_len, g), *_bags(30, batch, max_len, g),
            torch.randint(0, 40, (batch, 3), generator=g))


@pytest.fixture(scope="module")
def toy():
    model = Toy().eval()
    gm = offload.offload(model, _inputs(), fmt=FMT, device="sim")
    return model, gm


def test_report_lists_every_candidate_with_placement_and_reason(toy):
    model, gm = toy
    rep = gm.offload_report
    assert isinstance(gm, fx.GraphModule)
    by_node = {d.node: d for d in rep.decisions}
    assert set(by_node) == {"a", "b", "embedding_bag", "e", "conv"}
    for n in ("a", "b", "embedding_bag", "e"):
        assert by_node[n].offloaded, by_node[n]
    assert not by_node["conv"].offloaded and "Conv1d" in by_node["conv"].reason
    # a and b: same dim, mode and format, inputs are placeholders -> one table-batched call; the
    # functional bag is a mean (different mode) and stays a call of its own.
    assert rep.batches == [("a", "b")]
    assert by_node["a"].replacement == by_node["b"].replacement
    assert by_node["embedding_bag"].batched_with == ()
    text = str(rep)
    for n in by_node:
        assert n in text


def test_graph_keeps_other_nodes_and_modules_untouched(toy):
    model, gm = toy
    assert gm.get_submodule("conv") is model.conv  # kept, same object, same device
    targets = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    assert "a" not in targets and "b" not in targets and "e" not in targets
    assert not any(n.op == "get_attr" and n.target == "w" for n in gm.graph.nodes)  # F.embedding_bag's weight no longer read
    # the float model itself is not modified
    assert isinstance(model.a, nn.EmbeddingBag) and isinstance(model.e, nn.Embedding)


def test_offloaded_outputs_within_the_quantization_bound(toy):
    model, gm = toy
    max_len = 5
    inp = _inputs(batch=32, max_len=max_len, seed=7)
    cmp = offload.compare(model, gm, inp)
    assert len(cmp.outputs) == 1 and len(cmp.local) == 4  # a, b (batched call), functional bag, embedding
    for d in cmp.local:
        limit = _bound(1) if "offload_e" == d.name else _bound(max_len)
        assert d.max_abs_err <= limit, d
        assert d.max_abs_err > 0  # quantization is really on (random N(0,1) tables are never all on the 2^-10 grid)
    # End to end: a+b+mean+sum of 3 embeddings has error < (2*5 + 1*... ) bound per element; the
    # conv (3 taps) multiplies it by at most sum|w_conv|.
    per_elem = 2 * _bound(max_len) + _bound(max_len) + 3 * _bound(1)
    limit = per_elem * float(model.conv.weight.detach().abs().sum()) + 1e-5
    assert cmp.max_abs_err <= limit
    assert cmp.min_cosine > 0.99
    assert "node (local)" in str(cmp)


def test_compare_finds_the_broken_node():
    """Table b's values (|w| up to ~400) saturate ap_fixed<16,6> (range [-32, 32)): b must be the worst node."""
    model = Toy().eval()
    with torch.no_grad():
        model.b.weight.mul_(100.0)
    gm = offload.offload(model, _inputs(), fmt=FMT, device="sim", batch_tables=False)
    cmp = offload.compare(model, gm, _inputs(seed=3))
    worst = cmp.worst_node()
    assert worst is not None and worst.name == "offload_b"
    assert worst.max_abs_err > 10.0  # at least one saturated entry (|w| > 42 is clipped to 32) in a bag


def test_tables_whose_inputs_depend_on_each_other_are_not_batched():
    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.EmbeddingBag(20, 4, mode="sum")
            self.b = nn.EmbeddingBag(4, 4, mode="sum")

        def forward(self, i, o):
            x = self.a(i, o)
            return self.b(x.argmax(1, keepdim=True))  # b's ids come from a's output

    model = Chain().eval()
    i, o = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2])
    gm = offload.offload(model, (i, o), device="sim")
    rep = gm.offload_report
    assert rep.batches == []
    assert all(d.offloaded for d in rep.decisions)
    assert gm(i, o).shape == (2, 4)


def test_table_too_large_for_the_card_stays_on_host():
    model = Toy().eval()
    # Card memory for exactly table a (50 x 8 int16 = 800 bytes) plus 100 bytes: b must stay home.
    u55c = CARDS["u55c"]
    tiny = dataclasses.replace(u55c, hbm=dataclasses.replace(u55c.hbm, banks=1, bank_bytes=800 + 100, slr_of_bank=(0,)), ddr=None)
    gm = offload.offload(model, _inputs(), ops=("embedding_bag",), card=tiny, device="sim")
    d = gm.offload_report.decision("b")
    assert not d.offloaded and "MiB" in d.reason and "u55c" in d.reason
    assert gm.offload_report.decision("a").offloaded
    assert gm.get_submodule("b") is model.b
    assert gm.offload_report.decision("embedding_bag").offloaded is False  # 30x8 no longer fits either


def test_factory_error_is_reported_not_raised():
    model = Toy().eval()
    model.a.max_norm = 1.0  # renormalising lookups have no kernel: from_float refuses with UnsupportedError
    gm = offload.offload(model, _inputs(), ops=("embedding_bag",), device="sim")
    d = gm.offload_report.decision("a")
    assert not d.offloaded and "max_norm" in d.reason and d.reason.startswith("UnsupportedError: ")
    assert gm.offload_report.decision("b").offloaded


def test_a_format_the_kernel_refuses_keeps_tables_on_host():
    # Parsed by ap_types, refused: 'XX' is no rounding mode. The kernel library's ValueError
    # reaches partition as the factory's FormatError, so the tables are kept, not the call failed.
    gm = offload.offload(Toy().eval(), _inputs(), fmt="ap_fixed<16,6,XX>", ops=("embedding_bag",), device="sim")
    rep = gm.offload_report
    assert rep.offloaded == [] and all(d.reason.startswith("FormatError: unknown rounding mode 'XX'") for d in rep.kept[:3])
    assert any("batching ['a', 'b'] failed (FormatError" in n for n in rep.notes)


class _Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU())

    def forward(self, x):
        return self.mlp(x)


def test_values_the_kernels_cannot_hold_keep_their_candidate_on_host():
    # NaN in a table, an infinite weight, non-finite calibration rows: each factory refuses with
    # InputError (plain ValueErrors of the kernel library and sim.fixed before), so partition keeps
    # the candidate and says why.
    model = Toy().eval()
    with torch.no_grad():
        model.a.weight[3, 1] = float("nan")
    rep = offload.offload(model, _inputs(), ops=("embedding_bag",), batch_tables=False, device="sim").offload_report
    assert rep.decision("a").reason == ("InputError: offload_a: 1 non-finite table values (first weight[3, 1] = nan); "
                                        "a fixed-point table cannot hold them")
    assert rep.decision("b").offloaded
    scorer = _Scorer().eval()
    with torch.no_grad():
        scorer.mlp[0].weight[0, 0] = float("inf")
    rep = offload.offload(scorer, (torch.ones(8, 4),), device="sim").offload_report
    assert rep.decisions[0].reason == "InputError: layer '0': parameter weight has NaN or infinite values"
    rep = offload.offload(_Scorer().eval(), (torch.full((8, 4), float("nan")),), device="sim").offload_report
    assert rep.decisions[0].reason == "InputError: calib row 0 column 0 is not finite"


# Each offload.nn factory partition calls, with a model and ops that reach it.
_FACTORIES = {
    "EmbeddingBag": (lambda: (Toy().eval(), _inputs()), {"ops": ("embedding_bag",), "batch_tables": False}, "a"),
    "TableBatchedEmbeddingBags": (lambda: (Toy().eval(), _inputs()), {"ops": ("embedding_bag",)}, "a"),
    "Embedding": (lambda: (Toy().eval(), _inputs()), {"ops": ("embedding",)}, "e"),
    "MLP": (lambda: (_Scorer().eval(), (torch.randn(8, 4, generator=torch.Generator().manual_seed(0)),)), {"ops": ("mlp",)}, "mlp_0..mlp_1"),
}


def _patch_factory(monkeypatch, name: str, err: Exception) -> None:
    def from_float(cls, *args, **kwargs):
        raise err

    monkeypatch.setattr(getattr(offload.nn, name), "from_float", classmethod(from_float))


@pytest.mark.parametrize("factory", sorted(_FACTORIES))
@pytest.mark.parametrize("bug", [AttributeError("'NoneType' object has no attribute 'weight'"), KeyError("t0")], ids=["AttributeError", "KeyError"])
def test_a_bug_in_a_factory_propagates_instead_of_becoming_a_kept_row(monkeypatch, factory, bug):
    make, kw, _ = _FACTORIES[factory]
    model, inputs = make()
    _patch_factory(monkeypatch, factory, bug)
    with pytest.raises(type(bug)) as info:
        offload.offload(model, inputs, device="sim", **kw)
    assert info.value is bug


@pytest.mark.parametrize("factory", sorted(_FACTORIES))
def test_a_factory_refusal_becomes_a_kept_row_with_its_message(monkeypatch, factory):
    from offload.sim.errors import UnsupportedError

    make, kw, node = _FACTORIES[factory]
    model, inputs = make()
    _patch_factory(monkeypatch, factory, UnsupportedError("no kernel for this table\nsecond line"))
    rep = offload.offload(model, inputs, device="sim", **kw).offload_report
    if factory == "TableBatchedEmbeddingBags":  # the batch is refused: its tables go one by one
        assert rep.notes == ["batching ['a', 'b'] failed (UnsupportedError: no kernel for this table\nsecond line); offloaded one by one"]
        assert rep.decision(node).offloaded and rep.batches == []
    else:
        d = rep.decision(node)
        assert not d.offloaded and d.reason == "UnsupportedError: no kernel for this table"


def test_untraceable_model_runs_unchanged_with_reason():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(10, 4)
            self.lin = nn.Linear(4, 1)

        def forward(self, i, o):
            x = self.bag(i, o)
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                x = -x
            return self.lin(x)

    model = Branchy().eval()
    i, o = torch.tensor([1, 2, 3]), torch.tensor([0, 1])
    out = offload.offload(model, (i, o), device="sim")
    rep = out.offload_report
    assert rep.traced is False
    assert {d.node for d in rep.decisions} == {"bag", "lin"}
    assert all(not d.offloaded and "not traceable" in d.reason for d in rep.decisions)
    torch.testing.assert_close(out(i, o), model(i, o), rtol=0, atol=0)
    cmp = offload.compare(model, out, (i, o))
    assert cmp.max_abs_err == 0.0 and cmp.min_cosine == pytest.approx(1.0) and cmp.local == []


def test_bad_arguments_raise_typed_errors():
    model = Toy().eval()
    with pytest.raises(ValueError, match="ops"):
        offload.offload(model, _inputs(), ops=("conv",))
    with pytest.raises(ValueError, match="reuse_factor"):
        offload.offload(model, _inputs(), reuse_factor=0)
    with pytest.raises(TypeError, match="model"):
        offload.offload(lambda x: x, _inputs())
    with pytest.raises(ValueError, match="card"):
        offload.offload(model, _inputs(), card="u999")


def test_emu_device_gives_the_sim_result_bit_for_bit():
    """The same partitioned model on the emu device (the HLS kernel compiled with g++) and on sim:
    zero mismatches, batched tables and the functional bag included."""
    from offload.hls import csim

    model = Toy().eval()
    sim = offload.offload(model, _inputs(), ops=("embedding_bag",), device="sim")
    try:
        emu = offload.offload(model, _inputs(), ops=("embedding_bag",), device="emu")
        outs = [(emu(*inp), sim(*inp)) for inp in (_inputs(batch=24, seed=11), _inputs(batch=24, seed=12))]
    except csim.ToolchainMissing as e:  # pragma: no cover - machines without g++
        pytest.skip(str(e))
    assert emu.offload_report.batches == [("a", "b")] and len(emu.offload_report.offloaded) == 3
    for got, want in outs:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_table_called_twice_is_uploaded_once_and_shared():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.ids = nn.EmbeddingBag(60, 4, mode="sum")  # user and item ids share one table
            self.other = nn.EmbeddingBag(30, 4, mode="sum")

        def forward(self, i, o, j, p, k, q):
            return self.ids(i, o) * self.ids(j, p) + self.other(k, q)

    torch.manual_seed(0)
    model = Shared().eval()
    g = torch.Generator().manual_seed(4)
    inp = (*_bags(60, 8, 3, g), *_bags(60, 8, 3, g), *_bags(30, 8, 3, g))
    gm = offload.offload(model, inp, device="sim")
    rep = gm.offload_report
    first, second = rep.decision("ids"), rep.decision("ids_1")
    assert first.offloaded and second.offloaded and first.replacement == second.replacement
    assert "shares the offloaded table of ids" in second.reason
    assert rep.batches == []  # a shared table is not folded into a batched call (it would be stored twice)
    assert rep.card_bytes_used == (60 + 30) * 4 * 2  # int16 containers, the shared table counted once
    cmp = offload.compare(model, gm, inp)
    assert {d.name for d in cmp.nodes} == {"ids", "ids_1", "other"}
    for d in cmp.nodes:
        assert d.max_abs_err <= _bound(3)
    # |ab - a'b'| <= |a||db| + |b||da| + |da||db| with |a|, |b| <= 3 max|w| (bags of up to 3 rows),
    # |da|, |db| <= bound(3); plus `other`'s own bound(3) and float32 rounding of products < 150 (150 * 2^-24 < 1e-5).
    big, e = 3 * float(model.ids.weight.detach().abs().max()), _bound(3)
    assert cmp.max_abs_err <= 2 * big * e + e * e + e + 1e-5


def test_partitioned_model_saves_as_one_bundle(toy, tmp_path):
    model, gm = toy
    path = offload.save(gm, tmp_path / "toy_bundle", name="toy")
    b = offload.load(path)
    # a+b in one table-batched kernel, the functional bag, the embedding: three kernels, named after
    # the graph's offload modules; the batched one holds both tables.
    assert sorted(b.kernels) == sorted({d.replacement for d in gm.offload_report.offloaded})
    assert b.kernels["offload_tables_0"].spec.num_tables == 2


def test_a_precision_naming_another_chains_layer_keeps_this_chain_on_host():
    # precision={layer: ...} names a layer of one chain; a chain without it is refused with a typed
    # error (InputKeyError, still a KeyError) and kept on host, while the chain that has it goes.
    class TwoChains(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
            self.gelu = torch.nn.GELU()
            self.b = torch.nn.Sequential(torch.nn.Linear(3, 2))

        def forward(self, x):
            return self.b(self.gelu(self.a(x)))

    torch.manual_seed(0)
    model = TwoChains().eval()
    x = torch.randn(32, 4)
    first = offload.nn.MLP.layer_names(torch.nn.Sequential(model.a[0], model.a[1]))[1]  # "relu1": chain a only
    with pytest.raises(KeyError):
        offload.nn.MLP.from_float(torch.nn.Sequential(model.b[0]), calib=x[:, :3], precision={first: "ap_fixed<16,6>"})
    gm = offload.offload(model, (x,), ops=("mlp",), calib=[(x,)], precision={first: "ap_fixed<16,6>"}, device="sim")
    rep = gm.offload_report
    kept = [d for d in rep.decisions if d.kind == "mlp" and not d.offloaded]
    done = [d for d in rep.decisions if d.kind == "mlp" and d.offloaded]
    assert len(done) == 1 and len(kept) == 1 and "InputKeyError" in kept[0].reason and "unknown keys" in kept[0].reason, rep

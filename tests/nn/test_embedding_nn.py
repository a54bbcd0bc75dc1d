"""offload.nn.EmbeddingBag / Embedding / TableBatchedEmbeddingBags against torch's float modules,
within error bounds derived from the formats and bag sizes, and the torch.library op properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import offload
from offload.ops.resident import get_resident
from offload.sim.fixed import FixedType

U32 = 2.0 ** -24  # float32 unit roundoff

FORMATS = ["ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "ap_fixed<16,6>", "int8_rowwise"]


def _elem_err(m) -> np.ndarray:
    """Per-row bound on one stored element's error: lsb/2 (rounding modes) or lsb (truncation);
    int8_rowwise: scale/2 (from_float puts every element inside [bias, bias + 255*scale])."""
    k = m.offload_kernels()[0]
    out = []
    for t, ts in enumerate(k.spec.tables):
        if ts.rowwise:
            pt = FixedType.parse(ts.param_type)
            out.append(pt.to_float(k.tensors[f"params{t}"][:, 0].astype(np.int64)) / 2)
        else:
            ft = FixedType.parse(ts.fmt)
            out.append(np.full(ts.num_rows, ft.lsb if ft.rounding in ("AP_TRN", "AP_TRN_ZERO") else ft.lsb / 2))
    return out


def _bags(input, offsets, include_last, psw):
    """(indices, weights) per bag, as torch defines them."""
    if input.dim() == 2:
        return [(input[b].numpy(), None if psw is None else psw[b].double().numpy()) for b in range(input.shape[0])]
    off = offsets.tolist() + ([] if include_last else [input.shape[0]])
    return [(input[a:b].numpy(), None if psw is None else psw[a:b].double().numpy()) for a, b in zip(off[:-1], off[1:])]


def _bound(m, bag, input, offsets, psw):
    """Per-bag, per-column bound on |offload - torch|.

    sum:  sum_k |w_k| de_k + |e_k| dw + de_k dw   (dw = lsb_w/2: weights quantized with RND_CONV;
          acc_t keeps products exact by default, so no per-term rounding)
    mean: mean_k de_k + lsb_acc/2                 (round_div's rounding)
    max:  max_k de_k                              (max is 1-Lipschitz in the sup norm)
    plus torch's own float32 summation (n+2) u sum|w e| and the float32 output rounding u|y|.
    """
    err = _elem_err(m)[0]
    acc, out_t, wt = m.spec.acc_type, m.spec.out_type, m.spec.weight_type
    W = bag.weight.detach().double().numpy()
    pad = bag.padding_idx
    dw = wt.lsb / 2
    rows = []
    for ii, ww in _bags(input, offsets, bag.include_last_offset, psw):
        keep = ii != pad if pad is not None else np.ones(len(ii), bool)
        ii = ii[keep]
        if ii.size == 0:
            rows.append(np.zeros(W.shape[1]))
            continue
        ww = np.ones(len(ii)) if ww is None else ww[keep]
        e = W[ii]
        de = err[ii][:, None]
        if bag.mode == "sum":
            b = (np.abs(ww)[:, None] * de + np.abs(e) * (dw if psw is not None else 0) + de * (dw if psw is not None else 0)).sum(0)
        elif bag.mode == "mean":
            b = np.full(W.shape[1], de.mean() + acc.lsb / 2)
        else:
            b = np.full(W.shape[1], de.max())
        f32 = (len(ii) + 2) * U32 * (np.abs(ww)[:, None] * np.abs(e)).sum(0) + U32 * np.abs(e).max(0) * np.abs(ww).max()
        rows.append(b + f32)
    return torch.from_numpy(np.stack(rows))


def _check(m, bag, input, offsets=None, psw=None):
    got = m(input, offsets, psw)
    want = bag(input, offsets, per_sample_weights=psw).detach()
    assert got.dtype == torch.float32 and got.shape == want.shape
    bound = _bound(m, bag, input, offsets, psw)
    diff = (got.double() - want.double()).abs()
    assert bool((diff <= bound + 1e-12).all()), f"max excess {float((diff - bound).max())}"
    return got


def _torch_bag(mode, padding_idx, include_last, rows=97, dim=12, seed=0):
    torch.manual_seed(seed)
    bag = torch.nn.EmbeddingBag(rows, dim, mode=mode, padding_idx=padding_idx, include_last_offset=include_last)
    with torch.no_grad():
        bag.weight.mul_(2.0)
        if padding_idx is not None:
            bag.weight[padding_idx] = 0.0  # torch keeps the padding row at zero
    return bag


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch_every_option(fmt, mode):
    g = torch.Generator().manual_seed(1)
    for padding_idx in (None, 5):
        for include_last in (False, True):
            bag = _torch_bag(mode, padding_idx, include_last)
            m = offload.nn.EmbeddingBag.from_float(bag, fmt=fmt, max_bag_size=40)
            idx = torch.randint(0, 97, (120,), generator=g)
            idx[::7] = 5          # padding entries (ordinary rows when padding_idx is None)
            idx[1::11] = 0        # both table ends
            idx[2::13] = 96
            cuts = [0, 0, 3, 3, 40, 41, 80, 100, 100]  # empty bags (first, middle), a 37-entry bag
            offsets = torch.tensor(cuts + ([120] if include_last else []))
            psw = torch.rand(120, generator=g) * 4 - 2 if mode == "sum" else None
            for w in ([None, psw] if mode == "sum" else [None]):
                y = _check(m, bag, idx, offsets, w)
                if not include_last:
                    assert bool((y[0] == 0).all()) and bool((y[2] == 0).all())  # empty bags give zeros
            # 2-D fixed-length input, one bag per row, in int32 this time.
            x2 = torch.randint(0, 97, (6, 9), generator=g, dtype=torch.int32)
            x2[0] = 5  # a bag made only of padding (when padding is on)
            for w in ([None, torch.rand(6, 9, generator=g)] if mode == "sum" else [None]):
                _check(m, bag, x2, None, w)


def test_embedding_plain_lookup_and_dtypes():
    torch.manual_seed(3)
    emb = torch.nn.Embedding(50, 8)
    for fmt in FORMATS:
        m = offload.nn.Embedding.from_float(emb, fmt=fmt)
        x = torch.randint(0, 50, (4, 3, 5))
        x[0, 0, 0], x[0, 0, 1] = 0, 49
        y = m(x)
        assert y.shape == (4, 3, 5, 8)
        err = torch.from_numpy(_elem_err(m)[0])[x][..., None]
        # one element: its quantization error, plus float32 output rounding.
        assert bool(((y.double() - emb(x).detach().double()).abs() <= err + U32 * emb(x).detach().abs()).all())
    m16 = offload.nn.Embedding.from_float(emb, fmt="ap_fixed<16,6>", dtype=torch.float16)
    assert m16(x).dtype == torch.float16
    bf = offload.nn.Embedding.from_float(emb, fmt="ap_fixed<16,6>", dtype=torch.bfloat16)
    ref = offload.nn.Embedding.from_float(emb, fmt="ap_fixed<16,6>")
    assert torch.equal(bf(x), ref(x).to(torch.bfloat16))


def test_table_batched_matches_per_table_bags():
    torch.manual_seed(4)
    bags = [torch.nn.EmbeddingBag(30 + 10 * t, 4 + t, mode="sum", padding_idx=(2 if t == 1 else None)) for t in range(3)]
    tbe = offload.nn.TableBatchedEmbeddingBags.from_float(bags, fmt=["ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "int8_rowwise", "ap_fixed<12,4,AP_RND,AP_SAT>"])
    singles = [offload.nn.EmbeddingBag.from_float(b, fmt=f) for b, f in zip(bags, ["ap_fixed<16,6,AP_RND_CONV,AP_SAT>", "int8_rowwise", "ap_fixed<12,4,AP_RND,AP_SAT>"])]
    B = 5
    g = torch.Generator().manual_seed(9)
    idx_t, off_t, psw_t = [], [0], []
    for t in range(3):
        lens = torch.randint(0, 6, (B,), generator=g)
        idx = torch.randint(0, 30 + 10 * t, (int(lens.sum()),), generator=g)
        idx_t.append(idx)
        psw_t.append(torch.rand(idx.shape[0], generator=g))
        for n in lens.tolist():
            off_t.append(off_t[-1] + n)
    indices, offsets, psw = torch.cat(idx_t), torch.tensor(off_t), torch.cat(psw_t)
    for w in (None, psw):
        y = tbe(indices, offsets, w)
        assert y.shape == (B, 4 + 5 + 6)
        col, base = 0, 0
        for t in range(3):
            o = offsets[t * B:(t + 1) * B + 1] - offsets[t * B]
            n = int(o[-1])
            ii = indices[base:base + n]
            ww = None if w is None else w[base:base + n]
            # the T=1 kernel of the same table gives bit-identical rows
            assert torch.equal(y[:, col:col + bags[t].embedding_dim], singles[t](ii, o[:-1], ww))
            col += bags[t].embedding_dim
            base += n
    assert len(tbe.offload_kernels()) == 1 and tbe.offload_kernels()[0].spec.num_tables == 3


def test_ops_opcheck_compile_and_export():
    torch.manual_seed(5)
    bag = torch.nn.EmbeddingBag(40, 6, mode="mean")
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<16,6,AP_RND_CONV,AP_SAT>")
    idx = torch.randint(0, 40, (20,))
    off = torch.tensor([0, 4, 4, 20])
    for op in (torch.ops.offload.embedding_lookup.default, torch.ops.offload.embedding_lookup_tbe.default):
        for i, o in ((idx, off), (idx.int(), off.int())):
            torch.library.opcheck(op, (m.rid, i, o, None, torch.float32))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = m
            self.lin = torch.nn.Linear(6, 1)

        def forward(self, i, o):
            return self.lin(self.emb(i, o[:-1]))

    model = Model()
    eager = model(idx, off)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    assert torch.equal(compiled(idx, off), eager)
    ep = torch.export.export(model, (idx, off))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "offload.embedding_lookup.default" in targets
    assert torch.equal(ep.module()(idx, off), eager)


def test_resident_tables_uploaded_once_and_kernels_exposed():
    bag = torch.nn.EmbeddingBag(10, 3, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="int8_rowwise")
    res = get_resident(m.rid)
    assert res.device is offload.host.default_device()
    ks = m.offload_kernels()
    assert ks[0] is res.kernel and set(ks[0].tensors) == {"table0", "params0"}
    assert ks[0].tensors["table0"].dtype == np.uint8


def test_output_follows_input_device_meta():
    # Fake tensors (the meta path) keep the input's device and the requested dtype.
    bag = torch.nn.EmbeddingBag(10, 3)
    m = offload.nn.EmbeddingBag.from_float(bag, dtype=torch.float16)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = torch.ops.offload.embedding_lookup(m.rid, torch.empty(7, dtype=torch.int64), torch.empty(4, dtype=torch.int64), None, torch.float16)
    assert y.shape == (3, 3) and y.dtype == torch.float16


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_indices_come_back_on_cuda():
    bag = torch.nn.EmbeddingBag(10, 3)
    m = offload.nn.EmbeddingBag.from_float(bag)
    idx = torch.tensor([1, 2, 3], device="cuda")
    y = m(idx, torch.tensor([0, 1], device="cuda"))
    assert y.device.type == "cuda"
    assert torch.equal(y.cpu(), m(idx.cpu(), torch.tensor([0, 1])))


def test_float32_output_is_the_single_rounding_of_the_exact_value():
    # The op converts raw -> float32 directly; it must equal rounding the exact (float64) value once.
    from offload.ops.embedding import lookup_numpy

    torch.manual_seed(6)
    bag = torch.nn.EmbeddingBag(30, 16, mode="sum")
    with torch.no_grad():
        bag.weight.mul_(8)
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<24,8,AP_RND_CONV,AP_SAT>", max_bag_size=64)
    idx = torch.randint(0, 30, (200,))
    off = torch.arange(0, 200, 25)
    psw = torch.rand(200) * 100
    exact = lookup_numpy(m.rid, idx.numpy(), np.append(off.numpy(), 200), psw.numpy())
    assert m.spec.out_type.width > 24  # raw values need more than float32's 24-bit significand
    np.testing.assert_array_equal(m(idx, off, psw).numpy(), exact.astype(np.float32))


def test_bundle_round_trip_keeps_spec_and_results(tmp_path):
    torch.manual_seed(8)
    bags = [torch.nn.EmbeddingBag(50, 4, mode="mean", padding_idx=2), torch.nn.EmbeddingBag(30, 3, mode="mean")]
    m = offload.nn.TableBatchedEmbeddingBags.from_float(bags, fmt=["int8_rowwise", "ap_fixed<16,6>"])
    loaded = offload.load(offload.save(m, tmp_path / "b"))
    (k,) = loaded.kernels.values()
    assert k.spec == m.spec and k.spec.to_json() == m.spec.to_json()
    back = offload.nn.TableBatchedEmbeddingBags(k)
    idx, off = torch.tensor([1, 2, 3, 4, 5, 29]), torch.tensor([0, 3, 3, 5, 6])
    assert torch.equal(back(idx, off), m(idx, off))

"""What issue #13 asks of the embedding modules beyond torch's own tests: values a format cannot
hold are reported or refused (never wrapped), the module surface, and bag length as a declared
bound rather than a run-time limit (``offload.offload(max_bag_size=)`` included)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import offload
from offload.kernels.embedding import DEFAULT_MAX_BAG_SIZE
from offload.sim.errors import (
    FormatOverflowError,
    FormatOverflowWarning,
    InputError,
    OffloadError,
    UnsupportedError,
)

TOP = 32 - 2.0 ** -10  # the largest ap_fixed<16,6> value


def _bag_with(value: float) -> nn.EmbeddingBag:
    bag = nn.EmbeddingBag(3, 2, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(torch.tensor([[value, 1.0], [-3.0, 2.5], [0.5, -value]]))
    return bag


def test_table_values_outside_the_format_warn_with_count_and_worst_and_saturate():
    # 40 in ap_fixed<16,6> (AP_WRAP) used to become -24 silently.
    with pytest.warns(FormatOverflowWarning, match=r"2 of 6 values outside ap_fixed<16,6>'s range .*worst 40\.0"):
        m = offload.nn.EmbeddingBag.from_float(_bag_with(40.0), fmt="ap_fixed<16,6>")
    assert m.weight[0, 0].item() == TOP and m.weight[2, 1].item() == -32.0
    y = m(torch.tensor([0]), torch.tensor([0]))
    assert y[0, 0].item() == TOP


def test_table_values_outside_the_format_raise_when_asked():
    with pytest.raises(FormatOverflowError, match=r"2 of 6 values .*worst 40\.0") as ei:
        offload.nn.EmbeddingBag.from_float(_bag_with(40.0), fmt="ap_fixed<16,6>", on_overflow="raise")
    assert isinstance(ei.value, InputError) and isinstance(ei.value, OffloadError)
    with pytest.raises(FormatOverflowError):
        offload.nn.TableBatchedEmbeddingBags.from_float([_bag_with(1.0), _bag_with(-50.0)], on_overflow="raise")
    with pytest.raises(FormatOverflowError):
        offload.nn.Embedding.from_float(nn.Embedding.from_pretrained(torch.tensor([[100.0]])), on_overflow="raise")


def test_table_values_saturate_silently_only_when_asked():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = offload.nn.EmbeddingBag.from_float(_bag_with(40.0), fmt="ap_fixed<16,6>", on_overflow="saturate")
        # a value that rounds back into range is held: no report
        offload.nn.EmbeddingBag.from_float(_bag_with(TOP + 2.0 ** -12), fmt="ap_fixed<16,6,AP_RND>", on_overflow="raise")
    assert m.weight[0, 0].item() == TOP
    with pytest.raises(InputError, match="on_overflow"):
        offload.nn.EmbeddingBag.from_float(_bag_with(1.0), on_overflow="wrap")


def test_non_finite_tables_are_refused():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InputError, match=r"2 non-finite table values \(first weight\[0, 0\]"):
            offload.nn.EmbeddingBag.from_float(_bag_with(bad), on_overflow="saturate")


def test_per_sample_weights_outside_weight_type_are_surfaced_never_wrapped():
    bag = _bag_with(1.0)
    idx, off = torch.tensor([0, 1, 2]), torch.tensor([0])
    psw = torch.tensor([1000.0, 1.0, -500.0])  # default weight_type ap_fixed<20,8>: [-128, 128)
    top = 128 - 2.0 ** -12
    want = bag(idx, off, torch.tensor([top, 1.0, -128.0]))
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<24,8,AP_RND_CONV,AP_SAT>")
    with pytest.warns(FormatOverflowWarning, match=r"per_sample_weights: 2 of 3 values .*worst 1000\.0"):
        y = m(idx, off, psw)
    torch.testing.assert_close(y, want, atol=2.0 ** -10, rtol=0)
    strict = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<24,8,AP_RND_CONV,AP_SAT>", on_overflow="raise")
    with pytest.raises(FormatOverflowError, match="per_sample_weights"):
        strict(idx, off, psw)
    quiet = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<24,8,AP_RND_CONV,AP_SAT>", on_overflow="saturate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(quiet(idx, off, psw), y)
    with pytest.raises(InputError, match=r"per_sample_weights\[1\] = nan"):
        m(idx, off, torch.tensor([1.0, float("nan"), 1.0]))


def test_module_surface_matches_torch():
    bag = nn.EmbeddingBag(7, 3, mode="max", padding_idx=-2, include_last_offset=True).to(torch.float64)
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<32,8,AP_RND_CONV,AP_SAT>")
    for name in ("num_embeddings", "embedding_dim", "mode", "padding_idx", "include_last_offset"):
        assert getattr(m, name) == getattr(bag, name), name
    assert m.dtype == torch.float64
    w = m.weight
    before = w.clone()
    assert w.dtype == torch.float64 and w.shape == bag.weight.shape
    assert (w - bag.weight.detach()).abs().max() <= 2.0 ** -25  # half an lsb of ap_fixed<32,8>
    with pytest.raises(RuntimeError, match="inference tensor"):
        w[0, 0] = 1.0
    with pytest.raises(UnsupportedError, match="read-only"):
        m.weight = torch.zeros(7, 3)
    assert torch.equal(m.weight, before)  # nothing reached the resident table
    emb = nn.Embedding(5, 2, padding_idx=1)
    me = offload.nn.Embedding.from_float(emb)
    assert (me.num_embeddings, me.embedding_dim, me.padding_idx) == (5, 2, 1)
    assert me.weight.shape == (5, 2)


def test_rowwise_weight_is_what_the_kernel_pools():
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(20, 4, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="int8_rowwise")
    idx = torch.tensor([3, 7, 7, 19])
    assert torch.equal(m(idx, torch.tensor([0])), m.weight[idx].sum(0, keepdim=True))


def test_bags_longer_than_the_declared_bound_run_and_stay_exact():
    torch.manual_seed(1)
    bag = nn.EmbeddingBag(10, 3, mode="mean")
    m = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<16,6>", max_bag_size=4)
    idx = torch.randint(0, 10, (50,))
    y = m(idx, torch.tensor([0, 1, 45]))
    w = m.weight.double()
    want = torch.stack([w[idx[:1]].mean(0), w[idx[1:45]].mean(0), w[idx[45:]].mean(0)])
    # exact pooled sums, then one rounding to the accumulator's lsb (mean) and one to float32
    assert (y.double() - want).abs().max() <= m.spec.acc_type.lsb / 2 + 2.0 ** -24 * want.abs().max()


def test_default_max_bag_size_and_the_offload_knob():
    bag = nn.EmbeddingBag(10, 4, mode="sum")
    assert offload.nn.EmbeddingBag.from_float(bag).spec.max_bag_size == DEFAULT_MAX_BAG_SIZE

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(10, 4, mode="sum")

        def forward(self, idx, off):
            return self.bag(idx, off)

    inputs = (torch.tensor([1, 2, 3]), torch.tensor([0, 2]))
    for declared in (16, None):
        gm = offload.offload(Model().eval(), inputs, ops=("embedding_bag",), device="sim", batch_tables=False,
                             max_bag_size=declared)
        (m,) = [x for x in gm.modules() if isinstance(x, offload.nn.EmbeddingBag)]
        assert m.spec.max_bag_size == (declared or DEFAULT_MAX_BAG_SIZE)
    with pytest.raises(ValueError, match="max_bag_size"):
        offload.offload(Model().eval(), inputs, ops=("embedding_bag",), device="sim", max_bag_size=0)


def test_table_batched_errors_are_torch_types_too():
    tbe = offload.nn.TableBatchedEmbeddingBags.from_float([nn.EmbeddingBag(4, 2, mode="mean"), nn.EmbeddingBag(6, 2, mode="mean")])
    with pytest.raises(IndexError) as ei:
        tbe(torch.tensor([4, 1]), torch.tensor([0, 1, 2]))
    assert isinstance(ei.value, RuntimeError)
    # Weighted mean bags are FBGEMM's TBE semantics (test_fbgemm_compat); max bags take no weights.
    tmax = offload.nn.TableBatchedEmbeddingBags.from_float([nn.EmbeddingBag(4, 2, mode="max")])
    with pytest.raises(NotImplementedError, match="only supported with mode 'sum' or 'mean'"):
        tmax(torch.tensor([0, 1]), torch.tensor([0, 2]), torch.ones(2))
    assert tbe(torch.tensor([0, 1], dtype=torch.int16), torch.tensor([0, 1, 2], dtype=torch.uint8)).shape == (1, 4)
    assert [tuple(w.shape) for w in tbe.weights] == [(4, 2), (6, 2)]

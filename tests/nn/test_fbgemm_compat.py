"""FBGEMM users: ``TableBatchedEmbeddingBags.from_fbgemm`` / ``from_rowwise`` against the real
fbgemm-gpu-cpu 1.8.0 modules and torch's byte row-wise ops on the same data.

Tables and per-sample weights are dyadic (multiples of 2^-8, inside ``ap_fixed<16,6>`` and the
default ``weight_type``), so offload's kernel holds them exactly and float64 gives the exact bag
value. Bounds: offload's sum is exact, rounded once to float32 (``u|y|``, ``u = 2^-24``); its mean
adds half an lsb of the accumulator (``round_div``). FBGEMM computes in float32: each term and each
of the ``n`` additions and the mean's scaling rounds once, so it lies within ``gamma_(n+3) * sum|terms|``
of the exact value (Higham, Accuracy and Stability, eq. 3.4); the two bounds add.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

fbgemm_gpu = pytest.importorskip("fbgemm_gpu")

import offload  # noqa: E402
from fbgemm_gpu.split_embedding_configs import SparseType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, EmbeddingLocation, PoolingMode  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen  # noqa: E402
from offload.sim.errors import FormatError, InputError  # noqa: E402

U = 2.0 ** -24
ROWS, DIMS, FTM = [40, 25], [8, 4], [0, 1, 0]  # feature 2 shares table 0 with feature 0


def _gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _batch(rng: np.random.Generator, B: int = 6, max_len: int = 9, weighted: bool = True):
    lens = rng.integers(0, max_len + 1, size=len(FTM) * B)
    lens[0] = 0  # an empty bag
    idx = np.concatenate([rng.integers(0, ROWS[FTM[i // B]], size=n) for i, n in enumerate(lens)])
    off = np.concatenate([[0], np.cumsum(lens)])
    psw = rng.integers(-512, 512, size=idx.shape[0]) / 256.0 if weighted else None
    return idx, off, psw, B


def _exact(tables, idx, off, psw, B, mode):
    """Float64 bag values and the sum of |terms| per bag, B x sum(dims of each feature)."""
    cols, absum = [], []
    for f, t in enumerate(FTM):
        y = np.zeros((B, DIMS[t]))
        a = np.zeros((B, DIMS[t]))
        for b in range(B):
            s, e = off[f * B + b], off[f * B + b + 1]
            terms = tables[t][idx[s:e]] * (1.0 if psw is None else psw[s:e, None])
            if e > s:
                y[b] = terms.sum(0) / ((e - s) if mode == "mean" else 1)
                a[b] = np.abs(terms).sum(0)
        cols.append(y)
        absum.append(a)
    return np.concatenate(cols, 1), np.concatenate(absum, 1)


def _bag_len(off, B, dims_per_feature):
    n = np.diff(off).reshape(len(FTM), B).T  # B x F
    return np.repeat(n, dims_per_feature, axis=1)


def _split_tbe(rng, mode, bounds=BoundsCheckMode.FATAL):
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in zip(ROWS, DIMS)],
        feature_table_map=FTM, pooling_mode=mode, bounds_check_mode=bounds)
    tables = []
    with torch.no_grad():
        for w in tbe.split_embedding_weights():
            v = rng.integers(-512, 512, size=tuple(w.shape)) / 256.0
            w.copy_(torch.from_numpy(v))
            tables.append(v)
    return tbe, tables


@pytest.mark.parametrize("mode", [PoolingMode.SUM, PoolingMode.MEAN])
def test_split_tbe_matches_fbgemm_with_shared_tables_and_weights(mode):
    rng = np.random.default_rng(13 + int(mode))
    tbe, tables = _split_tbe(rng, mode)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(tbe, fmt="ap_fixed<16,6>")
    # Shared tables are stored once: two resident tables for three features.
    assert m.spec.feature_table_map == tuple(FTM)
    assert sorted(m.offload_kernels()[0].tensors) == ["table0", "table1"]
    idx, off, psw, B = _batch(rng)
    args = (torch.from_numpy(idx), torch.from_numpy(off), torch.from_numpy(psw).float())
    y_fb = tbe(*args).detach().numpy().astype(np.float64)
    y = m(*args)
    assert y.dtype == torch.float32 and tuple(y.shape) == (B, sum(DIMS[t] for t in FTM))
    exact, absum = _exact(tables, idx, off, psw, B, "mean" if mode == PoolingMode.MEAN else "sum")
    half_lsb = 2.0 ** -(int(m.spec.out_type.F) + 1) if mode == PoolingMode.MEAN else 0.0
    tol_off = U * np.abs(exact) + half_lsb
    tol_fb = _gamma(_bag_len(off, B, [DIMS[t] for t in FTM]) + 3) * absum
    y = y.numpy().astype(np.float64)
    assert np.all(np.abs(y - exact) <= tol_off)
    assert np.all(np.abs(y_fb - exact) <= tol_fb)
    assert np.all(np.abs(y - y_fb) <= tol_off + tol_fb)


def _intnbit(rng, mode=PoolingMode.SUM):
    q = IntNBitTableBatchedEmbeddingBagsCodegen(
        [(f"t{i}", r, d, SparseType.INT8, EmbeddingLocation.HOST) for i, (r, d) in enumerate(zip(ROWS, DIMS))],
        device="cpu", pooling_mode=mode, feature_table_map=FTM, output_dtype=SparseType.FP32)
    q.fill_random_weights()
    for codes, scale, bias in q.split_embedding_weights_with_scale_bias(2):
        codes.copy_(torch.from_numpy(rng.integers(0, 256, size=tuple(codes.shape), dtype=np.uint8)))
        scale.copy_(torch.from_numpy((rng.random(tuple(scale.shape)) / 50).astype(np.float16)))
        bias.copy_(torch.from_numpy((-rng.random(tuple(bias.shape)) * 2).astype(np.float16)))
    scale.zero_()  # one table of zero scales: constant rows (value = bias)
    return q


def _dequant(q):
    return [codes.double().numpy() * scale.double().numpy() + bias.double().numpy()
            for codes, scale, bias in q.split_embedding_weights_with_scale_bias(2)]


@pytest.mark.parametrize("mode", [PoolingMode.SUM, PoolingMode.MEAN])
def test_intnbit_int8_tables_load_exactly_and_match_fbgemm(mode):
    rng = np.random.default_rng(7 + int(mode))
    q = _intnbit(rng, mode)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(q)
    tables = _dequant(q)
    idx, off, _, B = _batch(rng, weighted=False)
    args = (torch.from_numpy(idx).int(), torch.from_numpy(off).int())
    y_fb = q(*args).numpy().astype(np.float64)
    y = m(*args).numpy().astype(np.float64)
    exact, absum = _exact(tables, idx, off, None, B, "mean" if mode == PoolingMode.MEAN else "sum")
    half_lsb = 2.0 ** -(int(m.spec.out_type.F) + 1) if mode == PoolingMode.MEAN else 0.0
    tol_off = U * np.abs(exact) + half_lsb
    tol_fb = _gamma(_bag_len(off, B, [DIMS[t] for t in FTM]) + 3) * absum
    assert np.all(np.abs(y - exact) <= tol_off)
    assert np.all(np.abs(y_fb - exact) <= tol_fb)


def test_single_entry_bags_dequantize_like_fbgemm():
    """code*scale+bias per element: offload exact then rounded once; FBGEMM's float32 math rounds
    the product and the sum (at most u|c*s| + u|v| away, a fused multiply-add less)."""
    rng = np.random.default_rng(3)
    q = _intnbit(rng)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(q)
    tables = _dequant(q)
    rows = [np.arange(ROWS[t]) for t in FTM]
    n = max(ROWS)
    idx = np.concatenate([np.resize(r, n) for r in rows])
    off = np.arange(idx.shape[0] + 1)
    y = m(torch.from_numpy(idx), torch.from_numpy(off)).numpy().astype(np.float64)
    y_fb = q(torch.from_numpy(idx).int(), torch.from_numpy(off).int()).numpy().astype(np.float64)
    exact = np.concatenate([tables[t][np.resize(r, n)] for t, r in zip(FTM, rows)], axis=1)
    assert np.array_equal(y, exact.astype(np.float32).astype(np.float64))
    splits = q.split_embedding_weights_with_scale_bias(2)
    cs = [c.double().numpy() * s.double().numpy() for c, s, _ in splits]
    prod = np.concatenate([cs[t][np.resize(r, n)] for t, r in zip(FTM, rows)], axis=1)
    assert np.all(np.abs(y_fb - exact) <= U * (np.abs(prod) + np.abs(exact)))


def test_fp16_front_and_fp32_end_layouts():
    rng = np.random.default_rng(5)
    q = _intnbit(rng)
    # split_scale_bias_mode=0: each table's packed rows, fp16 scale and bias in front (row alignment 1 on CPU).
    packed = [w for w, _, _ in q.split_embedding_weights_with_scale_bias(0)]
    m16 = offload.nn.TableBatchedEmbeddingBags.from_rowwise(packed, layout="fp16_front", feature_table_map=FTM)
    ref = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(q)
    idx, off, _, _ = _batch(rng, weighted=False)
    a = (torch.from_numpy(idx), torch.from_numpy(off))
    assert torch.equal(m16(*a), ref(*a))
    # torch's byte row-wise ops: fp32 scale and bias at the row end.
    w = torch.from_numpy(rng.standard_normal((60, 16)).astype(np.float32))
    p = torch.ops.quantized.embedding_bag_byte_prepack(w)
    m32 = offload.nn.TableBatchedEmbeddingBags.from_rowwise([p], layout="fp32_end")
    ii = torch.from_numpy(rng.integers(0, 60, size=40))
    oo = torch.tensor([0, 5, 5, 17, 40])
    y = m32(ii, oo).numpy().astype(np.float64)
    y_t = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(p, ii, oo[:-1], mode=0).numpy().astype(np.float64)
    pn = p.numpy()
    sb = np.ascontiguousarray(pn[:, -8:]).view("<f4").astype(np.float64)
    deq = pn[:, :-8].astype(np.float64) * sb[:, :1] + sb[:, 1:]
    for b in range(4):
        terms = deq[ii.numpy()[oo[b]:oo[b + 1]]]
        exact = terms.sum(0)
        assert np.all(np.abs(y[b] - exact) <= U * np.abs(exact))
        assert np.all(np.abs(y_t[b] - exact) <= _gamma(terms.shape[0] + 3) * np.abs(terms).sum(0))
    with pytest.raises(InputError, match="layout"):
        offload.nn.TableBatchedEmbeddingBags.from_rowwise([p], layout="fp32_front")


def test_bounds_check_warning_zeroes_like_fbgemm_and_never_edits_the_callers_tensors():
    rng = np.random.default_rng(11)
    tbe, _ = _split_tbe(rng, PoolingMode.SUM, BoundsCheckMode.WARNING)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(tbe, fmt="ap_fixed<16,6>")
    assert m.bounds_check == "warning"
    idx, off, _, B = _batch(rng, weighted=False)
    idx[[1, 4, -1]] = [ROWS[0] + 3, -2, 10**6]
    i, o = torch.from_numpy(idx), torch.from_numpy(off)
    i0, o0 = i.clone(), o.clone()
    y_fb = tbe(i.clone(), o.clone()).detach()  # FBGEMM edits its inputs in place
    with pytest.warns(RuntimeWarning, match="3 index"):
        y = m(i, o)
    assert torch.equal(i, i0) and torch.equal(o, o0)
    assert torch.allclose(y, y_fb, rtol=0, atol=float(_gamma(12) * 2 * 9 + 2 * U * 18))
    ign = offload.nn.TableBatchedEmbeddingBags(m.offload_kernels()[0], bounds_check="ignore")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(ign(i, o), y)


def test_bounds_check_fatal_raises_a_typed_index_error():
    rng = np.random.default_rng(12)
    tbe, _ = _split_tbe(rng, PoolingMode.SUM, BoundsCheckMode.FATAL)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(tbe)
    assert m.bounds_check == "fatal"
    idx, off, _, _ = _batch(rng, weighted=False)
    idx[2] = ROWS[0]
    with pytest.raises(RuntimeError):
        tbe(torch.from_numpy(idx), torch.from_numpy(off))
    with pytest.raises(IndexError, match="out of range"):
        m(torch.from_numpy(idx), torch.from_numpy(off))


def test_warning_mode_clamps_bad_offsets_like_fbgemm():
    rng = np.random.default_rng(21)
    tbe, _ = _split_tbe(rng, PoolingMode.SUM, BoundsCheckMode.WARNING)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(tbe)
    idx, off, _, _ = _batch(rng, weighted=False)
    off = off.copy()
    off[-1] += 4  # the last offset past the indices
    y_fb = tbe(torch.from_numpy(idx), torch.from_numpy(off.copy())).detach()
    with pytest.warns(RuntimeWarning, match="offsets clamped"):
        y = m(torch.from_numpy(idx), torch.from_numpy(off))
    assert torch.allclose(y, y_fb, rtol=0, atol=float(_gamma(12) * 2 * 9 + 2 * U * 18))


def test_refusals_are_typed():
    q = IntNBitTableBatchedEmbeddingBagsCodegen([("t", 10, 8, SparseType.INT4, EmbeddingLocation.HOST)], device="cpu")
    q.fill_random_weights()
    with pytest.raises(FormatError, match="int4"):
        offload.nn.TableBatchedEmbeddingBags.from_fbgemm(q)
    with pytest.raises(TypeError, match="tbe"):
        offload.nn.TableBatchedEmbeddingBags.from_fbgemm(torch.nn.EmbeddingBag(3, 2))
    none = SplitTableBatchedEmbeddingBagsCodegen([(10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)], pooling_mode=PoolingMode.NONE)
    with pytest.raises(FormatError, match="pooling_mode"):
        offload.nn.TableBatchedEmbeddingBags.from_fbgemm(none)
    tbe, _ = _split_tbe(np.random.default_rng(0), PoolingMode.SUM)
    kernel = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(tbe).offload_kernels()[0]
    with pytest.raises(InputError, match="bounds_check"):
        offload.nn.TableBatchedEmbeddingBags(kernel, bounds_check="loud")

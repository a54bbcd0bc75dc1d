"""FBGEMM's ``feature_table_map`` beyond ``[0, 1, 0]``: maps that permute the tables.

In fbgemm_gpu's TBE modules feature ``f`` looks up table ``feature_table_map[f]``; its offsets have
``F*B+1`` entries, and its result has feature ``f``'s table's dim in feature order. A map whose length
equals the table count is not the identity unless it is ``[0, 1, ...]``: ``[1, 0]`` swaps which
table each feature reads, the rows its indices are checked against and the columns it lands in.
The oracle is torch itself: ``torch.nn.functional.embedding_bag`` of each feature's bags with its
mapped table, in float64. Tables are dyadic (multiples of 2^-8 in [-2, 2), inside ``ap_fixed<16,6>``)
and bags short, so every sum is exact in float32 and the comparison is equality.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

fbgemm_gpu = pytest.importorskip("fbgemm_gpu")

import offload  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, EmbeddingLocation, PoolingMode  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen  # noqa: E402

ROWS, DIMS = [40, 25], [8, 4]  # different rows and dims: a swapped table shows in shape, bounds and values
MAPS = [[1, 0], [0, 1], [1, 0, 1]]


def _tbe(ftm: list[int], rng: np.random.Generator):
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in zip(ROWS, DIMS)],
        feature_table_map=ftm, pooling_mode=PoolingMode.SUM, bounds_check_mode=BoundsCheckMode.FATAL)
    tables = []
    with torch.no_grad():
        for w in tbe.split_embedding_weights():
            v = rng.integers(-512, 512, size=tuple(w.shape)) / 256.0
            w.copy_(torch.from_numpy(v))
            tables.append(torch.from_numpy(v))
    return tbe, tables


def _batch(ftm: list[int], rng: np.random.Generator, B: int = 5):
    """Bags of each feature over its mapped table's whole row range, the last row included."""
    lens = rng.integers(1, 7, size=len(ftm) * B)
    idx = []
    for i, n in enumerate(lens):
        rows = ROWS[ftm[i // B]]
        a = rng.integers(0, rows, size=n)
        a[0] = rows - 1 if i % 2 == 0 else 0
        idx.append(a)
    return np.concatenate(idx), np.concatenate([[0], np.cumsum(lens)]), B


def _torch_per_feature(ftm, tables, idx, off, B) -> torch.Tensor:
    cols = []
    for f, t in enumerate(ftm):
        o = torch.from_numpy(off[f * B:(f + 1) * B + 1].copy())
        i = torch.from_numpy(idx[int(o[0]):int(o[-1])].copy())
        cols.append(torch.nn.functional.embedding_bag(i, tables[t], o[:-1] - o[0], mode="sum"))
    return torch.cat(cols, dim=1)


@pytest.mark.parametrize("ftm", MAPS, ids=lambda m: "-".join(map(str, m)))
def test_each_feature_reads_its_mapped_table(ftm):
    rng = np.random.default_rng(zlib.crc32(repr(ftm).encode()))
    tbe, tables = _tbe(ftm, rng)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(tbe, fmt="ap_fixed<16,6>", device="sim")
    idx, off, B = _batch(ftm, rng)
    got = m(torch.from_numpy(idx), torch.from_numpy(off))
    want = _torch_per_feature(ftm, tables, idx, off, B).float()
    assert tuple(got.shape) == (B, sum(DIMS[t] for t in ftm)), got.shape
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("ftm", MAPS, ids=lambda m: "-".join(map(str, m)))
def test_indices_are_bounded_by_the_mapped_tables_rows(ftm):
    """The last row of each feature's table is read; one past it is refused, as FBGEMM's FATAL mode does."""
    rng = np.random.default_rng(zlib.crc32(b"bounds" + repr(ftm).encode()))
    tbe, tables = _tbe(ftm, rng)
    m = offload.nn.TableBatchedEmbeddingBags.from_fbgemm(tbe, fmt="ap_fixed<16,6>", device="sim")
    F = len(ftm)
    off = torch.arange(F + 1, dtype=torch.int64)  # B = 1: one single-entry bag per feature
    for f in range(F):
        rows = ROWS[ftm[f]]
        last = torch.zeros(F, dtype=torch.int64)
        last[f] = rows - 1
        y = m(last, off)
        col = sum(DIMS[t] for t in ftm[:f])
        assert torch.equal(y[0, col:col + DIMS[ftm[f]]], tables[ftm[f]][rows - 1].float())
        past = last.clone()
        past[f] = rows
        with pytest.raises(IndexError):
            m(past, off)

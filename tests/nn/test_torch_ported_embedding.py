"""PyTorch's own EmbeddingBag (and Embedding forward) tests, ported case by case to
``offload.nn.EmbeddingBag`` / ``offload.nn.Embedding``.

Source: pytorch/pytorch ``test/nn/test_embedding.py`` (the stored snapshot nearest the v2.13 tag,
commit 013a59d6d3b4d2ac367f0ef146c61568ca9f8f2d); each test below names the source test it ports.
Only forward semantics are ported: offload's modules are inference-only, so gradient checks are
replaced by the documented behaviour (``backward()`` raises UnsupportedError), and CUDA-only
cases are out of scope.

Every case runs torch 2.13 and offload on the same input and compares
- the error: when torch raises, offload raises an :class:`offload.OffloadError` that is also an
  instance of torch's exception type;
- the dtype and shape of the result;
- the values, within a tolerance derived per bag from the formats and the bag (see :func:`_bound`):
  offload's quantization (tables in a fine ``ap_fixed<30,8>``, lsb 2^-22, weights in
  ``ap_fixed<32,10>``, lsb 2^-22, accumulator lsb from the spec) plus torch's own float rounding
  in the weight dtype (``(n+1) u`` times the bag's absolute sum, ``u`` the dtype's unit roundoff).

Documented refusals (checked, not skipped): ``max_norm`` (UnsupportedError at conversion), and
``include_last_offset`` calls in mode ``mean`` without ``padding_idx`` whose last offset stops
short of ``len(input)`` (torch 2.13 sums that bag to the offset but divides by the count to the end).
"""

from __future__ import annotations

import itertools
import random
import warnings
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import offload
from offload.sim.errors import OffloadError, UnsupportedError

FMT = "ap_fixed<30,8,AP_RND_CONV,AP_SAT>"
WT = "ap_fixed<32,10,AP_RND_CONV,AP_SAT>"
MAX_BAG = 64
LV = 2.0 ** -22  # table lsb
LW = 2.0 ** -22  # per-sample weight lsb
IDX = (torch.int32, torch.int64)
WDTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def convert(bag: nn.EmbeddingBag) -> offload.nn.EmbeddingBag:
    return offload.nn.EmbeddingBag.from_float(bag, fmt=FMT, weight_type=WT, max_bag_size=MAX_BAG, on_overflow="raise")


def bag_from(weight: torch.Tensor, **kw) -> nn.EmbeddingBag:
    return nn.EmbeddingBag.from_pretrained(weight.detach(), freeze=True, **kw)


def _bags(input, offsets, ilo, mode, padding_idx):
    """Each bag's positions in the flattened input, with torch's CPU semantics (2.13)."""
    if input.dim() == 2:
        n = input.shape[1]
        return [np.arange(r * n, (r + 1) * n) for r in range(input.shape[0])]
    n = input.shape[0]
    off = [int(o) for o in offsets]
    if not ilo:
        off = off + [n]
    elif off and off[-1] < n and (mode == "max" or padding_idx is not None):
        off[-1] = n  # pytorch issue 89677: the last bag runs to the end
    return [np.arange(a, b) for a, b in zip(off[:-1], off[1:])]


def _bound(m, weight, input, offsets, psw, want):
    """Largest |offload - torch| the formats and the two roundings allow, per output element."""
    w = weight.detach().double().numpy()
    flat = input.reshape(-1).long().numpy()
    p = None if psw is None else psw.detach().double().reshape(-1).numpy()
    spec = m.spec
    la = spec.acc_type.lsb
    fin = torch.finfo(want.dtype)
    u = fin.eps / 2
    rows = []
    for pos in _bags(input, offsets, m.include_last_offset, m.mode, m.padding_idx):
        keep = pos if m.padding_idx is None else pos[flat[pos] != m.padding_idx]
        e = np.abs(w[flat[keep]])  # n x D
        n = len(keep)
        if n == 0:
            rows.append(np.full(w.shape[1], fin.tiny * fin.eps))
            continue
        ws = np.ones(n) if p is None else np.abs(p[keep])
        S = (e * ws[:, None]).sum(0)
        if p is None:
            q = n * LV / 2 + n * la / 2
        else:
            q = e.sum(0) * LW / 2 + ws.sum() * LV / 2 + n * LV * LW / 4 + n * la / 2
        if m.mode == "sum":
            b, y = q + la / 2 + (n + 1) * u * S, S
        elif m.mode == "mean":
            b, y = q / n + la + (n + 2) * u * S / n, S / n
        else:
            b, y = LV / 2 + la / 2, e.max(0)
        rows.append(b + 2 * u * y + fin.tiny * fin.eps)
    return np.stack(rows) if rows else np.zeros((0, w.shape[1]))


def check(tbag, obag, *args, **kw):
    """Run torch and offload on the same call; compare error type, or dtype, shape and values."""
    try:
        want, terr = tbag(*args, **kw), None
    except Exception as e:  # noqa: BLE001 - the case is whatever torch raises
        want, terr = None, e
    try:
        got, oerr = obag(*args, **kw), None
    except OffloadError as e:
        got, oerr = None, e
    if terr is not None:
        assert oerr is not None, f"torch raised {type(terr).__name__}({terr}); offload returned {got}"
        assert isinstance(oerr, type(terr)), f"torch raised {type(terr).__name__}({terr}); offload {type(oerr).__mro__}: {oerr}"
        return None
    assert oerr is None, f"torch returned; offload raised {type(oerr).__name__}: {oerr}"
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    input = kw.get("input", args[0] if args else None)
    offsets = kw.get("offsets", args[1] if len(args) > 1 else None)
    psw = kw.get("per_sample_weights", args[2] if len(args) > 2 else None)
    bound = _bound(obag, tbag.weight, input, offsets, psw, want)
    diff = (got.detach().double() - want.detach().double()).abs().numpy()
    assert (diff <= bound).all(), f"max excess {(diff - bound).max()} (diff {diff.max()})"
    return got


def arange_table(n, d, dtype):
    return torch.arange(1, n * d + 1).view(n, d).to(dtype)


# ------------------------------------------------------------------------------ TestEmbeddingNN


def test_embedding_bag_from_pretrained():
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    t = bag_from(a)
    m = convert(t)
    assert torch.equal(m.weight, a)
    x = torch.tensor([0, 1])
    check(t, m, x, torch.arange(x.size(0)))


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_functional(padding_idx):
    torch.manual_seed(0)
    a = torch.tensor([[1, 3, 2], [0, 2, 1]])
    t = bag_from(torch.rand(4, 3), padding_idx=padding_idx)
    m = convert(t)
    check(t, m, a)
    assert torch.equal(F.embedding_bag(a, t.weight, padding_idx=padding_idx), t(a))


@pytest.mark.parametrize("padding_idx", range(-4, 4))
def test_embedding_bag_padding_idx_error(padding_idx):
    # In-range padding_idx (the out-of-range ones are torch's constructor asserts): offload keeps
    # torch's normalised index and skips the same entries.
    torch.manual_seed(1)
    a = torch.tensor([[1, 3, 2], [0, 2, 1]])
    t = nn.EmbeddingBag(4, 3, padding_idx=padding_idx)
    m = convert(t)
    assert m.padding_idx == t.padding_idx
    check(t, m, a)


def test_embeddingbag_from_pretrained():
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    t = bag_from(a)
    check(t, convert(t), torch.tensor([[0, 1]]))


def test_embeddingbag_from_pretrained_options():
    # max_norm renormalises rows during the lookup: a documented refusal.
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.double)
    t = nn.EmbeddingBag.from_pretrained(a, max_norm=2.0, norm_type=0.5, mode="max")
    with pytest.raises(UnsupportedError, match="max_norm"):
        convert(t)


@pytest.mark.parametrize("offsets", [[0, 3, 3], [0, 3, 4]])
def test_embeddingbag_include_last_offset(offsets):
    torch.manual_seed(2)
    t = nn.EmbeddingBag(100, 3, include_last_offset=True, padding_idx=61)
    m = convert(t)
    check(t, m, torch.tensor([0, 1, 2, 3]), torch.tensor(offsets))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 61])
@pytest.mark.parametrize("offsets", [[0, 2, 3], [0, 2, 5], [0, 5, 5], [0, 3], [0, 2, 6]])
def test_embeddingbag_include_last_offset_modes(mode, padding_idx, offsets):
    # The same call in every mode, with and without padding, and a last offset short of, at and
    # past the end (torch ends the last bag differently by mode and padding; past the end raises).
    torch.manual_seed(3)
    t = nn.EmbeddingBag(100, 2, include_last_offset=True, padding_idx=padding_idx, mode=mode)
    m = convert(t)
    x = torch.tensor([0, 1, 2, 3, 4])
    if mode == "mean" and padding_idx is None and len(offsets) > 1 and offsets[-1] < len(x):
        # torch sums this last bag to offsets[-1] but divides by the count to len(input): a
        # documented refusal (see offload.ops.embedding).
        with pytest.raises(UnsupportedError, match="include_last_offset"):
            m(x, torch.tensor(offsets))
        return
    check(t, m, x, torch.tensor(offsets))


# ---------------------------------------------------------------------- TestEmbeddingNNDeviceType

_NUM_WORDS = 100


def _gen_1d(num_bags, max_per_bag, include_last_offset, allpad, rng):
    indices, offsets, cur = [], [], 0
    empty_bag = rng.randint(0, num_bags - 1)
    full_bag = empty_bag
    while full_bag == empty_bag:
        full_bag = rng.randint(0, num_bags - 1)
    for bag in range(num_bags):
        offsets.append(cur)
        size = max_per_bag if bag == full_bag else 0 if bag == empty_bag else rng.randint(1, max_per_bag - 1)
        indices += [1 if allpad else rng.randint(0, _NUM_WORDS - 1) for _ in range(size)]
        cur += size
    if include_last_offset:
        offsets.append(len(indices))
    return torch.tensor(indices), torch.tensor(offsets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode, include_last_offset, allpad",
                         list(itertools.product(["max", "mean", "sum"], [False, True], [False, True])))
def test_embedding_bag_1D_padding_idx(dtype, mode, include_last_offset, allpad):
    # crc32 of the case's name, not hash(): str hashes are salted per process (PYTHONHASHSEED).
    rng = random.Random(zlib.crc32(f"{mode}-{include_last_offset}-{allpad}".encode()))
    torch.manual_seed(4)
    idx, off = _gen_1d(10, 10, include_last_offset, allpad, rng)
    # The source loops over every index as padding_idx; a handful keeps the suite fast.
    choices = sorted(set(idx.tolist()))
    for padding_idx in choices[:3] + [None]:
        rows = _NUM_WORDS if padding_idx is not None else _NUM_WORDS + 1
        t = bag_from(torch.randn(rows, 3, dtype=dtype), padding_idx=padding_idx, mode=mode,
                     include_last_offset=include_last_offset)
        check(t, convert(t), idx, off)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode, allpad, dim0", list(itertools.product(["max", "mean", "sum"], [False, True], [1, 10])))
def test_embedding_bag_2D_padding_idx(dtype, mode, allpad, dim0):
    torch.manual_seed(5)
    if allpad:
        indices = torch.ones(dim0, 10, dtype=torch.long)
    else:
        indices = torch.randint(0, 10, (dim0, 10))
        if dim0 > 1:
            indices[3] = indices[3][0]  # a row of one repeated index: fully padded below
    for padding_idx in sorted(set(indices.flatten().tolist()))[:3]:
        t = bag_from(torch.randn(10, 3, dtype=dtype), padding_idx=padding_idx, mode=mode)
        check(t, convert(t), indices)


@pytest.mark.parametrize("idx_dtype, off_dtype", list(itertools.product(IDX, IDX)))
def test_embedding_bag_empty_input(idx_dtype, off_dtype):
    t = nn.EmbeddingBag(4, 3)
    m = convert(t)
    x = torch.tensor([], dtype=idx_dtype)
    for offsets in ([0], [0, 0]):
        y = check(t, m, x, torch.tensor(offsets, dtype=off_dtype))
        assert torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("w_dtype, idx_dtype", list(itertools.product((torch.float, torch.double), IDX)))
@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_out_of_bounds_idx(w_dtype, idx_dtype, padding_idx, mode):
    torch.manual_seed(6)
    idx1 = torch.tensor([[-1, 1]], dtype=idx_dtype)
    idx2 = torch.tensor([[11, 8]], dtype=idx_dtype)
    t = bag_from(torch.randn(10, 2, dtype=w_dtype), padding_idx=padding_idx, mode=mode)
    m = convert(t)
    psws = (None, torch.randn(1, 2, dtype=w_dtype)) if mode == "sum" else (None,)
    for psw, idx in itertools.product(psws, (idx1, idx2)):
        with pytest.raises(RuntimeError):
            t(idx, per_sample_weights=psw)
        check(t, m, idx, None, psw)


def test_embedding_bag_dimension_errors():
    t = bag_from(torch.zeros(2, 6, dtype=torch.float64))
    m = convert(t)
    check(t, m, torch.full((2, 0, 0, 6, 6), 1), torch.zeros((2, 0, 0, 6, 6), dtype=torch.long))
    check(t, m, torch.full((2,), 1), torch.zeros((2, 0, 0, 6, 6), dtype=torch.long))


@pytest.mark.parametrize("idx_dtype, off_dtype", list(itertools.product(IDX, IDX)))
def test_EmbeddingBag_per_sample_weights_failures(idx_dtype, off_dtype):
    t = nn.EmbeddingBag(5, 2, mode="sum")
    m = convert(t)
    x = torch.tensor([3, 1, 1, 1, 4, 0], dtype=idx_dtype)
    off = torch.tensor([0, 0, 3, 3, 6], dtype=off_dtype)
    check(t, m, x, off, torch.randn_like(x, dtype=torch.double))  # 1: dtype differs from the table's
    check(t, m, x, off, torch.randn(5))  # 2.1: shape, 1-D
    x2 = torch.randint(5, (7, 3), dtype=idx_dtype)
    check(t, m, x2, None, torch.randn(7 * 3))  # 2.2: shape, 2-D
    for mode in ("max", "mean"):  # 3: weights outside sum
        t3 = nn.EmbeddingBag(5, 2, mode=mode)
        check(t3, convert(t3), x2, None, torch.randn(7, 3))


def _known_bag(mode, wdtype, **kw):
    t = nn.EmbeddingBag(5, 2, mode=mode, **kw).to(wdtype)
    with torch.no_grad():
        t.weight.copy_(torch.arange(1, 11).view_as(t.weight).to(wdtype))
    return t


@pytest.mark.parametrize("idx_dtype, off_dtype, wdtype", list(itertools.product(IDX, IDX, WDTYPES)))
def test_EmbeddingBag_empty_per_sample_weights_and_offsets(idx_dtype, off_dtype, wdtype):
    t = _known_bag("sum", wdtype)
    x = torch.tensor([], dtype=idx_dtype)
    y = check(t, convert(t), x, torch.tensor([0, 0, 0, 0, 0], dtype=off_dtype), torch.randn_like(x, dtype=wdtype))
    assert y.shape == (5, 2) and not y.any()


@pytest.mark.parametrize("idx_dtype, off_dtype, wdtype", list(itertools.product(IDX, IDX, WDTYPES)))
def test_EmbeddingBag_per_sample_weights_and_offsets(idx_dtype, off_dtype, wdtype):
    torch.manual_seed(7)
    t = _known_bag("sum", wdtype)
    x = torch.tensor([3, 1, 1, 1, 4, 0], dtype=idx_dtype)
    check(t, convert(t), x, torch.tensor([0, 0, 3, 3, 6], dtype=off_dtype), torch.randn_like(x, dtype=wdtype))


@pytest.mark.parametrize("idx_dtype, off_dtype, wdtype", list(itertools.product(IDX, IDX, WDTYPES)))
@pytest.mark.parametrize("mode, has_weight", [("sum", False), ("sum", True), ("max", False), ("mean", False)])
@pytest.mark.parametrize("include_last_offset", [True, False])
def test_EmbeddingBag_per_sample_weights_and_new_offsets(idx_dtype, off_dtype, wdtype, mode, has_weight, include_last_offset):
    torch.manual_seed(8)
    t = _known_bag(mode, wdtype, include_last_offset=include_last_offset)
    x = torch.tensor([3, 1, 1, 1, 4, 0], dtype=idx_dtype)
    off = torch.tensor([0, 0, 3, 3, 6] + ([6] if include_last_offset else []), dtype=off_dtype)
    psw = torch.randn_like(x, dtype=wdtype) if has_weight else None
    check(t, convert(t), x, off, psw)


def _vs_embedding(N, D, B, L, mode, wdtype, dtype, psw: bool):
    """``_test_EmbeddingBag_vs_Embedding``: constant-length bags through offsets against the torch bag."""
    t = nn.EmbeddingBag(N, D, mode=mode).to(wdtype)
    x = torch.randint(N, (B, L), dtype=dtype)
    off = torch.arange(0, B, dtype=dtype).mul_(L)
    w = torch.randn(B, L, dtype=wdtype).softmax(dim=-1).view(-1) if psw else None
    check(t, convert(t), x.view(-1), off, w)


@pytest.mark.parametrize("dtype, wdtype", list(itertools.product(IDX, (torch.float, torch.double))))
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 5, 53, 23), (101, 5, 3, 7), (2, 101, 3, 7)])
def test_EmbeddingBag_per_sample_weights_and_no_offsets(dtype, wdtype, shape):
    torch.manual_seed(9)
    _vs_embedding(*shape, "sum", wdtype, dtype, psw=True)


@pytest.mark.parametrize("idx_dtype, off_dtype, wdtype", list(itertools.product(IDX, IDX, WDTYPES)))
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_device(idx_dtype, off_dtype, wdtype, mode):
    """``_test_EmbeddingBag``'s known example, its 2-D view, all-empty bags, and the illegal input
    combinations, in every dtype combination the source runs on CPU."""
    t = _known_bag(mode, wdtype)
    m = convert(t)
    x = torch.tensor([3, 1, 1, 1, 4, 0], dtype=idx_dtype)
    off = torch.tensor([0, 0, 3, 3, 6], dtype=off_dtype)
    y = check(t, m, x, off)
    if mode == "max":
        want = torch.tensor([[0, 0], [7, 8], [0, 0], [9, 10], [0, 0]], dtype=wdtype)
    else:
        want = torch.tensor([[0, 0], [13, 16], [0, 0], [13, 16], [0, 0]], dtype=wdtype) / (1 if mode == "sum" else 3)
    if mode != "mean":  # sums and maxima of small integers are exact in every dtype
        assert torch.equal(y, want)
    check(t, m, x.view(2, -1))
    check(t, m, torch.tensor([], dtype=idx_dtype), torch.tensor([0, 0, 0, 0], dtype=off_dtype))
    # illegal combinations
    t10 = nn.EmbeddingBag(10, 20, mode=mode).to(wdtype)
    m10 = convert(t10)
    bad_in = torch.ones(3, 4, dtype=idx_dtype)
    bad_off = torch.arange(0, 3, dtype=off_dtype)
    check(t10, m10, bad_in, bad_off)
    check(t10, m10, bad_in.view(-1))
    bad_off[0] = 1
    check(t10, m10, bad_in.view(-1), bad_off)
    bad_off[0] = 0
    bad_off[-1] = 100
    check(t10, m10, bad_in.view(-1), bad_off)


@pytest.mark.parametrize("N, D, B, L", list(itertools.product([1, 2], repeat=4)))
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_device_vs_embedding_small(N, D, B, L, mode):
    # _test_EmbeddingBag's loop over itertools.product([1, 2], repeat=4) with max_norm=None; the
    # dtype combination rotates over the source's CPU dtypes (one conversion per case keeps it fast).
    k = (N * 8 + D * 4 + B * 2 + L) % 8
    torch.manual_seed(10 + k)
    _vs_embedding(N, D, B, L, mode, WDTYPES[k % 4], IDX[k // 4], psw=False)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_device_vs_embedding_random(mode):
    rng = random.Random(11)
    torch.manual_seed(11)
    N, D, B, L = rng.randint(1, 100), rng.randint(1, 100), rng.randint(1, 50), rng.randint(1, 50)
    _vs_embedding(N, D, B, L, mode, torch.float64, torch.long, psw=False)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_device_max_norm_refused(mode):
    # the same loop with max_norm=3: a documented refusal at conversion
    with pytest.raises(UnsupportedError, match="max_norm"):
        convert(nn.EmbeddingBag(2, 2, mode=mode, max_norm=3))


@pytest.mark.parametrize("idx_dtype, off_dtype, wdtype", list(itertools.product(IDX, IDX, WDTYPES)))
def test_embedding_bag_non_contiguous_weight(idx_dtype, off_dtype, wdtype):
    torch.manual_seed(12)
    weight = torch.randn(3, 4, dtype=wdtype)[:, :3]
    assert not weight.is_contiguous()
    index = torch.tensor([0, 1, 2], dtype=idx_dtype)
    offsets = torch.tensor([0, 2], dtype=off_dtype)
    for mode in ["sum", "mean", "max"]:
        t = bag_from(weight, mode=mode)
        check(t, convert(t), index, offsets)


@pytest.mark.parametrize("bag_use_grad, psw_use_grad", [(True, True), (True, False), (False, True), (False, False)])
def test_embedding_bag_per_sample_weights_grad(bag_use_grad, psw_use_grad):
    torch.manual_seed(13)
    t = nn.EmbeddingBag(256, 256, mode="sum")
    t.requires_grad_(bag_use_grad)
    m = convert(t)
    x = torch.arange(1, 5).expand(3, -1)
    w = torch.rand(3, 4, requires_grad=psw_use_grad)
    psw = F.softmax(w, dim=-1)
    check(t, m, x, per_sample_weights=psw)
    y = m(x, per_sample_weights=psw)
    # Inference-only, documented: the output carries the autograd link, and backward says why.
    assert y.requires_grad == psw_use_grad
    if psw_use_grad:
        with pytest.raises(UnsupportedError, match="inference-only"):
            y.sum().backward()


# --------------------------------------------------------------------- Embedding (forward cases)


def _check_embedding(t: nn.Embedding, x: torch.Tensor) -> torch.Tensor:
    m = offload.nn.Embedding.from_float(t, fmt=FMT, on_overflow="raise")
    want = t(x)
    got = m(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    u = torch.finfo(want.dtype).eps / 2
    bound = LV / 2 + 2 * u * want.detach().double().abs() + torch.finfo(want.dtype).tiny
    assert ((got.double() - want.detach().double()).abs() <= bound).all()
    return got


@pytest.mark.parametrize("dtype", [torch.float, torch.double])
def test_embedding_from_pretrained(dtype):
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=dtype)
    assert torch.equal(_check_embedding(nn.Embedding.from_pretrained(a), torch.LongTensor([0, 1])), a)


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_functional(padding_idx):
    torch.manual_seed(14)
    a = torch.tensor([[1, 3, 2], [0, 2, 1]])
    t = nn.Embedding.from_pretrained(torch.rand(4, 3), padding_idx=padding_idx)
    _check_embedding(t, a)


@pytest.mark.parametrize("padding_idx, x", [(0, [[0, 2, 4, 5], [4, 3, 0, 9]]), (-2, [[0, 2, 8, 5], [4, 8, 0, 9]]), (2, [0, 2])])
def test_embedding_padding_idx(padding_idx, x):
    torch.manual_seed(15)
    t = nn.Embedding(10, 20, padding_idx=padding_idx)
    if padding_idx == 2:
        with torch.no_grad():
            t.weight[2] = torch.ones(20)
    y = _check_embedding(t, torch.tensor(x))
    pad = t.padding_idx
    assert torch.equal(y[torch.tensor(x) == pad], t.weight[pad].detach().expand_as(y[torch.tensor(x) == pad]))


@pytest.mark.parametrize("idx_dtype", [torch.int16, torch.uint8, torch.int8, torch.float32])
def test_embedding_index_dtypes_as_torch(idx_dtype):
    # torch.nn.Embedding takes int32/int64 only (RuntimeError otherwise); so does offload's.
    t = nn.Embedding(5, 2)
    m = offload.nn.Embedding.from_float(t, fmt=FMT)
    x = torch.tensor([1, 2]).to(idx_dtype)
    with pytest.raises(RuntimeError) as te:
        t(x)
    with pytest.raises(OffloadError) as oe:
        m(x)
    assert isinstance(oe.value, type(te.value))


def test_embedding_out_of_range_is_index_error_as_torch():
    t = nn.Embedding(5, 2)
    m = offload.nn.Embedding.from_float(t, fmt=FMT)
    with pytest.raises(IndexError):
        t(torch.tensor([7]))
    with pytest.raises(IndexError) as oe:
        m(torch.tensor([7]))
    assert isinstance(oe.value, OffloadError) and isinstance(oe.value, RuntimeError)


# ---------------------------------------------- calls torch accepts that offload once refused (#13)


@pytest.mark.parametrize("idx_dtype", [torch.int8, torch.int16, torch.uint8, torch.int32, torch.int64, torch.float32])
@pytest.mark.parametrize("mode", ["sum", "max"])
def test_index_dtypes(idx_dtype, mode):
    torch.manual_seed(16)
    t = nn.EmbeddingBag(5, 2, mode=mode)
    m = convert(t)
    x = torch.tensor([3, 1, 1, 1, 4, 0])
    off = torch.tensor([0, 0, 3, 3])
    check(t, m, x.to(idx_dtype), off)
    check(t, m, x, off.to(idx_dtype))


@pytest.mark.parametrize("include_last_offset, offsets, n", [(False, [], 6), (False, [], 0), (True, [0], 0), (True, [], 6), (True, [6], 6)])
@pytest.mark.parametrize("wdtype", WDTYPES)
def test_zero_bags(include_last_offset, offsets, n, wdtype):
    t = nn.EmbeddingBag(5, 2, include_last_offset=include_last_offset).to(wdtype)
    m = convert(t)
    x, off = torch.tensor([3, 1, 1, 1, 4, 0][:n]), torch.tensor(offsets, dtype=torch.long)
    if not include_last_offset and n and wdtype != torch.float32:
        # No bags over a non-empty input: torch 2.13's CPU kernel returns (0, D) in float32 and
        # crashes (segmentation fault) in the other dtypes, so only offload runs here.
        y = m(x, off)
        assert y.shape == (0, 2) and y.dtype == wdtype
        return
    check(t, m, x, off)
    if not include_last_offset:  # (a 0 x 3 input with include_last_offset crashes torch too)
        check(t, m, torch.zeros((0, 3), dtype=torch.long))


@pytest.mark.parametrize("wdtype, psw_dtype", list(itertools.product(WDTYPES, WDTYPES)))
def test_per_sample_weights_every_float_dtype(wdtype, psw_dtype):
    # Same dtype: torch computes in it (bfloat16 included); a different one: torch refuses with
    # RuntimeError, offload the same way.
    torch.manual_seed(17)
    t = nn.EmbeddingBag(5, 2, mode="sum").to(wdtype)
    x = torch.tensor([3, 1, 1, 1, 4, 0])
    check(t, convert(t), x, torch.tensor([0, 2, 2]), torch.rand(6, dtype=psw_dtype))


def test_no_warning_on_fine_formats():
    # The fine formats hold every value above: no overflow warning may hide a damaged case.
    t = nn.EmbeddingBag(5, 2, mode="sum")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(t, convert(t), torch.tensor([3, 1]), torch.tensor([0]), torch.tensor([100.0, -200.0]))

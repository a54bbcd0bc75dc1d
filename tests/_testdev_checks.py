"""Checks of the offload ops on the ``testdev`` test device (tests/_testdev_backend.py), run in a child
process by tests/ops/test_ops_devices.py. Prints one JSON object {check name: null or the failure's traceback}."""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _testdev_backend as tdev  # noqa: E402  (registers the device before any op runs)

import offload  # noqa: E402

DEV = tdev.NAME


def _bag_inputs(seed: int, rows: int, n_bags: int):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 5, (n_bags,), generator=g)
    off = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    idx = torch.randint(0, rows, (int(off[-1]),), generator=g)
    psw = torch.rand(int(off[-1]), generator=g) * 4 - 2
    return idx, off, psw


def _same_on_device(y: torch.Tensor, want: torch.Tensor) -> None:
    assert y.device.type == DEV, f"result on {y.device}, the inputs were on {DEV}"
    assert y.dtype == want.dtype and tuple(y.shape) == tuple(want.shape), (y.dtype, y.shape, want.dtype, want.shape)
    got = tdev.values(y)
    assert got.dtype == want.numpy().dtype and np.array_equal(got, want.numpy()), "values differ from the CPU op"


def check_embedding_lookup_moves_inputs_to_host_and_result_back():
    torch.manual_seed(1)
    bag = torch.nn.EmbeddingBag(40, 8, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(bag)
    idx, off, psw = _bag_inputs(2, 40, 9)
    for dtype in (torch.float32, torch.float16, torch.float64):
        for w in (None, psw):
            want = torch.ops.offload.embedding_lookup(m.rid, idx, off, w, dtype)
            tdev.COPIES.clear()
            y = torch.ops.offload.embedding_lookup(m.rid, idx.to(DEV), off.to(DEV), None if w is None else w.to(DEV), dtype)
            _same_on_device(y, want)
            # Exactly: each input copied to the host once, the result copied to the device once.
            n_in = 2 if w is None else 3
            assert [c[:2] for c in tdev.COPIES] == [("cpu", DEV)] * n_in + [(DEV, "cpu")] * n_in + [("cpu", DEV)], tdev.COPIES


def check_embedding_lookup_tbe_on_device():
    torch.manual_seed(3)
    bags = [torch.nn.EmbeddingBag(30, 4, mode="sum"), torch.nn.EmbeddingBag(50, 6, mode="sum")]
    m = offload.nn.TableBatchedEmbeddingBags.from_float(bags, fmt=["ap_fixed<16,6>", "int8_rowwise"])
    B = 5
    i0, o0, _ = _bag_inputs(4, 30, B)
    i1, o1, _ = _bag_inputs(5, 50, B)
    idx = torch.cat([i0, i1])
    off = torch.cat([o0, o1[1:] + o0[-1]])
    want = torch.ops.offload.embedding_lookup_tbe(m.rid, idx, off, None, torch.float32)
    assert want.shape == (B, 10)
    y = torch.ops.offload.embedding_lookup_tbe(m.rid, idx.to(DEV), off.to(DEV), None, torch.float32)
    _same_on_device(y, want)


def check_embedding_result_follows_the_indices_device():
    bag = torch.nn.EmbeddingBag(10, 3, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(bag)
    idx, off, _ = _bag_inputs(6, 10, 4)
    want = torch.ops.offload.embedding_lookup(m.rid, idx, off, None, torch.float32)
    _same_on_device(torch.ops.offload.embedding_lookup(m.rid, idx.to(DEV), off, None, torch.float32), want)
    y = torch.ops.offload.embedding_lookup(m.rid, idx, off.to(DEV), None, torch.float32)
    assert y.device.type == "cpu" and torch.equal(y, want)


def check_embedding_bad_dtypes_on_device_are_type_errors():
    bag = torch.nn.EmbeddingBag(10, 3, mode="sum")
    m = offload.nn.EmbeddingBag.from_float(bag)
    idx, off, _ = _bag_inputs(7, 10, 3)
    cases = [
        (idx.float().to(DEV), off.to(DEV), None, "indices"),
        (idx.to(DEV), off.double().to(DEV), None, "offsets"),
        (idx.to(DEV), off.to(DEV), torch.ones(len(idx), dtype=torch.int32).to(DEV), "per_sample_weights"),
    ]
    for i, o, w, field in cases:
        tdev.COPIES.clear()
        try:
            torch.ops.offload.embedding_lookup(m.rid, i, o, w, torch.float32)
        except TypeError as e:
            assert field in str(e), e
        else:
            raise AssertionError(f"{field}: bad dtype on {DEV} was accepted")
        assert not any(c[0] == DEV for c in tdev.COPIES), "rejected input was still copied off the device"


def _mlp():
    torch.manual_seed(8)
    seq = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3)).eval()
    return offload.nn.MLP.from_float(seq, calib=np.random.default_rng(8).normal(size=(300, 6)))


def check_mlp_score_moves_x_to_host_and_result_back():
    m = _mlp()
    x = torch.randn(11, 6, generator=torch.Generator().manual_seed(9)) * 3
    for dtype in (torch.float32, torch.float64):
        want = torch.ops.offload.mlp_score(m.rid, x.to(dtype))
        tdev.COPIES.clear()
        y = torch.ops.offload.mlp_score(m.rid, x.to(dtype).to(DEV))
        _same_on_device(y, want)
        assert [c[:2] for c in tdev.COPIES] == [("cpu", DEV), (DEV, "cpu"), ("cpu", DEV)], tdev.COPIES


def check_mlp_score_bad_input_on_device_is_named():
    m = _mlp()
    for x, err, field in [(torch.zeros(4, 6, dtype=torch.int32), TypeError, "floating point"),
                          (torch.zeros(4, 5), ValueError, "[batch, 6]")]:
        try:
            torch.ops.offload.mlp_score(m.rid, x.to(DEV))
        except err as e:
            assert field in str(e), e
        else:
            raise AssertionError(f"{field}: accepted on {DEV}")


def main() -> None:
    results = {}
    for name, fn in sorted(globals().items()):
        if name.startswith("check_"):
            try:
                fn()
                results[name] = None
            except Exception:  # reported to the parent test, which fails with it
                results[name] = traceback.format_exc()
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""The ops' non-CPU branches (``.cpu()`` before the device call, ``.to(device)`` after) without a GPU.

- ``meta`` tensors: shapes and dtypes from the fake kernels, and the kernel never runs.
- torch.compile / torch.export with a dynamic batch: the ops stay one node with symbolic shapes.
- A registered test device (PrivateUse1 renamed ``testdev``, tests/_testdev_backend.py) for
  device moves: inputs copied to the host once, the result copied back to the input's device,
  values identical to the CPU op. Run in a child process because the rename cannot be undone.

Left unproven here (scripts/check_cuda.sh covers it on a GPU machine): CUDA's own copies (streams,
pinned memory, non_blocking) and anything the CUDA caching allocator does; the test device copies
synchronously through NumPy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import offload
from offload.ops.resident import get_resident

# The test device's helpers sit at the top of tests/, beside the other shared helpers.
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def testdev_results():
    proc = subprocess.run([sys.executable, os.path.join(_TESTS, "_testdev_checks.py")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_CHECKS = [
    "check_embedding_lookup_moves_inputs_to_host_and_result_back",
    "check_embedding_lookup_tbe_on_device",
    "check_embedding_result_follows_the_indices_device",
    "check_embedding_bad_dtypes_on_device_are_type_errors",
    "check_mlp_score_moves_x_to_host_and_result_back",
    "check_mlp_score_bad_input_on_device_is_named",
]


def test_every_device_check_is_listed(testdev_results):
    assert sorted(testdev_results) == sorted(_CHECKS)


@pytest.mark.parametrize("name", _CHECKS)
def test_on_registered_test_device(testdev_results, name):
    failure = testdev_results[name]
    assert failure is None, failure


@pytest.fixture
def embedding_bag():
    torch.manual_seed(0)
    return offload.nn.EmbeddingBag.from_float(torch.nn.EmbeddingBag(20, 5, mode="sum"), dtype=torch.float16)


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    return offload.nn.MLP.from_float(seq, calib=np.random.default_rng(0).normal(size=(200, 6)))


def _no_run(monkeypatch, rid):
    """A meta call must never reach the kernel: make the resident's device refuse to run."""

    def run(*a, **k):
        raise AssertionError("the kernel ran for a meta tensor")

    monkeypatch.setattr(get_resident(rid).device, "run", run)


def test_meta_embedding_shapes_without_running(embedding_bag, monkeypatch):
    _no_run(monkeypatch, embedding_bag.rid)
    meta = dict(dtype=torch.int64, device="meta")
    for n_idx, n_bags, dtype in [(7, 3, torch.float16), (0, 1, torch.float32), (100, 40, torch.float64)]:
        y = torch.ops.offload.embedding_lookup(embedding_bag.rid, torch.empty(n_idx, **meta), torch.empty(n_bags + 1, **meta), None, dtype)
        assert y.device.type == "meta" and y.shape == (n_bags, 5) and y.dtype == dtype


def test_meta_tbe_batch_is_offsets_over_tables(monkeypatch):
    torch.manual_seed(1)
    m = offload.nn.TableBatchedEmbeddingBags.from_float([torch.nn.EmbeddingBag(9, 2), torch.nn.EmbeddingBag(9, 3)])
    _no_run(monkeypatch, m.rid)
    # T=2 tables, B=4 bags each: offsets has T*B+1 = 9 entries; output B x (2+3).
    y = torch.ops.offload.embedding_lookup_tbe(m.rid, torch.empty(11, dtype=torch.int64, device="meta"),
                                               torch.empty(9, dtype=torch.int64, device="meta"), None, torch.float32)
    assert y.device.type == "meta" and y.shape == (4, 5)


def test_meta_mlp_shapes_and_errors_without_running(mlp, monkeypatch):
    _no_run(monkeypatch, mlp.rid)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        y = torch.ops.offload.mlp_score(mlp.rid, torch.empty(13, 6, dtype=dtype, device="meta"))
        assert y.device.type == "meta" and y.shape == (13, 3) and y.dtype == dtype
    with pytest.raises(ValueError, match=r"\[batch, 6\]"):
        torch.ops.offload.mlp_score(mlp.rid, torch.empty(13, 7, device="meta"))
    with pytest.raises(TypeError, match="floating point"):
        torch.ops.offload.mlp_score(mlp.rid, torch.empty(13, 6, dtype=torch.int32, device="meta"))


def test_export_with_dynamic_batch_keeps_one_node_and_runs(mlp):
    x = torch.randn(9, 6, generator=torch.Generator().manual_seed(2))
    ep = torch.export.export(mlp, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=2)},))
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert [n.target for n in nodes] == [torch.ops.offload.mlp_score.default]
    # The output's batch is the input's symbol, not the example's 9.
    out_shape = nodes[0].meta["val"].shape
    assert isinstance(out_shape[0], torch.SymInt) and out_shape[1] == 3
    for b in (2, 17):
        xb = torch.randn(b, 6, generator=torch.Generator().manual_seed(b))
        assert torch.equal(ep.module()(xb), mlp(xb))


def test_compile_dynamic_embedding_matches_eager(embedding_bag):
    fn = torch.compile(lambda i, o: embedding_bag(i, o) * 2, fullgraph=True, dynamic=True, backend="aot_eager")
    g = torch.Generator().manual_seed(3)
    for n in (5, 12):
        idx = torch.randint(0, 20, (n,), generator=g)
        off = torch.tensor([0, 2, n // 2])
        assert torch.equal(fn(idx, off), embedding_bag(idx, off) * 2)

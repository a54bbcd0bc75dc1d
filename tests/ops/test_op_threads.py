"""The ops run on torch's thread count, and loading a kernel leaves that count alone."""

from __future__ import annotations

import os
import subprocess
import sys

_CHILD = r"""
import torch
torch.set_num_threads(1)
assert torch.get_num_threads() == 1  # torch's thread state is set up before offload starts numba's pool
import offload
bag = torch.nn.EmbeddingBag(50, 8, mode="sum")
m = offload.nn.EmbeddingBag.from_float(bag, device="sim")
m(torch.arange(40) % 50, torch.tensor([0, 10, 20]))
print(torch.get_num_threads())
"""


def test_loading_an_embedding_kernel_keeps_torchs_thread_count():
    """numba's OpenMP pool, started from the calling thread, set that thread's OpenMP thread count
    (torch's too: one libgomp) to NUMBA_NUM_THREADS; with 2 numba threads the child saw 2 after load."""
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "1"

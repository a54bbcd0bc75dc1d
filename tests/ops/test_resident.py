"""The resident-kernel table under garbage collection: a module's finalizer releases its kernel
from whatever its thread was doing, possibly inside the table's own lock or another kernel's
attach. Each case runs in a child process with a deadline: a release that waits for a lock its
own thread holds hangs that process (and would hang a test worker at exit), and fails here."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_INSIDE_MAKE_RESIDENT = """
import torch, offload
from offload.ops import resident
bag = torch.nn.EmbeddingBag(20, 4, mode="sum")
old = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<16,6>", max_bag_size=4, device="sim")
kernel, made = old.offload_kernels()[0], resident.Resident

def collecting(*args, **kwargs):
    resident.release_resident(old.rid)  # what old's finalizer does, run by an allocation here
    return made(*args, **kwargs)

resident.Resident = collecting
new = resident.make_resident(kernel, "sim")
resident.Resident = made
assert resident.get_resident(new.id) is new
try:
    resident.get_resident(old.rid)
except KeyError as e:
    assert "was its module released" in str(e)
else:
    raise AssertionError("the old kernel is still resident")
print("ok")
"""

_INSIDE_ATTACH = """
import torch, offload
from offload.host.sim import SimDevice
import offload.ops.embedding  # registers the ops
from offload.ops import native
from offload.ops.resident import make_resident, release_resident
op = torch.ops.offload.embedding_lookup
idx, off = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3])
bag = torch.nn.EmbeddingBag(20, 4, mode="sum")
old = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<16,6>", max_bag_size=4, device="sim")
dev = SimDevice()
res = make_resident(old.offload_kernels()[0], dev)
bind = dev.bind_native

def bind_while_collecting(handle):
    release_resident(old.rid)  # what old's finalizer does, here, mid-attach
    return bind(handle)

dev.bind_native = bind_while_collecting
assert native.attach(res) is native.available()
try:
    op(old.rid, idx, off, None, torch.float32)
except KeyError as e:
    assert "was its module released" in str(e)
else:
    raise AssertionError("the released kernel answered")
print("ok")
"""


def _runs_to_the_end(script: str) -> None:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_a_release_from_a_finalizer_inside_make_resident_does_not_wait_for_itself():
    _runs_to_the_end(_INSIDE_MAKE_RESIDENT)


def test_a_release_in_the_middle_of_an_attach_on_the_same_thread_does_not_wait_for_it():
    _runs_to_the_end(_INSIDE_ATTACH)

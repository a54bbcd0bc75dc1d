"""embedding_lookup's C++ kernel (offload.ops.native): which calls it serves, bit for bit the Python
path's results there, and every other call (errors included) handed to the Python path unchanged.

Which path ran is read from torch's profiler: a call the C++ kernel declines also runs
``offload::_embedding_lookup_py``, the Python implementation, through the dispatcher.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import offload
from offload.host.sim import SimDevice
from offload.ops import embedding as _registers_the_ops  # noqa: F401
from offload.ops import native
from offload.ops.resident import release_resident
from offload.sim import errors
from offload.sim.embedding import fused

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ kernel could not be built here (no compiler)")

OP = torch.ops.offload.embedding_lookup
PY = torch.ops.offload._embedding_lookup_py


def _ops_run(fn) -> list[str]:
    with torch.profiler.profile() as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("offload::")]


def _served(fn) -> bool:
    names = _ops_run(fn)
    assert "offload::embedding_lookup" in names
    return "offload::_embedding_lookup_py" not in names


def _module(mode="sum", fmt="ap_fixed<16,6>", rows=60, dim=8, padding_idx=None, max_bag=12, device="sim"):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(rows, dim, mode=mode, padding_idx=padding_idx)
    return offload.nn.EmbeddingBag.from_float(bag, fmt=fmt, max_bag_size=max_bag, device=device, on_overflow="saturate")


def _attached(m, idx, off, last=True):
    OP(m.rid, idx, off, None, torch.float32, last)  # the first call runs in Python and attaches
    return m.rid


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.int32)


# plain loop (sum, mean, padding), general loop (max; a sum that can overflow its accumulator)
_KINDS = [("sum", "ap_fixed<16,6>", None), ("mean", "ap_fixed<16,6>", 3), ("max", "ap_fixed<8,3>", None),
          ("sum", "ap_fixed<16,6,AP_RND_CONV,AP_SAT>", 0)]


@pytest.mark.parametrize("mode,fmt,pad", _KINDS)
@pytest.mark.parametrize("idx_dtype,off_dtype", [(torch.int64, torch.int64), (torch.int32, torch.int32), (torch.int64, torch.int32)])
@pytest.mark.parametrize("last", [True, False])
def test_served_calls_are_bit_identical_to_the_python_path(mode, fmt, pad, idx_dtype, off_dtype, last):
    m = _module(mode, fmt, padding_idx=pad)
    rng = np.random.default_rng(1)
    starts = np.array([0, 0, 3, 3, 10, 21, 30], dtype=np.int64)  # empty bags, a bag of 12 (max_bag_size)
    n = 33
    idx = torch.from_numpy(rng.integers(0, 60, n)).to(idx_dtype)
    idx[::7] = 3  # padding rows where the table has one
    off = torch.from_numpy(np.append(starts, n) if last else starts).to(off_dtype)
    rid = _attached(m, idx, off, last)
    for ctx in (torch.inference_mode, torch.no_grad, torch.enable_grad):
        with ctx():
            got = OP(rid, idx, off, None, torch.float32, last)
            want = PY(rid, idx, off, None, torch.float32, last)
            assert _served(lambda: OP(rid, idx, off, None, torch.float32, last))
        assert got.dtype == torch.float32 and got.shape == (len(starts), 8) and not got.requires_grad
        assert np.array_equal(_bits(got), _bits(want))


def _same_error(call_a, call_b):
    with pytest.raises(Exception) as ea:
        call_a()
    with pytest.raises(Exception) as eb:
        call_b()
    assert type(ea.value) is type(eb.value) and str(ea.value) == str(eb.value)
    return ea.value


@pytest.mark.parametrize("case", ["index_high", "index_negative", "first_offset", "decreasing", "end"])
def test_broken_rules_raise_the_python_paths_typed_error(case):
    m = _module()
    idx, off = torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 2, 6])
    rid = _attached(m, idx, off)
    if case == "index_high":
        idx = torch.tensor([1, 2, 3, 60, 5, 6])
    elif case == "index_negative":
        idx = torch.tensor([1, -1, 3, 4, 5, 6])
    elif case == "first_offset":
        off = torch.tensor([1, 2, 6])
    elif case == "decreasing":
        off = torch.tensor([0, 4, 2, 6])
    else:
        off = torch.tensor([0, 2, 7])
    with torch.inference_mode():
        err = _same_error(lambda: OP(rid, idx, off, None, torch.float32), lambda: PY(rid, idx, off, None, torch.float32))
    assert isinstance(err, errors.OffloadError)
    names = _ops_run(lambda: pytest.raises(errors.OffloadError, OP, rid, idx, off, None, torch.float32))
    assert "offload::_embedding_lookup_py" in names  # the error comes from the Python path


def test_a_short_last_offset_keeps_torchs_reading():
    """include_last_offset with offsets[-1] < len(indices): the Python path's torch-compatible
    reading (a sum ends at the last offset; a mean is refused), not the kernel's rule."""
    idx, off = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 4])
    m = _module("sum")
    rid = _attached(m, idx, torch.tensor([0, 2, 5]))
    assert not _served(lambda: OP(rid, idx, off, None, torch.float32))
    assert torch.equal(OP(rid, idx, off, None, torch.float32), PY(rid, idx, off, None, torch.float32))
    mm = _module("mean")
    rid = _attached(mm, idx, torch.tensor([0, 2, 5]))
    _same_error(lambda: OP(rid, idx, off, None, torch.float32), lambda: PY(rid, idx, off, None, torch.float32))


def test_released_kernel_and_closed_device_raise_as_before():
    dev = SimDevice()
    m = _module(device=dev)
    idx, off = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3])
    rid = _attached(m, idx, off)
    assert _served(lambda: OP(rid, idx, off, None, torch.float32))
    dev.close()
    err = _same_error(lambda: OP(rid, idx, off, None, torch.float32), lambda: PY(rid, idx, off, None, torch.float32))
    assert "closed" in str(err)
    m2 = _module()
    rid2 = _attached(m2, idx, off)
    release_resident(rid2)
    _same_error(lambda: OP(rid2, idx, off, None, torch.float32), lambda: PY(rid2, idx, off, None, torch.float32))


@pytest.mark.parametrize("case", ["weights", "int16", "float64", "strided", "bfloat16", "2d", "bag_too_long"])
def test_calls_it_does_not_serve_take_the_python_path(case):
    m = _module()
    idx, off, w, dtype = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 4]), None, torch.float32
    rid = _attached(m, idx, off)
    if case == "weights":
        w = torch.tensor([0.5, 1.0, -1.0, 2.0])
    elif case == "int16":
        idx = idx.to(torch.int16)
    elif case == "float64":
        dtype = torch.float64
    elif case == "bfloat16":
        dtype = torch.bfloat16
    elif case == "strided":
        idx = torch.tensor([1, 0, 2, 0, 3, 0, 4, 0])[::2]
    elif case == "bag_too_long":  # past max_bag_size: the fused kernels' proofs do not cover it
        idx, off = torch.arange(13) % 60, torch.tensor([0, 13])
    else:
        idx, off = torch.tensor([[1, 2], [3, 4]]), torch.tensor([0, 1, 4])
    if case == "2d":
        _same_error(lambda: OP(rid, idx, off, w, dtype), lambda: PY(rid, idx, off, w, dtype))
        return
    assert not _served(lambda: OP(rid, idx, off, w, dtype))
    got, want = OP(rid, idx, off, w, dtype), PY(rid, idx, off, w, dtype)
    assert got.dtype == dtype and torch.equal(got, want)


def test_weights_requiring_grad_keep_the_inference_only_backward():
    m = _module()
    idx, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 4])
    rid = _attached(m, idx, off)
    w = torch.tensor([0.5, 1.0, -1.0, 2.0], requires_grad=True)
    y = OP(rid, idx, off, w, torch.float32)
    assert y.requires_grad and torch.equal(y.detach(), PY(rid, idx, off, w.detach(), torch.float32))
    with pytest.raises(errors.UnsupportedError, match="offload::embedding_lookup is not differentiable"):
        y.sum().backward()
    with torch.no_grad():
        assert not OP(rid, idx, off, w, torch.float32).requires_grad


def test_a_dispatch_mode_sees_embedding_lookup():
    from torch.utils._python_dispatch import TorchDispatchMode

    m = _module()
    idx, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 4])
    rid = _attached(m, idx, off)
    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    want = OP(rid, idx, off, None, torch.float32)
    with Seen():
        got = OP(rid, idx, off, None, torch.float32)
    assert seen == [OP.default] and torch.equal(got, want)


def test_threads_leave_large_calls_to_the_threaded_kernels():
    """With more than one torch thread a call big enough for the fused kernels' threads
    (fused.PARALLEL_MIN gathered elements) takes the Python path that runs them; a small one stays in C++."""
    m = _module(rows=100, dim=64, max_bag=64)
    idx_small, off_small = torch.tensor([1, 2, 3]), torch.tensor([0, 3])
    rid = _attached(m, idx_small, off_small)
    n = -(-fused.PARALLEL_MIN // 64)
    idx = torch.arange(n) % 100
    off = torch.arange(0, n + 1, 32)
    off[-1] = n
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _served(lambda: OP(rid, idx_small, off_small, None, torch.float32))
        assert not _served(lambda: OP(rid, idx, off, None, torch.float32))
        torch.set_num_threads(1)
        assert _served(lambda: OP(rid, idx, off, None, torch.float32))
        assert np.array_equal(_bits(OP(rid, idx, off, None, torch.float32)), _bits(PY(rid, idx, off, None, torch.float32)))
    finally:
        torch.set_num_threads(prev)


def test_opcheck_and_compile_fullgraph_with_the_cpp_kernel():
    m = _module()
    idx, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 4])
    rid = _attached(m, idx, off)
    torch.library.opcheck(OP.default, (rid, idx, off, None, torch.float32))
    compiled = torch.compile(lambda i, o: OP(rid, i, o, None, torch.float32) * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(idx, off), PY(rid, idx, off, None, torch.float32) * 2)


def test_no_compiler_leaves_the_python_op_and_says_so(monkeypatch, caplog):
    def no_compiler():
        raise RuntimeError("Error building extension: c++: error: command not found")

    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_build", no_compiler)
    with caplog.at_level("WARNING", logger="offload.ops.native"):
        assert not native.available()
    assert "could not be built" in caplog.text and "command not found" in caplog.text
    m = _module()  # a new kernel is not attached: its calls stay on the Python path
    idx, off = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3])
    OP(m.rid, idx, off, None, torch.float32)
    assert not native.attach(m._res) and not _served(lambda: OP(m.rid, idx, off, None, torch.float32))


def test_a_float32_module_is_served_from_its_first_lookup():
    """The module attaches its kernel when it is made, with the device's JIT, so no lookup builds
    or compiles anything: the first call already runs in C++. A float64 module is not attached."""
    m = _module()
    idx, off = torch.tensor([1, 2, 3, 4], dtype=torch.int64), torch.tensor([0, 2, 4], dtype=torch.int64)
    assert _served(lambda: m(idx, off))
    bag = torch.nn.EmbeddingBag(60, 8, mode="sum")
    m64 = offload.nn.EmbeddingBag.from_float(bag, fmt="ap_fixed<16,6>", max_bag_size=12, device="sim", dtype=torch.float64)
    assert not _served(lambda: m64(idx, off))


def test_an_attach_after_its_kernels_release_leaves_the_id_released():
    """A first call racing its module's release attaches after the release hook ran: the id must
    stay released (the Python path's KeyError), never answered by the C++ kernel from an entry no
    hook will ever detach."""
    from offload.ops.resident import make_resident

    m = _module()
    res = make_resident(m._res.kernel, m._res.device)
    release_resident(res.id)
    assert not native.attach(res)
    idx, off = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3])
    with pytest.raises(KeyError, match="was its module released"):
        OP(res.id, idx, off, None, torch.float32)


@pytest.mark.parametrize("how", ["unbuilt", "env"])
def test_no_cpp_kernel_asks_the_device_for_no_entry(how, monkeypatch):
    """With the C++ kernel off (OFFLOAD_NATIVE_OPS=0) or failed to build, attaching compiles no
    C-ABI wrappers: the device is not asked for an entry."""
    from offload.ops.resident import make_resident

    dev = SimDevice()
    res = make_resident(_module(device=dev)._res.kernel, dev)
    asked = []
    monkeypatch.setattr(dev, "bind_native", lambda h: asked.append(h))
    if how == "unbuilt":
        monkeypatch.setattr(native, "_state", {"ok": False})
    else:
        monkeypatch.setenv("OFFLOAD_NATIVE_OPS", "0")
    assert not native.attach(res) and asked == []
    release_resident(res.id)


def test_a_release_while_other_threads_look_up_answers_or_refuses_every_call():
    """Two threads look a kernel up in C++ while the main thread releases it and drops every
    reference to its device's arrays: each call gives the right rows or the released kernel's
    KeyError, never rows read from freed memory (detach waits for the calls inside the entry)."""
    import gc
    import threading

    dev = SimDevice()
    m = _module(rows=4000, dim=64, device=dev)
    rid = m.rid
    rng = np.random.default_rng(7)
    idx = torch.from_numpy(rng.integers(0, 4000, 64 * 12))
    off = torch.arange(65, dtype=torch.int64) * 12
    want = OP(rid, idx, off, None, torch.float32).clone()
    assert _served(lambda: OP(rid, idx, off, None, torch.float32))
    stop, outcomes = threading.Event(), [[], []]

    def look_up(mine):
        while not stop.is_set():
            try:
                mine.append(torch.equal(OP(rid, idx, off, None, torch.float32), want))
            except KeyError as e:
                mine.append("released" if "was its module released" in str(e) else repr(e))

    threads = [threading.Thread(target=look_up, args=(o,)) for o in outcomes]
    start = time.monotonic()
    for t in threads:
        t.start()
    while min(len(o) for o in outcomes) < 20 and time.monotonic() < start + 30:
        time.sleep(0.001)
    del m, dev  # the module's finalizer releases the kernel; nothing else holds its arrays
    gc.collect()
    filler = [np.full(4000 * 64, -1, dtype=np.int16) for _ in range(8)]  # reuse what was freed
    end = time.monotonic() + 30
    while min(o.count("released") for o in outcomes) < 5 and time.monotonic() < end:
        time.sleep(0.001)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    del filler
    got = [r for o in outcomes for r in o]
    assert set(got) <= {True, "released"}, sorted(set(map(str, got)))
    assert got.count(True) >= 40 and got.count("released") >= 10


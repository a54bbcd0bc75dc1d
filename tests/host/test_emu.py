"""The emu device: the kernels' HLS C++ built with g++, behind card buffer semantics, equal to sim.

Every test that runs a kernel runs in both launch modes: a run per call, and the persistent top
serving a ring in a thread (bit for bit the same outputs)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from _host_util import assert_same, sa
from offload.host import DeviceError, open_device
from offload.host.emu import EmuDevice


LAUNCHES = ("per_call", "persistent")


@pytest.fixture(scope="module", params=LAUNCHES)
def launch(request):
    return request.param


@pytest.fixture(scope="module")
def devs(launch):
    emu, sim = open_device("emu", launch=launch), open_device("sim")
    yield emu, sim
    emu.close()
    sim.close()


def test_emu_equals_sim_random_and_wraparound(devs):
    emu, sim = devs
    k = sa.make_kernel(n=8, scale=3)
    he, hs = emu.load(k), sim.load(k)
    for seed in range(3):
        inp = sa.make_inputs(n=8, batch=1 + 4 * seed, seed=seed)  # includes INT32_MIN/MAX: wrap-around
        assert_same(emu.run(he, inp), sim.run(hs, inp))


def test_resident_tensors_are_copied_at_load(devs):
    emu, sim = devs
    k = sa.make_kernel(n=4, scale=5, seed=3)
    he = emu.load(k)
    inp = sa.make_inputs(n=4, batch=2)
    before = emu.run(he, inp)["y"]
    k.tensors["bias"][:] = 0  # the caller's array changes; the device copy must not
    np.testing.assert_array_equal(emu.run(he, inp)["y"], before)


def _device_work(emu) -> tuple:
    """What a call that reached the device changes: pooled buffers (per call), requests sent (persistent)."""
    d = emu.info().details
    return d["buffer_allocations"], d.get("ring", {}).get("requests")


def test_invalid_input_refused_before_device_work(devs):
    emu, _ = devs
    k = sa.make_kernel(n=8, scale=3)
    h = emu.load(k)
    emu.run(h, sa.make_inputs(n=8, batch=2))
    before = _device_work(emu)
    with pytest.raises(ValueError, match="x: shape must be"):
        emu.run(h, {"x": np.zeros((2, 7), np.int32)})
    with pytest.raises(TypeError, match="x: integer dtype"):
        emu.run(h, {"x": np.zeros((2, 8), np.float32)})
    assert _device_work(emu) == before


def test_per_call_buffers_are_pooled(devs, launch):
    emu, _ = devs
    h = emu.load(sa.make_kernel(n=8, scale=2))
    emu.run(h, sa.make_inputs(n=8, batch=3))
    allocs = emu.info().details["buffer_allocations"]
    for b in (1, 5, 9, 3):  # all within one 4 KiB bucket
        emu.run(h, sa.make_inputs(n=8, batch=b))
    assert emu.info().details["buffer_allocations"] == allocs
    if launch == "persistent":  # requests go through the ring: no per-call buffers at all
        assert allocs == 0


def test_concurrent_submit_from_threads(devs):
    emu, sim = devs
    k = sa.make_kernel(n=16, scale=7)
    he, hs = emu.load(k), sim.load(k)
    inputs = [sa.make_inputs(n=16, batch=1 + i % 5, seed=i) for i in range(24)]
    futs: list = [None] * len(inputs)

    def worker(i0: int) -> None:
        for i in range(i0, len(inputs), 4):
            futs[i] = emu.submit(he, inputs[i])

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for f, inp in zip(futs, inputs):
        assert_same(f.result(timeout=60), sim.run(hs, inp))


def test_handles_and_close(launch):
    a, b = EmuDevice("emu", launch), open_device("sim")
    k = sa.make_kernel()
    ha = a.load(k)
    with pytest.raises(DeviceError, match="does not belong"):
        b.run(ha, sa.make_inputs())
    a.close()
    with pytest.raises(DeviceError, match="closed"):
        a.run(ha, sa.make_inputs())
    b.close()


def test_bind_rows_is_none_on_a_buffered_device_and_refused_as_run_is(launch):
    """Every call here marshals buffers, so there is no prepared rows call: the caller runs it."""
    a, b = EmuDevice("emu", launch), EmuDevice("emu:other", launch)
    h = a.load(sa.make_kernel())
    assert a.bind_rows(h) is None and a.bind_rows(h, fp32=True) is None
    with pytest.raises(DeviceError, match="does not belong"):
        b.bind_rows(h)
    a.close()
    with pytest.raises(DeviceError, match="closed"):
        a.bind_rows(h)
    b.close()


def test_probe_names_the_compiler_or_what_is_missing(monkeypatch):
    from offload.hls import csim

    p = EmuDevice.probe()
    assert p.available and p.devices == ("emu",) and csim.toolchain() in p.why

    def missing():
        raise csim.ToolchainMissing("g++ not found on PATH (set CXX to use another compiler)")

    monkeypatch.setattr(csim, "toolchain", missing)
    p = EmuDevice.probe()
    assert not p.available and p.devices == () and "g++ not found" in p.why


def test_default_device_from_environment(monkeypatch):
    monkeypatch.setenv("OFFLOAD_DEVICE", "emu")
    d = open_device()
    assert d.info().kind == "emu"
    d.close()
    with pytest.raises(ValueError, match="unknown backend"):
        open_device("tpu:0")


def _catalogue_cases():
    from offload.kernels.catalogue import entries

    by_kind: dict[str, list] = {}
    for e in entries():
        by_kind.setdefault(e.kind, []).append(e)
    picked = []
    for kind, es in sorted(by_kind.items()):
        # First, middle and last: the catalogue orders simple configurations first, multi-table last.
        for e in {id(x): x for x in (es[0], es[len(es) // 2], es[-1])}.values():
            picked.append(pytest.param(e, id=e.name))
    return picked


@pytest.mark.parametrize("entry", _catalogue_cases())
def test_sim_equals_emu_over_catalogue(entry, devs):
    """Every kernel kind in the catalogue: the emu device (HLS C++) equals sim bit for bit."""
    emu, sim = devs
    case = entry.build()
    he, hs = emu.load(case.kernel), sim.load(case.kernel)
    assert_same(emu.run(he, case.inputs), sim.run(hs, case.inputs))


def test_kernel_that_does_not_compile_is_a_device_error(monkeypatch, launch):
    """A g++ error in a kind's generated C++ surfaces at load as a DeviceError with g++'s own line."""
    from dataclasses import replace

    from offload.hls.registry import get_hls_kind

    hk = get_hls_kind(sa.KIND)
    broken = replace(hk, sources=lambda spec: {"bad.cpp": 'extern "C" void f() { undeclared_symbol(); }'})
    monkeypatch.setattr("offload.host._buffered.get_hls_kind", lambda kind: broken)
    monkeypatch.setattr("offload.hls.ctop.get_hls_kind", lambda kind: broken)
    monkeypatch.setattr("offload.hls.persistent.get_hls_kind", lambda kind: broken)
    dev = EmuDevice("emu", launch)
    with pytest.raises(DeviceError, match="(?s)kernel 'sa'.*cannot load on device 'emu'.*undeclared_symbol"):
        dev.load(sa.make_kernel())
    assert dev.info().details["kernels"] == []

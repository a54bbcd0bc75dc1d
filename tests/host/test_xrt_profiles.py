"""The xrt device against pyxrt as each XRT release binds it (tests/fakes/pyxrt.py profiles), and
the stand-in's own strictness: each numbered case is a finding of the hardware-path audit."""

from __future__ import annotations

import sys
import threading
import time
import warnings

import numpy as np
import pytest
from _host_util import XRT_PROFILES, assert_same, bundle_with_xclbin, fakes, install_fakes, sa  # noqa: F401

from offload.host import DeviceError, DeviceTimeout, open_device


def _bundle(tmp_path, cus=2):
    return bundle_with_xclbin(tmp_path, [sa.make_kernel("sa", n=8, scale=3, seed=0)], cus=cus)


def _want(b, inp):
    sim = open_device("sim")
    return sim.run(sim.load(b.kernels["sa"]), inp)


# -- 5: cards on XRT without enumerate_devices ---------------------------------------------------
def test_devices_are_listed_on_every_xrt(fakes):
    """``enumerate_devices`` is bound only from XRT 2.17: older XRT is probed by opening cards."""
    from offload.host.device import probe_devices

    pyxrt, _ = fakes
    pyxrt.set_devices([{"bdf": "0000:3b:00.1", "name": "u55c"}, {"bdf": "0000:d8:00.1", "name": "u250"}])
    xrt = next(p.to_json() for p in probe_devices() if p.backend == "xrt")
    assert xrt["available"], xrt
    assert xrt["devices"] == ["xrt:0 0000:3b:00.1 u55c", "xrt:1 0000:d8:00.1 u250"]


# -- 6: minimum XRT ---------------------------------------------------------------------------------
def test_xrt_older_than_2_12_is_refused(monkeypatch):
    install_fakes(monkeypatch, xrt="2.11")
    with pytest.raises(DeviceError, match=r"XRT 2\.12 or later"):
        open_device("xrt:0")
    from offload.host.device import probe_devices

    xrt = next(p.to_json() for p in probe_devices() if p.backend == "xrt")
    assert not xrt["available"] and "2.12 or later" in xrt["why"]


# -- 7: waits against a deadline, without holding the GIL; hung compute units --------------------
def test_a_hung_compute_unit_is_marked_and_skipped(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, cus=2)
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=3)
    want = _want(b, inp)
    pyxrt.inject_fault(pyxrt.HANG)
    with pytest.raises(DeviceTimeout, match=r"within 0\.05 s; compute unit test_scale_add_n8_s3_\d is marked hung"):
        dev.run(h, inp, timeout=0.05)
    hung = next(cu for cu, n in pyxrt.cu_runs.items() if n == 1)
    for _ in range(4):
        assert_same(dev.run(h, inp, timeout=5), want)
    assert pyxrt.cu_runs[hung] == 1  # never started again
    assert dev.info().details["reopens"] == 0


def test_the_device_is_reopened_when_no_compute_unit_is_left(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, cus=1)
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=2)
    opens = pyxrt.stats["device_opens"]
    pyxrt.inject_fault(pyxrt.HANG)
    with pytest.raises(DeviceTimeout, match="marked hung"):
        dev.run(h, inp, timeout=0.05)
    assert pyxrt.stats["device_opens"] == opens + 1
    assert dev.info().details["reopens"] == 1
    assert_same(dev.run(h, inp, timeout=5), _want(b, inp))


def test_a_failed_reopen_is_named_in_the_timeout(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, cus=1)
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    pyxrt.inject_fault(pyxrt.HANG)
    pyxrt.set_devices([])  # the card is gone when the device is reopened
    with pytest.raises(DeviceTimeout, match="marked hung, and reopening the device failed: .*cannot open card '0'"):
        dev.run(h, sa.make_inputs(n=8, batch=2), timeout=0.05)
    with pytest.raises(DeviceError, match="every compute unit is hung"):
        dev.run(h, sa.make_inputs(n=8, batch=2), timeout=0.05)


def test_waiting_for_a_run_leaves_other_threads_running(fakes, tmp_path):
    """pyxrt's run.wait holds the GIL for the whole wait (the stand-in does too); the device must
    not call it, so a thread beside a long kernel run keeps running."""
    pyxrt, _ = fakes
    b = _bundle(tmp_path, cus=1)
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=2)
    ticks, stop = [0], threading.Event()

    def heartbeat():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=heartbeat)
    t.start()
    try:
        pyxrt.set_run_time(0.5)
        before = ticks[0]
        assert_same(dev.run(h, inp, timeout=5), _want(b, inp))
        during = ticks[0] - before
    finally:
        stop.set()
        t.join()
    # About 500 ticks when the GIL is free (fewer on a loaded machine); a handful, all before the
    # wait, while one run.wait() holds it for the whole run.
    assert during >= 25, during


def test_a_slow_run_within_its_timeout_completes(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, cus=1)
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=2)
    pyxrt.set_run_time(0.02)
    assert_same(dev.run(h, inp, timeout=5), _want(b, inp))


# -- 8: XRT 2.23 deprecations ---------------------------------------------------------------------
@pytest.mark.parametrize("version", ["2.16", "2.17", "2.23"])
def test_hw_context_and_no_deprecated_calls(monkeypatch, tmp_path, version):
    """From 2.16 the xclbin is registered and kernels come from a hw_context; 2.23 warns on the old calls."""
    pyxrt, _ = install_fakes(monkeypatch, xrt=version)
    b = _bundle(tmp_path)
    inp = sa.make_inputs(n=8, batch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        dev = open_device("xrt:0")
        h = dev.load_bundle(b)["sa"]
        got = dev.run(h, inp, timeout=5)
    assert_same(got, _want(b, inp))
    assert pyxrt.warnings_seen == []
    assert dev._ctx is not None


def test_xrt_2_12_uses_load_xclbin_and_the_mode_argument(monkeypatch, tmp_path):
    pyxrt, _ = install_fakes(monkeypatch, xrt="2.12")
    assert not hasattr(pyxrt, "hw_context")
    b = _bundle(tmp_path)
    dev = open_device("xrt:0")
    inp = sa.make_inputs(n=8, batch=2)
    assert_same(dev.run(dev.load_bundle(b)["sa"], inp, timeout=5), _want(b, inp))


# -- 12: pyxrt built for another Python -------------------------------------------------------------
def test_pyxrt_built_for_another_python_is_named(monkeypatch, tmp_path):
    (tmp_path / "pyxrt.py").write_text(
        'raise ImportError("Python version mismatch: module was compiled for Python 3.6, but the interpreter version is incompatible")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pyxrt", raising=False)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    with pytest.raises(DeviceError, match=rf"installed but Python {py} cannot import it.*version mismatch.*system Python"):
        open_device("xrt:0")
    from offload.host.device import probe_devices

    xrt = next(p.to_json() for p in probe_devices() if p.backend == "xrt")
    assert f"Python {py} cannot import it" in xrt["why"] and "no pyxrt" not in xrt["why"]


# -- arguments pyxrt would drop silently ----------------------------------------------------------
def test_scalar_kinds_pyxrt_cannot_pass_are_refused_at_load(fakes, tmp_path):
    from offload.hls.registry import KernelArg
    from offload.host._buffered import Loaded

    b = _bundle(tmp_path)
    dev = open_device("xrt:0")
    dev.load_bundle(b)
    k = b.kernels["sa"]
    bad = Loaded(k, None, "test_scale_add_n8_s3", (KernelArg("bias", "resident", np.int32, "gmem0"), KernelArg("gain", "scalar", np.float32)))
    with pytest.raises(DeviceError, match="'gain' is float32; pyxrt can only pass scalars that fit a C int"):
        dev._upload(bad, {"bias": np.zeros(8, np.int32)})


def test_scalar_values_outside_int32_are_refused(fakes, tmp_path):
    from offload.sim.errors import InputError

    b = _bundle(tmp_path)
    dev = open_device("xrt:0")
    dev.load_bundle(b)
    lo = dev._loaded[0]
    for v in (2**31, -(2**31) - 1, 1.5):
        with pytest.raises(InputError, match=r"'batch'.*must be an int in \[-2147483648, 2147483647\]"):
            dev._execute(lo, {"x": np.zeros((1, 8), np.int32), "y": np.zeros((1, 8), np.int32), "batch": v}, timeout=1)


@pytest.mark.parametrize("banks", ["per_cu", "shared"])
def test_every_argument_reaches_the_kernel(fakes, tmp_path, banks):
    """pyxrt drops what it cannot set and clones buffers in foreign banks without a word: after
    calls over three compute units, nothing was dropped or cloned."""
    pyxrt, _ = fakes
    b = bundle_with_xclbin(tmp_path, [sa.make_kernel("sa", n=8, scale=3, seed=0)], cus=3, banks=banks)
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    for s in range(6):
        inp = sa.make_inputs(n=8, batch=1 + s, seed=s)
        assert_same(dev.run(h, inp, timeout=5), _want(b, inp))
    assert pyxrt.stats["runs"] == 6 and pyxrt.stats["skipped_args"] == 0 and pyxrt.stats["clones"] == 0


# -- the stand-in is as strict as pyxrt ------------------------------------------------------------
def _raw_kernel(pyxrt, tmp_path, cus=2):
    from _host_util import fake_xclbin

    fake_xclbin(tmp_path / "x.xclbin", [sa.make_kernel("sa", n=4, scale=2)], cus=cus)
    d = pyxrt.device(0)
    xb = pyxrt.xclbin(str(tmp_path / "x.xclbin"))
    u = d.load_xclbin(xb)
    return d, [pyxrt.kernel(d, u, f"test_scale_add_n4_s2:{{test_scale_add_n4_s2_{i + 1}}}", pyxrt.kernel.cu_access_mode.shared) for i in range(cus)]


def _bos(pyxrt, d, k, x):
    sync = pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
    bos = []
    for i, arr in enumerate((np.arange(4, dtype=np.int32), x, np.zeros_like(x))):
        bo = pyxrt.bo(d, 64, pyxrt.bo.normal, k.group_id(i))
        bo.write(arr.view(np.uint8), 0)
        bo.sync(sync, arr.nbytes, 0)
        bos.append(bo)
    return bos


def _y(pyxrt, bo, n):
    bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, 4 * n, 0)
    return bo.read(4 * n, 0).view(np.int32)


@pytest.mark.parametrize("bad", [1.0, 2**31, np.float32(1)])
def test_stand_in_skips_a_scalar_pyxrt_cannot_set(monkeypatch, tmp_path, bad):
    pyxrt, _ = install_fakes(monkeypatch, xrt="2.16")
    d, (k, _) = _raw_kernel(pyxrt, tmp_path)
    x = np.arange(4, dtype=np.int32).reshape(1, 4)
    bias, xb, yb = _bos(pyxrt, d, k, x)
    run = k(bias, xb, yb, bad)
    assert run.wait() == pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED  # no error: batch stayed 0
    assert pyxrt.stats["skipped_args"] == 1
    np.testing.assert_array_equal(_y(pyxrt, yb, 4), np.zeros(4, np.int32))


@pytest.mark.parametrize("version, clones", [("2.12", 0), ("2.16", 1)])
def test_stand_in_loses_results_written_to_the_wrong_bank(monkeypatch, tmp_path, version, clones):
    """A buffer outside the CU's bank: unset on 2.12, cloned into the right bank from 2.13; either way y is lost."""
    pyxrt, _ = install_fakes(monkeypatch, xrt=version)
    d, (k1, k2) = _raw_kernel(pyxrt, tmp_path)
    x = np.arange(4, dtype=np.int32).reshape(1, 4)
    bias, xb, _ = _bos(pyxrt, d, k1, x)
    y_other_bank = pyxrt.bo(d, 64, pyxrt.bo.normal, k2.group_id(2))
    y_other_bank.write(np.zeros(16, np.uint8), 0)
    y_other_bank.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, 16, 0)
    assert k1(bias, xb, y_other_bank, 1).wait() == pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert pyxrt.stats["clones"] == clones
    np.testing.assert_array_equal(_y(pyxrt, y_other_bank, 4), np.zeros(4, np.int32))


def test_stand_in_enums_uuids_and_signatures_are_pyxrt_s(monkeypatch, tmp_path):
    pyxrt, _ = install_fakes(monkeypatch, xrt="2.12")
    s = pyxrt.ert_cmd_state
    assert not isinstance(s.ERT_CMD_STATE_COMPLETED, int) and not hasattr(s, "ERT_CMD_STATE_RUNNING")
    with pytest.raises(TypeError):
        s.ERT_CMD_STATE_COMPLETED < s.ERT_CMD_STATE_ERROR  # noqa: B015
    assert s(3).name == "???"
    assert pyxrt.uuid("00000000-0000-0000-0000-000000000001") != pyxrt.uuid("00000000-0000-0000-0000-000000000001")
    assert not hasattr(pyxrt, "enumerate_devices") and not hasattr(pyxrt, "hw_context")
    d, (k, _) = _raw_kernel(pyxrt, tmp_path)
    bo = pyxrt.bo(d, 64, pyxrt.bo.normal, k.group_id(0))
    with pytest.raises(TypeError):
        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)  # (dir) alone only from 2.16
    with pytest.raises(TypeError):
        pyxrt.kernel(d, d.get_xclbin_uuid(), "test_scale_add_n4_s2")  # mode required before 2.16


def test_stand_in_runs_are_asynchronous(monkeypatch, tmp_path):
    pyxrt, _ = install_fakes(monkeypatch, xrt="2.17")
    pyxrt.set_run_time(0.05)
    d, (k, _) = _raw_kernel(pyxrt, tmp_path)
    x = np.arange(4, dtype=np.int32).reshape(1, 4)
    bias, xb, yb = _bos(pyxrt, d, k, x)
    run = k(bias, xb, yb, 1)
    assert run.wait(1) == pyxrt.ert_cmd_state.ERT_CMD_STATE_TIMEOUT
    assert run.state().name == "???"  # ERT_CMD_STATE_RUNNING has no binding
    np.testing.assert_array_equal(_y(pyxrt, yb, 4), np.zeros(4, np.int32))  # the zeros synced before: not written yet
    assert run.wait() == pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    np.testing.assert_array_equal(_y(pyxrt, yb, 4), x.reshape(-1) * 2 + np.arange(4))


def test_stand_in_warns_on_deprecated_calls_from_2_23(monkeypatch, tmp_path):
    pyxrt, _ = install_fakes(monkeypatch, xrt="2.23")
    with pytest.warns(DeprecationWarning, match="load_xclbin"), pytest.warns(DeprecationWarning, match=r"kernel\(device, uuid"):
        _raw_kernel(pyxrt, tmp_path, cus=1)

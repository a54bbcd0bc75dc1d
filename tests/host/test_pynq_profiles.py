"""The pynq device against PYNQ 3.0.1 as its source behaves (tests/fakes/pynq), one test per
finding of the hardware-path audit, and the pin that keeps a PYNQ that probes PCIe cards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib
from _host_util import assert_same, bundle_with_xclbin, install_fakes, pynq_fakes, sa  # noqa: F401
from packaging.specifiers import SpecifierSet

from offload.host import DeviceError, DeviceTimeout, open_device

ROOT = Path(__file__).resolve().parents[2]


def _bundle(tmp_path, cus=2, **entry):
    return bundle_with_xclbin(tmp_path, [sa.make_kernel("sa", n=8, scale=3, seed=0)], cus=cus, **entry)


def _want(b, inp):
    sim = open_device("sim")
    return sim.run(sim.load(b.kernels["sa"]), inp)


# -- 1: the pin ---------------------------------------------------------------------------------------
def test_pynq_extra_excludes_the_releases_that_probe_no_card():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["pynq"]
    (req,) = extras
    spec = SpecifierSet(req.removeprefix("pynq"))
    assert "3.0.1" in spec and "3.0.0" in spec
    assert "3.1" not in spec and "3.1.2" not in spec and "4.0" not in spec


def test_pynq_3_1_is_refused_with_the_pin(monkeypatch):
    install_fakes(monkeypatch, xrt="2.16", pynq="3.1")
    with pytest.raises(DeviceError, match=r"PYNQ 3\.1\.2 no longer probes PCIe Alveo cards.*pynq>=3\.0,<3\.1"):
        open_device("pynq:0")
    from offload.host.device import probe_devices

    p = next(q.to_json() for q in probe_devices() if q.backend == "pynq")
    assert not p["available"] and "3.1.2 probes no PCIe card" in p["why"] and "pynq>=3.0,<3.1" in p["why"]


# -- 2: a failed command is an error, not a result ---------------------------------------------------
def test_a_failed_command_raises(pynq_fakes, tmp_path):
    _, pynq = pynq_fakes
    b = _bundle(tmp_path)
    dev = open_device("pynq:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=2)
    pynq.inject_fault("error")
    with pytest.raises(DeviceError, match=r"'sa'.*failed: Execution failed: 5"):
        dev.run(h, inp, timeout=5)
    assert_same(dev.run(h, inp, timeout=5), _want(b, inp))


def test_stand_in_wait_stores_the_failure(pynq_fakes, tmp_path):
    """PYNQ 3.0.1's ErtWaitHandle.wait() returns normally after a failed command."""
    _, pynq = pynq_fakes
    b = _bundle(tmp_path, cus=1)
    ol = pynq.Overlay(str(b.xclbin), device=pynq.Device.devices[0])
    ip = ol.test_scale_add_n8_s3_1
    bufs = [pynq.allocate((8,), np.int32, target=ol.HBM0), *(pynq.allocate((8,), np.int32, target=ol.HBM1) for _ in range(2))]
    pynq.inject_fault("error")
    wh = ip.start(*bufs, 1)
    wh.wait()
    assert wh.done and str(wh._future.exception()) == "Execution failed: 5"


# -- 3: concurrency and deadlines ----------------------------------------------------------------------
def test_concurrent_calls_lose_no_completion(pynq_fakes, tmp_path):
    _, pynq = pynq_fakes
    b = _bundle(tmp_path, cus=2)
    dev = open_device("pynq:0")
    h = dev.load_bundle(b)["sa"]
    pynq.set_run_time(0.001)
    pynq.set_race_window(0.002)  # PYNQ's unlocked gap in _handle_events, made wide enough to hit
    inputs = [sa.make_inputs(n=8, batch=2, seed=s) for s in range(24)]
    futs = [dev.submit(h, inp) for inp in inputs]
    for inp, f in zip(inputs, futs):
        assert_same(f.result(timeout=60), _want(b, inp))
    assert pynq.stats["lost"] == 0
    dev.close()


def test_a_hung_command_times_out_and_its_cu_is_skipped(pynq_fakes, tmp_path):
    _, pynq = pynq_fakes
    b = _bundle(tmp_path, cus=2)
    dev = open_device("pynq:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=2)
    pynq.inject_fault("hang")
    with pytest.raises(DeviceTimeout, match=r"within 0\.05 s; compute unit test_scale_add_n8_s3_\d is marked hung"):
        dev.run(h, inp, timeout=0.05)
    hung = next(cu for cu, n in pynq.cu_runs.items() if n == 1)
    for _ in range(3):
        assert_same(dev.run(h, inp, timeout=5), _want(b, inp))
    assert pynq.cu_runs[hung] == 1


# -- 4: HBM ranges ------------------------------------------------------------------------------------
def test_a_table_larger_than_the_last_channel_of_its_range_is_refused(pynq_fakes, tmp_path):
    """PYNQ 3.0.1's xclbin parser keeps only the last bank of HBM[a:b]; the 32-byte bias needs more than one 16-byte channel."""
    b = _bundle(tmp_path, cus=1, memory={"bias": "HBM[0:1]"}, bank_bytes=16)
    dev = open_device("pynq:0")
    with pytest.raises(DeviceError, match=r"'bias' \(32 B\) is connected to HBM\[0\]..HBM\[1\], but PYNQ 3.0 allocates it only in the last of them, HBM\[1\] \(16 B\).*xrt backend"):
        dev.load_bundle(b)


def test_a_range_whose_last_channel_fits_runs(pynq_fakes, tmp_path):
    b = _bundle(tmp_path, cus=1, memory={"bias": "HBM[0:1]"})
    dev = open_device("pynq:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=2)
    assert_same(dev.run(h, inp, timeout=5), _want(b, inp))


def test_ddr_tags_named_bank(pynq_fakes, tmp_path):
    """Older DDR platforms tag their banks ``bank0``..``bank3``."""
    b = _bundle(tmp_path, cus=2, memory_kind="bank")
    dev = open_device("pynq:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=2)
    for _ in range(2):
        assert_same(dev.run(h, inp, timeout=5), _want(b, inp))

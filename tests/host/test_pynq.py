"""The pynq device through the PYNQ stand-in (tests/fakes/pynq)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from _host_util import assert_same, bundle_with_xclbin, pynq_fakes, sa  # noqa: F401
from offload.host import DeviceError, DeviceTimeout, open_device


def _kernels():
    return [sa.make_kernel("sa", n=8, scale=3, seed=0), sa.make_kernel("sb", n=8, scale=9, seed=5)]


def test_bundle_runs_on_pynq_like_sim(pynq_fakes, tmp_path):
    _, pynq = pynq_fakes
    b = bundle_with_xclbin(tmp_path, _kernels(), cus=2)
    dev, sim = open_device("pynq:0"), open_device("sim")
    hp, hs = dev.load_bundle(b), sim.load_bundle(b)
    for i in range(3):
        inp = sa.make_inputs(n=8, batch=2 + 3 * i, seed=i)
        for name in hp:
            assert_same(dev.run(hp[name], inp, timeout=5.0), sim.run(hs[name], inp))
    # Two tops (different scale) with two CUs each; each kernel alternates over its CUs: 2+1 runs.
    assert sorted(pynq.cu_runs.values()) == [1, 1, 2, 2]
    futs = [dev.submit(hp["sa"], sa.make_inputs(n=8, batch=4, seed=s)) for s in range(6)]
    for s, f in enumerate(futs):
        assert_same(f.result(timeout=30), sim.run(hs["sa"], sa.make_inputs(n=8, batch=4, seed=s)))
    allocated = pynq.stats["allocations"]
    dev.close()
    assert pynq.stats["freed"] == allocated  # resident and pooled buffers all freed


def test_failed_and_hung_runs(pynq_fakes, tmp_path):
    _, pynq = pynq_fakes
    b = bundle_with_xclbin(tmp_path, _kernels())
    dev = open_device("pynq:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs()
    pynq.inject_fault("error")
    with pytest.raises(DeviceError, match="'sa'.*failed: Execution failed"):
        dev.run(h, inp)
    pynq.inject_fault("hang")
    with pytest.raises(DeviceTimeout, match="'sa'.*within 0.2 s"):
        dev.run(h, inp, timeout=0.2)
    pynq.release_hangs()
    ref = open_device("sim")
    assert_same(dev.run(h, inp, timeout=5), ref.run(ref.load(b.kernels["sa"]), inp))


def test_no_card_and_bad_spec(pynq_fakes):
    _, pynq = pynq_fakes
    with pytest.raises(DeviceError, match=r"PYNQ found 1 card.*XRT 2.12 \.\. 2.16"):
        open_device("pynq:1")
    with pytest.raises(ValueError, match="card index"):
        open_device("pynq:0000:3b:00.1")


def test_bundle_without_xclbin(pynq_fakes, tmp_path):
    from offload.host.bundle import load, save

    b = load(save(_kernels(), tmp_path / "plain"))
    with pytest.raises(DeviceError, match="has no xclbin.*offload build"):
        open_device("pynq:0").load_bundle(b)


def test_missing_pynq_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynq", None)
    with pytest.raises(DeviceError, match=r"offload\[pynq\].*pynq>=3.0,<3.1"):
        open_device("pynq:0")


def test_invalid_input_never_reaches_the_card(pynq_fakes, tmp_path):
    _, pynq = pynq_fakes
    b = bundle_with_xclbin(tmp_path, _kernels())
    dev = open_device("pynq:0")
    h = dev.load_bundle(b)["sa"]
    before = dict(pynq.stats)
    with pytest.raises(ValueError, match="x: shape"):
        dev.run(h, {"x": np.zeros((3, 5), np.int32)})
    assert pynq.stats == before


@pytest.mark.hardware
def test_real_card_through_pynq():
    """On a host with PYNQ 3.0.x, XRT 2.12 .. 2.16 and an Alveo card: the card opens and reports itself."""
    from pathlib import Path

    from _host_util import FAKES

    try:
        import pynq
    except ImportError:
        pytest.skip("pynq is not installed")
    if Path(pynq.__file__).resolve().parent.parent == FAKES:
        pytest.skip("only the test stand-in of pynq is importable")
    if not list(pynq.Device.devices):
        pytest.skip("PYNQ enumerates no card on this host")
    dev = open_device("pynq:0")
    assert dev.info().details["card"]
    dev.close()

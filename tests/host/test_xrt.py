"""The xrt device through the pyxrt stand-in (tests/fakes/pyxrt.py), and on a real card when present."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from _host_util import FAKES, assert_same, bundle_with_xclbin, fake_xclbin, fakes, sa  # noqa: F401
from offload.host import DeviceError, DeviceTimeout, open_device


def _two_kernels():
    return [sa.make_kernel("sa", n=8, scale=3, seed=0), sa.make_kernel("sb", n=8, scale=3, seed=5)]


def test_bundle_runs_on_xrt_like_sim(fakes, tmp_path):
    pyxrt, _ = fakes
    b = bundle_with_xclbin(tmp_path, _two_kernels(), cus=2)
    dev, sim = open_device("xrt:0"), open_device("sim")
    hx, hs = dev.load_bundle(b), sim.load_bundle(b)
    for i in range(4):
        inp = sa.make_inputs(n=8, batch=1 + i, seed=i)
        for name in ("sa", "sb"):
            assert_same(dev.run(hx[name], inp, timeout=5.0), sim.run(hs[name], inp))
    # Two kernels x four calls, alternating over two compute units of the one top function.
    assert sorted(pyxrt.cu_runs.values()) == [4, 4]
    # Resident bos once per CU and kernel (2 x 2), per-call bos reused: x and y per CU bank, once.
    assert pyxrt.stats["bo_allocs"] == 4 + 2 * 2
    info = dev.info()
    assert info.kind == "xrt" and info.details["bdf"] == "0000:3b:00.1"
    dev.close()


def test_open_by_bdf_and_missing_card(fakes):
    dev = open_device("xrt:0000:3b:00.1")
    assert dev.info().details["bdf"] == "0000:3b:00.1"
    with pytest.raises(DeviceError, match="cannot open card '3'"):
        open_device("xrt:3")


def test_uuid_mismatch_is_refused(fakes, tmp_path):
    b = bundle_with_xclbin(tmp_path, _two_kernels())
    fake_xclbin(tmp_path / "other.xclbin", _two_kernels())  # same kernels, another build (UUID)
    b.xclbin = tmp_path / "other.xclbin"
    with pytest.raises(DeviceError, match="does not match the bundle's recorded UUID"):
        open_device("xrt:0").load_bundle(b)


def test_load_without_xclbin_says_how(fakes, monkeypatch):
    monkeypatch.delenv("OFFLOAD_XCLBIN", raising=False)
    with pytest.raises(DeviceError, match="no xclbin is loaded"):
        open_device("xrt:0").load(sa.make_kernel())


def test_kernel_not_in_xclbin(fakes, tmp_path):
    fake_xclbin(tmp_path / "x.xclbin", [sa.make_kernel(n=4)])
    dev = open_device("xrt:0")
    dev.load_xclbin(tmp_path / "x.xclbin")
    with pytest.raises(DeviceError, match="is not in xclbin"):
        dev.load(sa.make_kernel(n=8))


@pytest.mark.parametrize(
    "state, err, words, new_bos",
    [
        # A timed-out run may still write its buffers: they are dropped, not pooled (2 more bos).
        ("ERT_CMD_STATE_TIMEOUT", DeviceTimeout, "did not complete within", 4),
        ("ERT_CMD_STATE_ERROR", DeviceError, "ended in state ERT_CMD_STATE_ERROR", 2),
        ("ERT_CMD_STATE_ABORT", DeviceError, "ended in state ERT_CMD_STATE_ABORT", 2),
    ],
)
def test_run_states_become_typed_errors(fakes, tmp_path, state, err, words, new_bos):
    pyxrt, _ = fakes
    b = bundle_with_xclbin(tmp_path, _two_kernels())
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs()
    pyxrt.inject_fault(getattr(pyxrt.ert_cmd_state, state))
    with pytest.raises(err, match=words) as ei:
        dev.run(h, inp, timeout=0.5)
    assert "'sa'" in str(ei.value)
    # The device stays usable. The next two calls run on the other CU (its x and y are new) and
    # then on the failed call's CU, which reuses that call's buffers unless the run timed out.
    allocs = pyxrt.stats["bo_allocs"]
    ref = open_device("sim")
    want = ref.run(ref.load(b.kernels["sa"]), inp)
    for _ in range(2):
        assert_same(dev.run(h, inp), want)
    assert pyxrt.stats["bo_allocs"] == allocs + new_bos


def test_invalid_input_never_reaches_the_card(fakes, tmp_path):
    pyxrt, _ = fakes
    b = bundle_with_xclbin(tmp_path, _two_kernels())
    dev = open_device("xrt:0")
    h = dev.load_bundle(b)["sa"]
    before = dict(pyxrt.stats)
    with pytest.raises(ValueError, match="x: shape"):
        dev.run(h, {"x": np.zeros((3, 5), np.int32)})
    assert pyxrt.stats == before


def test_missing_pyxrt_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    with pytest.raises(DeviceError, match="pyxrt.*install XRT"):
        open_device("xrt:0")


@pytest.mark.hardware
def test_real_card_enumerates():
    """On a host with XRT and an Alveo card: the card opens and reports itself."""
    try:
        import pyxrt
    except ImportError:
        pytest.skip("pyxrt is not installed (no XRT on this host)")
    if Path(pyxrt.__file__).resolve().parent == FAKES:
        pytest.skip("only the test stand-in of pyxrt is importable")
    from offload.host.xrt import count_devices, xrt_api

    if count_devices(pyxrt, xrt_api(pyxrt)) < 1:  # enumerate_devices is bound only from XRT 2.17
        pytest.skip("XRT finds no card on this host")
    dev = open_device("xrt:0")
    info = dev.info()
    assert info.details.get("bdf")
    dev.close()


def test_catalogue_kinds_through_xrt_and_pynq(fakes, tmp_path):
    """The real kinds (multi-table embedding with row-wise params; an hls4ml MLP) on both card
    backends, bit-equal to sim: the marshalling is the kinds' own, shared by every device."""
    from offload.kernels.catalogue import entries

    cases = [next(e for e in entries() if e.kind == kind and (kind != "embedding" or "mixed" in e.name)).build() for kind in ("embedding", "mlp")]
    b = bundle_with_xclbin(tmp_path, [c.kernel for c in cases], cus=2)
    sim = open_device("sim")
    hs = sim.load_bundle(b)
    for spec in ("xrt:0", "pynq:0"):
        dev = open_device(spec)
        hd = dev.load_bundle(b)
        for c in cases:
            for _ in range(2):  # both compute units
                assert_same(dev.run(hd[c.kernel.name], c.inputs, timeout=10), sim.run(hs[c.kernel.name], c.inputs))
        dev.close()


def test_unreadable_xclbin(fakes, tmp_path):
    (tmp_path / "junk.xclbin").write_text("not an xclbin")
    with pytest.raises(DeviceError, match="junk.xclbin: XRT cannot read it"):
        open_device("xrt:0").load_xclbin(tmp_path / "junk.xclbin")


def test_stand_in_catches_a_missing_sync(fakes, tmp_path, monkeypatch):
    """The stand-in keeps host and device memory apart: a backend that skipped the sync to the
    device would compute on garbage, so the equality tests above can fail."""
    pyxrt, _ = fakes
    b = bundle_with_xclbin(tmp_path, [sa.make_kernel("sa", n=8, scale=3)], cus=1)
    dev, sim = open_device("xrt:0"), open_device("sim")
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=4)
    want = sim.run(sim.load(b.kernels["sa"]), inp)["y"]
    real_sync = pyxrt.bo.sync

    def lossy_sync(self, direction, size=None, offset=0):
        if direction != pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            real_sync(self, direction, size, offset)

    monkeypatch.setattr(pyxrt.bo, "sync", lossy_sync)
    assert not np.array_equal(dev.run(h, inp)["y"], want)


@pytest.mark.hardware
def test_real_card_runs_a_built_bundle():
    """With OFFLOAD_HW_BUNDLE naming a bundle built for the card in this host (offload build
    --vitis): every kernel runs on xrt:0 bit-equal to sim on the build's golden inputs."""
    import os

    path = os.environ.get("OFFLOAD_HW_BUNDLE")
    if not path:
        pytest.skip("set OFFLOAD_HW_BUNDLE to a bundle with a recorded xclbin for this card")
    try:
        import pyxrt
    except ImportError:
        pytest.skip("pyxrt is not installed (no XRT on this host)")
    from offload.host.xrt import count_devices, xrt_api

    if Path(pyxrt.__file__).resolve().parent == FAKES or count_devices(pyxrt, xrt_api(pyxrt)) < 1:
        pytest.skip("no real card")
    from offload.hls.build import golden_inputs
    from offload.host.bundle import load

    b = load(path)
    dev, sim = open_device("xrt:0"), open_device("sim")
    hx, hs = dev.load_bundle(b), sim.load_bundle(b)
    rng = np.random.default_rng(0)
    for name, k in b.kernels.items():
        for case in range(3):
            inp = golden_inputs(k.spec, rng, case)
            assert_same(dev.run(hx[name], inp, timeout=10.0), sim.run(hs[name], inp))
    dev.close()


@pytest.mark.parametrize("banks, resident_bos", [("per_cu", 3), ("shared", 1)])
def test_cus_on_one_bank_share_the_resident_tables(fakes, tmp_path, banks, resident_bos):
    """Three CUs: each gets its own copy of a resident tensor only when it sits on its own bank."""
    pyxrt, pynq = fakes
    b = bundle_with_xclbin(tmp_path, [sa.make_kernel("sa", n=8, scale=3)], cus=3, banks=banks)
    dev, sim = open_device("xrt:0"), open_device("sim")
    h = dev.load_bundle(b)["sa"]
    assert pyxrt.stats["bo_allocs"] == resident_bos
    inp = sa.make_inputs(n=8, batch=2)
    want = sim.run(sim.load(b.kernels["sa"]), inp)
    for _ in range(3):
        assert_same(dev.run(h, inp), want)
    p = open_device("pynq:0")
    hp = p.load_bundle(b)["sa"]
    assert pynq.stats["allocations"] == resident_bos
    for _ in range(3):
        assert_same(p.run(hp, inp), want)

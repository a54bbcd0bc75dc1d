"""Shared helpers of the host/bundle/build tests: the private test kernel kind and the pyxrt/PYNQ
stand-ins (tests/fakes) put in front of any real module for the duration of one test."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import _scale_add as sa
import numpy as np
import pytest

FAKES = Path(__file__).resolve().parent / "fakes"


# The XRT releases the host tests run against (tests/fakes/pyxrt.py mirrors each one's pyxrt.cpp):
# 2.12 is the oldest offload supports, 2.16 the newest PYNQ 3.0 drives, 2.17 brings
# enumerate_devices, 2.23 deprecates device.load_xclbin and kernel(device, uuid, ...).
XRT_PROFILES = ("2.12", "2.16", "2.17", "2.23")
PYNQ_PROFILES = ("3.0.1",)


def install_fakes(monkeypatch, xrt: str = "2.23", pynq: str = "3.0.1"):
    """Import ``pyxrt`` and ``pynq`` from tests/fakes, shaped like XRT ``xrt`` and PYNQ ``pynq``."""
    monkeypatch.syspath_prepend(str(FAKES))
    for name in [m for m in sys.modules if m == "pyxrt" or m == "pynq" or m.startswith("pynq.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("pyxrt", "pynq"):
        # Recorded as absent, so the stand-ins leave sys.modules with the test, fixture or not.
        monkeypatch.setitem(sys.modules, name, None)
        del sys.modules[name]
    pyxrt_mod = importlib.import_module("pyxrt")
    pynq_mod = importlib.import_module("pynq")
    assert Path(pyxrt_mod.__file__).parent == FAKES, pyxrt_mod.__file__
    pyxrt_mod.reset()
    pyxrt_mod.use_profile(xrt)
    pynq_mod.reset()
    pynq_mod.use_profile(pynq)
    return pyxrt_mod, pynq_mod


def _remove_fakes(pynq_mod) -> None:
    pynq_mod.release_hangs()
    if "pyxrt" in sys.modules:
        sys.modules["pyxrt"].release_hangs()
    # The stand-ins must not outlive the test: later imports get the real modules (or none).
    for name in [m for m in sys.modules if m == "pyxrt" or m == "pynq" or m.startswith("pynq.")]:
        del sys.modules[name]


@pytest.fixture(params=XRT_PROFILES, ids=[f"xrt{v}" for v in XRT_PROFILES])
def fakes(request, monkeypatch):
    """The stand-ins with the XRT profile of this parametrisation (every test runs per profile)."""
    pyxrt_mod, pynq_mod = install_fakes(monkeypatch, xrt=request.param)
    yield pyxrt_mod, pynq_mod
    _remove_fakes(pynq_mod)


@pytest.fixture(params=PYNQ_PROFILES, ids=[f"pynq{v}" for v in PYNQ_PROFILES])
def pynq_fakes(request, monkeypatch):
    """The stand-ins for the PYNQ tests: PYNQ ``request.param`` over XRT 2.16 (the newest it drives)."""
    pyxrt_mod, pynq_mod = install_fakes(monkeypatch, xrt="2.16", pynq=request.param)
    yield pyxrt_mod, pynq_mod
    _remove_fakes(pynq_mod)


def fake_xclbin(path, kernels, cus=2, uuid=None, banks="per_cu", **entry) -> str:
    """Write the JSON xclbin stand-in (a TEST ARTIFACT, see tests/fakes/pyxrt.py) for ``kernels``."""
    import pyxrt

    from offload.hls.registry import get_hls_kind

    entries, seen = [], set()
    for k in kernels:
        top = get_hls_kind(k.kind).top_name(k.spec)
        if top in seen:
            continue
        seen.add(top)
        entries.append({"name": top, "kind": k.kind, "spec": k.spec.to_json(), "cus": [f"{top}_{i + 1}" for i in range(cus)], "banks": banks, **entry})
    return pyxrt.write_xclbin(path, entries, uuid=uuid)


def bundle_with_xclbin(tmp_path, kernels, cus=2, banks="per_cu", **entry):
    """A saved bundle of ``kernels`` with a recorded (fake) xclbin holding ``cus`` CUs per top."""
    from offload.hls.registry import get_hls_kind
    from offload.host.bundle import record_xclbin, save

    p = save(kernels, tmp_path / "b.offload", meta={"model": "test"})
    xb = tmp_path / "fake.xclbin"
    fake_xclbin(xb, kernels, cus=cus, banks=banks, **entry)
    tops = {get_hls_kind(k.kind).top_name(k.spec) for k in kernels}
    return record_xclbin(p, xb, target="u55c", platform="xilinx_u55c_gen3x16_xdma_3_202210_1", compute_units={t: [f"{t}_{i + 1}" for i in range(cus)] for t in tops})


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


__all__ = ["sa", "fakes", "pynq_fakes", "install_fakes", "XRT_PROFILES", "PYNQ_PROFILES", "fake_xclbin", "bundle_with_xclbin", "assert_same", "FAKES"]

"""Shared helpers of the host/bundle/build tests: the private test kernel kind and the pyxrt/PYNQ
stand-ins (tests/fakes) put in front of any real module for the duration of one test."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

import _scale_add as sa

FAKES = Path(__file__).resolve().parent / "fakes"


@pytest.fixture
def fakes(monkeypatch):
    """Import ``pyxrt`` and ``pynq`` from tests/fakes (reset), restoring sys.modules afterwards."""
    monkeypatch.syspath_prepend(str(FAKES))
    for name in [m for m in sys.modules if m == "pyxrt" or m == "pynq" or m.startswith("pynq.")]:
        monkeypatch.delitem(sys.modules, name)
    pyxrt = importlib.import_module("pyxrt")
    pynq = importlib.import_module("pynq")
    assert Path(pyxrt.__file__).parent == FAKES, pyxrt.__file__
    pyxrt.reset()
    pynq.reset()
    yield pyxrt, pynq
    pynq.release_hangs()
    # The stand-ins must not outlive the test: later imports get the real modules (or none).
    for name in [m for m in sys.modules if m == "pyxrt" or m == "pynq" or m.startswith("pynq.")]:
        del sys.modules[name]


def fake_xclbin(path, kernels, cus=2, uuid=None, banks="per_cu") -> str:
    """Write the JSON xclbin stand-in (a TEST ARTIFACT, see tests/fakes/pyxrt.py) for ``kernels``."""
    import pyxrt
    from offload.hls.registry import get_hls_kind

    entries, seen = [], set()
    for k in kernels:
        top = get_hls_kind(k.kind).top_name(k.spec)
        if top in seen:
            continue
        seen.add(top)
        entries.append({"name": top, "kind": k.kind, "spec": k.spec.to_json(), "cus": [f"{top}_{i + 1}" for i in range(cus)], "banks": banks})
    return pyxrt.write_xclbin(path, entries, uuid=uuid)


def bundle_with_xclbin(tmp_path, kernels, cus=2, banks="per_cu"):
    """A saved bundle of ``kernels`` with a recorded (fake) xclbin holding ``cus`` CUs per top."""
    from offload.hls.registry import get_hls_kind
    from offload.host.bundle import record_xclbin, save

    p = save(kernels, tmp_path / "b.offload", meta={"model": "test"})
    xb = tmp_path / "fake.xclbin"
    fake_xclbin(xb, kernels, cus=cus, banks=banks)
    tops = {get_hls_kind(k.kind).top_name(k.spec) for k in kernels}
    return record_xclbin(p, xb, target="u55c", platform="xilinx_u55c_gen3x16_xdma_3_202210_1", compute_units={t: [f"{t}_{i + 1}" for i in range(cus)] for t in tops})


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


__all__ = ["sa", "fakes", "fake_xclbin", "bundle_with_xclbin", "assert_same", "FAKES"]

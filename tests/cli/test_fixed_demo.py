"""The demo's fixed-point section: passes on the real model, fails (exit 1) when the model is wrong."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from offload import demo
from offload.hls import csim
from offload.sim import FixedType


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=100, color_system=None), buf


def test_fixed_point_section_is_bit_exact():
    con, buf = _console()
    assert demo.section_fixed_point(con)
    out = buf.getvalue()
    try:
        csim._compiler()
    except csim.ToolchainMissing:
        pytest.skip("g++ not available: the C-simulation line is skipped")
    assert "C-simulation: 21/21 bit-exact" in out
    assert "ap_fixed<16,6,AP_RND_CONV,AP_SAT>" in out


def test_demo_exits_nonzero_on_a_mismatch(monkeypatch):
    try:
        csim._compiler()
    except csim.ToolchainMissing:
        pytest.skip("g++ not available")
    real = FixedType.quantize

    def off_by_one(self, x):  # a model one LSB off everywhere must be caught by the C-simulation
        return real(self, x) ^ np.int64(1)

    monkeypatch.setattr(FixedType, "quantize", off_by_one)
    monkeypatch.setattr(demo, "SECTIONS", [demo.section_fixed_point])
    con, buf = _console()
    with pytest.raises(SystemExit) as e:
        demo.run_demo(con)
    assert e.value.code == 1
    assert "bit-exact" in buf.getvalue() and "demo failed: section_fixed_point" in buf.getvalue()

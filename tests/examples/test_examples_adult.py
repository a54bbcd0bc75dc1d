"""The risk MLP on Adult: PTQ and Brevitas QAT kernels, the QAT one equal to Brevitas on every test row."""

from __future__ import annotations

import pytest

pytest.importorskip("brevitas")
data = pytest.importorskip("offload.data")
try:
    data.packaged_path("adult")
except ImportError as e:  # the data extra is optional
    pytest.skip(str(e), allow_module_level=True)


@pytest.mark.slow
def test_ptq_and_qat_on_adult():
    from offload.examples.adult import run

    res = run(bits=(4,), epochs=5, qat_epochs=2)
    assert res.auc_float > 0.88  # income is learnable from the census columns
    assert [v.name for v in res.variants] == ["ptq16", "ptq_auto", "qat4"]
    assert res.qat_bit_exact_vs_brevitas[4] and res.qat_max_deviation[4] == 0.0  # every test row, bit for bit
    assert res.variant("ptq16").auc >= res.auc_float - 0.002
    assert res.variant("qat4").auc >= res.auc_float - 0.01
    assert "| qat4 |" in res.table()


@pytest.mark.slow
@pytest.mark.rtl
@pytest.mark.hls
def test_qat_with_brevitas_default_rounding_is_the_same_from_brevitas_to_verilator():
    """Brevitas's default rounding (half to even, AP_RND_CONV): simulate == Brevitas on every test
    row, and hls4ml's C-simulation and the Verilator RTL equal simulate on the checked rows."""
    from offload.examples.adult import run

    res = run(bits=(4,), epochs=5, qat_epochs=2, rtl=True, rtl_rows=128, rtl_variants=("qat4",))
    q = res.variant("qat4")
    assert any("AP_RND_CONV" in str(layer.result) for layer in q.mlp.spec.layers)
    assert res.qat_bit_exact_vs_brevitas[4]
    assert q.rtl_matches_simulate is True and q.csim_matches_simulate is True
    assert q.cycles is not None and q.luts and q.luts > 0
    # every variant gets da4ml's estimate; only the named one is built under Verilator and Yosys
    assert all(v.da4ml_luts and v.da4ml_luts > 0 for v in res.variants)
    assert res.variant("ptq16").luts is None and res.variant("ptq16").da4ml_luts > q.da4ml_luts

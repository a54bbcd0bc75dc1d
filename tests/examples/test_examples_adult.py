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

"""Post-training quantization for offloaded models: calibration, type search, reports, drift.

Example::

    from offload.quant import choose_precision, check_drift, CalibrationDriftWarning
"""

from offload.quant.drift import CalibrationDriftWarning, check_drift, ks_statistic
from offload.quant.metrics import auc
from offload.quant.ptq import QuantizationBudgetWarning, choose_precision, fixed_precision
from offload.quant.report import LayerRow, QuantReport

__all__ = [
    "CalibrationDriftWarning",
    "LayerRow",
    "QuantReport",
    "QuantizationBudgetWarning",
    "auc",
    "check_drift",
    "choose_precision",
    "fixed_precision",
    "ks_statistic",
]

"""Calibrated PTQ (precision="auto"): constraints met, bits saved, report, drift warning."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

import offload
from offload.quant import CalibrationDriftWarning, auc, check_drift


def _seq(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.LeakyReLU(0.1),
        torch.nn.Linear(16, 1), torch.nn.Sigmoid(),
    ).eval()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 12))
    return x


def _cosine(a, b):
    a, b = np.ravel(a), np.ravel(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_auto_meets_cosine_and_score_budget_with_fewer_bits(data):
    seq = _seq()
    mlp = offload.nn.MLP.from_float(seq, calib=data, precision="auto", cos_threshold=0.999, budget=0.01)
    rep = mlp.report
    # Recomputed independently of the search: the torch float model's per-layer outputs against
    # the simulator's trace, on the whole calibration set.
    from offload.sim.mlp import forward

    _, steps = forward(mlp.spec.input_type, mlp.spec.layers, mlp.spec.tensors(), data, trace=True)
    h = torch.from_numpy(data)
    mods = [m for m in seq if not isinstance(m, (torch.nn.Dropout, torch.nn.Identity))]
    with torch.no_grad():
        for m, (name, raw, t) in zip(mods, steps[1:]):
            h = m.double()(h) if isinstance(m, torch.nn.Linear) else m(h)
            assert _cosine(t.to_float(raw), h.numpy()) >= 0.999, name
    y = mlp.simulate(data)
    with torch.no_grad():
        y_float = _seq().double()(torch.from_numpy(data)).numpy()
    assert float(np.max(np.abs(y - y_float))) <= 0.01
    assert rep.metric == "max_abs_error" and rep.after <= 0.01 and rep.budget == 0.01
    assert rep.search["feasible"] and rep.search["total_bits"] < rep.search["total_bits_widest"]
    assert [r.name for r in rep.layers] == ["input"] + [layer.name for layer in mlp.spec.layers]
    for r in rep.layers:
        assert r.cosine >= 0.999 and 0.0 <= r.saturated <= 1.0 and r.observed_min <= r.observed_max
    dense = [r for r in rep.layers if r.op == "dense"]
    assert all({"weight", "bias", "accum", "result"} <= set(r.types) for r in dense)


def test_a_tighter_budget_keeps_wider_formats(data):
    seq = _seq()
    loose = offload.nn.MLP.from_float(seq, calib=data, budget=0.05, cos_threshold=0.99)
    tight = offload.nn.MLP.from_float(seq, calib=data, budget=0.002, cos_threshold=0.9999)
    assert tight.report.search["total_bits"] > loose.report.search["total_bits"]
    assert tight.report.after <= 0.002 and loose.report.after <= 0.05


def test_labels_switch_the_budget_to_auc_drop(data):
    seq = _seq()
    with torch.no_grad():
        p = seq(torch.from_numpy(data).float()).numpy().ravel()
    labels = (np.random.default_rng(1).random(len(p)) < p).astype(float)
    mlp = offload.nn.MLP.from_float(seq, calib=data, labels=labels)
    rep = mlp.report
    assert rep.metric == "auc"
    assert math.isclose(rep.before, auc(labels, p), abs_tol=1e-6)
    assert rep.before - rep.after <= rep.budget == 0.002
    assert math.isclose(rep.after, auc(labels, mlp.simulate(data)[:, 0]))


def test_auc_handles_ties():
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5


def test_drift_warning_names_the_features(data):
    ref = np.random.default_rng(5).normal(size=(2000, 12))
    shifted = data.copy()
    shifted[:, 3] += 1.5
    shifted[:, 7] *= 4
    with pytest.warns(CalibrationDriftWarning, match=r"feature 3 .*feature 7|feature 7 .*feature 3") as rec:
        offload.nn.MLP.from_float(_seq(), calib=shifted, reference=ref)
    assert "feature 0" not in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationDriftWarning)
        stats = check_drift(data, ref)
    assert max(stats.values()) < 0.2


def test_report_prints_and_saves(data, tmp_path):
    mlp = offload.nn.MLP.from_float(_seq(), calib=data)
    text = str(mlp.report)
    for col in ("observed min", "accum", "cosine", "saturated", "fc0", "sigmoid5", "max_abs_error"):
        assert col in text
    saved = json.loads(mlp.report.save_json(tmp_path / "q.json").read_text())
    assert saved["layers"][1]["types"]["weight"] == str(mlp.spec.layers[0].weight)
    png = mlp.report.save_png(tmp_path / "q.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_huge_calibration_ranges_trade_fraction_bits_for_integer_bits():
    seq = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = np.random.default_rng(0).normal(size=(500, 4)) * 1e9
    mlp = offload.nn.MLP.from_float(seq, calib=x)
    assert mlp.report.search["feasible"]
    with torch.no_grad():
        ref = seq.double()(torch.from_numpy(x)).numpy()
    assert float(np.max(np.abs(mlp.simulate(x) - ref))) <= mlp.report.budget

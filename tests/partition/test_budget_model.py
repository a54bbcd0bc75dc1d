"""The model-level budget: offload.offload(..., holdout=(batches, labels), budget={metric: limit}).

Two tables feed the output with very different gains, so narrowing one costs the output a
thousand times more than narrowing the other: the search must keep the sensitive one wide, narrow
the other, and put back on the host what no precision offloads within the budget.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import offload
from offload.partition.accuracy import TABLE_WIDTHS
from offload.quant.metrics import auc
from offload.sim.errors import InputError, OffloadError


class TwoTables(nn.Module):
    def __init__(self, gain_a: float, gain_b: float, seed: int = 0, sigmoid: bool = True):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.EmbeddingBag(200, 8, mode="sum")
        self.b = nn.EmbeddingBag(300, 8, mode="sum")
        self.gain_a, self.gain_b, self.sigmoid = gain_a, gain_b, sigmoid

    def forward(self, ia, oa, ib, ob):
        s = self.gain_a * self.a(ia, oa).sum(1) + self.gain_b * self.b(ib, ob).sum(1)
        return s.sigmoid() if self.sigmoid else s


def _batch(seed: int, n: int = 256):
    g = torch.Generator().manual_seed(seed)
    ia = torch.randint(0, 200, (n * 3,), generator=g)
    ib = torch.randint(0, 300, (n * 2,), generator=g)
    return (ia, torch.arange(0, n * 3, 3), ib, torch.arange(0, n * 2, 2))


def _labels(model, batches, seed=9):
    with torch.no_grad():
        p = torch.cat([model(*b) for b in batches])
    return (torch.rand(p.shape, generator=torch.Generator().manual_seed(seed)) < p).float()


def _scores(m, batches):
    with torch.no_grad():
        return torch.cat([m(*b) for b in batches]).double().numpy()


def _unit(rep, name):
    return next(u for u in rep.search.units if u.unit == name)


def test_sensitive_table_stays_wide_the_other_is_narrowed_and_the_budget_holds():
    model = TwoTables(gain_a=4.0, gain_b=0.004).eval()
    calib = [_batch(1)]
    hold = [_batch(2), _batch(3)]
    limit = 2e-4
    gm = offload.offload(model, calib[0], calib=calib, holdout=(hold, None), budget={"max_abs_err": limit}, batch_tables=False)
    rep = gm.offload_report
    assert set(rep.budget) == {"metric", "limit", "measured", "met"}
    # measured is the final model's figure on the holdout, recomputed here from its outputs
    err = float(np.max(np.abs(_scores(gm, hold) - _scores(model, hold))))
    assert rep.budget["metric"] == "max_abs_err" and rep.budget["limit"] == limit
    assert rep.budget["measured"] == pytest.approx(err, rel=0, abs=0) and rep.budget["met"] is True and err <= limit
    a, b = _unit(rep, "offload_a"), _unit(rep, "offload_b")
    assert b.chosen == b.rungs[0]  # the insensitive table at the cheapest rung
    assert a.rungs.index(a.chosen) > 0  # the sensitive one kept wider
    assert a.sensitivity > b.sensitivity
    assert all(d.offloaded for d in rep.decisions)
    assert f"ap_fixed<{TABLE_WIDTHS[0]}" in rep.decision("b").reason and "budget search" in rep.decision("b").reason
    assert "model-level budget" in str(rep)


def test_what_no_precision_offloads_within_the_budget_stays_on_the_host_with_why():
    # Table a's output gain makes even 24-bit entries miss 1e-5; b's error is far below it at 8 bits.
    model = TwoTables(gain_a=4e4, gain_b=1e-3, sigmoid=False).eval()
    hold = [_batch(2)]
    gm = offload.offload(model, _batch(1), holdout=(hold, None), budget={"max_abs_err": 1e-5}, batch_tables=False)
    rep = gm.offload_report
    assert rep.budget["met"] is True
    da, db = rep.decision("a"), rep.decision("b")
    assert not da.offloaded and "kept on the host" in da.reason and "max_abs_err" in da.reason
    assert db.offloaded
    assert _unit(rep, "offload_a").chosen == "host"
    assert isinstance(gm.get_submodule("offload_a"), nn.EmbeddingBag)  # the float table runs it
    assert [k.name for k in gm.offload_kernels()] == ["offload_b"]


def test_auc_budget_on_labels_and_measured_matches_the_final_model():
    model = TwoTables(gain_a=2.0, gain_b=1.0).eval()
    hold = [_batch(s, 512) for s in (5, 6)]
    labels = _labels(model, hold)
    gm = offload.offload(model, _batch(1), calib=[_batch(1)], holdout=(hold, labels), budget={"auc_drop": 0.001})
    b = gm.offload_report.budget
    y = labels.numpy()
    drop = auc(y, _scores(model, hold)) - auc(y, _scores(gm, hold))
    assert b["metric"] == "auc_drop" and b["measured"] == pytest.approx(drop, abs=1e-12) and b["met"] == (drop <= 0.001)
    assert b["met"]


def test_holdout_without_budget_measures_and_chooses_nothing():
    model = TwoTables(1.0, 1.0).eval()
    gm = offload.offload(model, _batch(1), holdout=([_batch(2)], None))
    b = gm.offload_report.budget
    assert b["limit"] is None and b["met"] is None and b["measured"] > 0
    assert "ap_fixed<16,6>" in gm.offload_report.decision("a").reason  # the fmt asked for, untouched


@pytest.mark.parametrize("kwargs, match", [
    ({"budget": {"auc_drop": 0.001}}, "holdout"),
    ({"holdout": ([_batch(2)], None), "budget": {"auc_drop": 0.001}}, "labels"),
    ({"holdout": ([_batch(2)], None), "budget": {"auc": 0.001}}, "metric"),
    ({"holdout": ([_batch(2)], None), "budget": {"max_abs_err": -1.0}}, "max_abs_err"),
    ({"holdout": ([_batch(2)], None), "budget": {"max_abs_err": float("nan")}}, "max_abs_err"),
])
def test_bad_budget_arguments_are_refused_naming_the_field(kwargs, match):
    with pytest.raises(OffloadError, match=match):
        offload.offload(TwoTables(1.0, 1.0).eval(), _batch(1), **kwargs)


def test_holdout_identical_to_calibration_is_refused():
    model = TwoTables(1.0, 1.0).eval()
    calib = [_batch(1), _batch(2)]
    with pytest.raises(InputError, match="holdout: batch 1 is identical to calibration batch 0") as e:
        offload.offload(model, calib[0], calib=calib, holdout=([_batch(3), _batch(1)], None), budget={"max_abs_err": 1.0})
    assert isinstance(e.value, ValueError)
    # calib omitted: the example inputs are the calibration data
    with pytest.raises(InputError, match="identical"):
        offload.offload(model, _batch(1), holdout=([_batch(1)], None), budget={"max_abs_err": 1.0})


def test_labels_must_match_the_scored_rows():
    model = TwoTables(1.0, 1.0).eval()
    with pytest.raises(InputError, match="labels"):
        offload.offload(model, _batch(1), holdout=([_batch(2)], torch.tensor([0.0, 1.0] * 10)), budget={"auc_drop": 0.01})

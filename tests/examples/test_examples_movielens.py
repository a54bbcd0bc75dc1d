"""MovieLens-100k end to end: a DLRM trained on real ratings, offloaded, scored on held-out users."""

from __future__ import annotations

import numpy as np
import pytest

data = pytest.importorskip("offload.data")
try:
    data.packaged_path("MovieLens100k_data")
except ImportError as e:  # the data extra is optional
    pytest.skip(str(e), allow_module_level=True)


@pytest.fixture(scope="module")
def trained():
    from offload.examples.movielens import build

    return build(epochs=1)


def test_users_are_split_not_ratings(trained):
    _, f, rows = trained
    users = {k: set(np.unique(f.user[r])) for k, r in rows.items()}
    assert not (users["train"] & users["holdout"]) and not (users["train"] & users["test"]) and not (users["holdout"] & users["test"])
    assert sum(len(r) for r in rows.values()) == 100_000


def test_tables_offloaded_in_one_call_and_auc_kept_on_test_users(trained):
    from offload.examples.movielens import TABLES, run

    res = run(trained=trained, ops=("embedding_bag",))
    assert res.auc_float > 0.65  # learned something real from the ratings
    assert len(res.report.offloaded) == len(TABLES) and len(res.report.batches) == 1
    # ap_fixed<16,6> tables (10 fraction bits) move scores far less than an AUC budget notices
    assert abs(res.auc_drop) <= 0.002, (res.auc_float, res.auc_offload)
    assert "test users" in res.summary()


@pytest.mark.slow
def test_everything_offloaded_within_the_budget():
    from offload.examples.movielens import run

    res = run(budget={"auc_drop": 0.002})
    b = res.report.budget
    assert b["met"] and b["measured"] <= 0.002
    from offload.partition.find import SCORE_SIGMOID_REASON

    cands = [d for d in res.report.decisions if d.kind in ("embedding_bag", "mlp")]
    assert len(cands) == 7 and all(d.offloaded for d in cands)  # five tables and both MLP chains
    # the output sigmoid, all that stays on the host, with why
    assert [(d.kind, d.reason) for d in res.report.decisions if not d.offloaded] == [("sigmoid", SCORE_SIGMOID_REASON)]
    assert "7 of 7 candidates offloaded (on the host: top_5 (sigmoid))" in res.summary()
    assert {u.kind for u in res.report.search.units} == {"embedding_bag", "mlp"}
    assert res.auc_drop <= 0.002, (res.auc_float, res.auc_offload)  # users neither calibration nor the search saw

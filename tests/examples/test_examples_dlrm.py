"""The DLRM example end to end on the sim device: tables offloaded as one batched call, dense part on the host."""

from __future__ import annotations

import pytest
import torch

LSB = 2.0**-10  # ap_fixed<16,6> tables: 10 fractional bits


@pytest.fixture(scope="module")
def small_run():
    from offload.examples.dlrm import run

    return run(small=True, steps=80, n_eval=2048)


def test_tables_offloaded_as_one_batched_call_dense_part_untouched(small_run):
    res = small_run
    rep = res.report
    tables = [d for d in rep.decisions if d.kind == "embedding_bag"]
    assert len(tables) == 8 and all(d.offloaded for d in tables)
    assert rep.batches == [tuple(f"tables_{i}" for i in range(8))]
    assert all(d.kind == "embedding_bag" for d in rep.decisions)  # ops=("embedding_bag",): MLPs are not candidates
    gm, model = res.offloaded, res.model
    for name in ("bottom.0", "bottom.2", "top.0", "top.4"):
        assert gm.get_submodule(name) is model.get_submodule(name)  # same float module, same device
    assert res.outputs_device == "cpu"


def test_per_table_error_within_the_quantization_bound(small_run):
    res = small_run
    data = res.test_data
    local = {d.name: d for d in res.comparison.local}
    assert len(local) == 8
    for t, (idx, off) in enumerate(zip(data.indices, data.offsets)):
        lens = torch.diff(torch.cat([off, off.new_tensor([len(idx)])]))
        longest = int(lens.max())
        # Sum of `longest` entries each off by < 1 LSB (truncation to ap_fixed<16,6>; the sum is exact
        # in the wide accumulator), plus the float32 reference's rounding (|values| < 4).
        bound = longest * LSB + longest * 4 * 2.0**-24
        d = local[f"offload_tables_0[{t}]"]
        assert 0 < d.max_abs_err <= bound, (t, d, bound)


def test_auc_float_vs_offloaded(small_run):
    res = small_run
    assert res.auc_float > 0.65  # learned the teacher's signal
    # Acceptance: quantizing the tables costs at most 0.01 AUC on held-out impressions.
    assert res.auc_offload >= res.auc_float - 0.01, (res.auc_float, res.auc_offload)
    assert res.comparison.min_cosine > 0.999
    assert "AUC float" in res.summary()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dense_part_on_the_gpu_outputs_land_on_the_gpu():
    from offload.examples.dlrm import run

    res = run(small=True, steps=20, n_eval=512, dense_device="cuda")
    assert res.outputs_device.startswith("cuda")
    assert next(res.offloaded.get_submodule("top.0").parameters()).is_cuda
    assert all(d.offloaded for d in res.report.decisions)
    assert res.comparison.min_cosine > 0.999


@pytest.mark.slow
def test_full_size_tables_offload_within_bounds():
    """10^4..10^6-row tables at dim 32 (about 330 MB of float tables): all offloaded in one call, every bag
    within its bound, AUC kept."""
    from offload.examples.dlrm import run

    res = run(small=False, steps=60, n_eval=2048)
    assert max(res.model.tables[i].num_embeddings for i in range(8)) == 10**6
    assert len(res.report.batches) == 1 and len(res.report.offloaded) == 8
    data = res.test_data
    local = {d.name: d for d in res.comparison.local}
    for t, (idx, off) in enumerate(zip(data.indices, data.offsets)):
        longest = int(torch.diff(torch.cat([off, off.new_tensor([len(idx)])])).max())
        assert local[f"offload_tables_0[{t}]"].max_abs_err <= longest * LSB + longest * 4 * 2.0**-24
    assert res.comparison.min_cosine > 0.999
    assert res.auc_float > 0.65 and res.auc_offload >= res.auc_float - 0.01, (res.auc_float, res.auc_offload)



def test_summary_counts_tables_and_calls_and_calibration_is_training_data(small_run):
    s = small_run.summary()
    assert "8 tables offloaded (1 table-batched call)" in s, s
    assert "calibrated on 2048 training impressions" in s and "2048 test impressions" in s


@pytest.fixture(scope="module")
def budget_run():
    from offload.examples.dlrm import run

    return run(small=True, steps=80, n_eval=2048, ops=("embedding_bag", "mlp"), budget={"auc_drop": 0.001})


@pytest.mark.slow
def test_tables_and_mlps_under_an_auc_budget(budget_run):
    # The budget holds on the holdout with the tables (one batched call) and both MLP chains
    # offloaded; the top chain ends at the logit, its sigmoid (the scored output) on the host.
    from offload.partition.find import SCORE_SIGMOID_REASON

    res = budget_run
    b = res.report.budget
    assert set(b) == {"metric", "limit", "measured", "met"} and b["metric"] == "auc_drop" and b["limit"] == 0.001
    assert b["met"] and b["measured"] <= 0.001
    cands = [d for d in res.report.decisions if d.kind in ("embedding_bag", "mlp")]
    assert all(d.offloaded for d in cands), [d.reason for d in cands]
    sig = [d for d in res.report.decisions if d.kind == "sigmoid"]
    assert len(sig) == 1 and not sig[0].offloaded and sig[0].reason == SCORE_SIGMOID_REASON
    kinds = sorted(u.kind for u in res.report.search.units)
    assert kinds == ["embedding_bag", "mlp", "mlp"]
    # A unit kept on the host is never narrowed, so it has no sensitivity; every other has both.
    assert all(u.sensitivity is not None and u.local_cosine is not None for u in res.report.search.units if not u.reason.startswith("kept on the host"))
    s = res.summary()
    assert "8 tables offloaded (1 table-batched call)" in s and "held-out auc_drop" in s
    # the test impressions were seen by neither calibration nor the search: a looser check there
    assert res.auc_offload >= res.auc_float - 0.005, (res.auc_float, res.auc_offload)

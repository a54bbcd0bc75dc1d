"""offload.advise: analytical model properties, card budgets, validation against a real HLS report, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner

import offload
from offload.advisor.model import dsp_per_mult, predict_lookup, predict_mlp, transfer_s
from offload.advisor.validate import check_autoencoder
from offload.cli import main
from offload.hls.cards import CARDS

AUTOENCODER_RPT = Path(__file__).resolve().parents[1] / "fixtures" / "hls-reports" / "vivado-2019.2-hls4ml-autoencoder" / "myproject_csynth.rpt"


def test_dsp_per_mult_tiles_the_dsp_multiplier():
    assert dsp_per_mult(16, 16) == 1    # fits 27x18
    assert dsp_per_mult(27, 18) == 1
    assert dsp_per_mult(28, 18) == 2
    assert dsp_per_mult(32, 32) == 4    # 2 x 2 tiles of 27x18
    assert dsp_per_mult(32, 32, 25, 18) == 4


def test_mlp_prediction_scales_with_reuse_and_batch():
    card = CARDS["u55c"]
    sizes = [64, 128, 64, 1]
    weights = 64 * 128 + 128 * 64 + 64
    p1 = predict_mlp(card, sizes, batch=1, reuse_factor=1)
    assert p1.resources["DSP"] == weights  # one 16x16 multiplier (1 DSP) per weight at reuse 1
    p4 = predict_mlp(card, sizes, batch=1, reuse_factor=4)
    assert p4.resources["DSP"] == sum(math.ceil(i * o / 4) for i, o in zip(sizes[:-1], sizes[1:]))
    assert p4.kernel_cycles > p1.kernel_cycles
    # Pipelined: each extra sample costs II = max(reuse, input beats) cycles, not a full latency.
    pb = predict_mlp(card, sizes, batch=1001, reuse_factor=4)
    assert pb.kernel_cycles - p4.kernel_cycles == 1000 * 4
    # Transfers: the slope against the link's datasheet rate, not the model's own constant. PCIe Gen3
    # x16 (DS978, the U55C data sheet; the PCI-SIG Base Specification 3.0: 8 GT/s a lane, 128b/130b
    # encoding) moves 8e9 * 16 * 128/130 / 8 = 15.75 GB/s raw each way. hls/cards.py takes 12 GB/s
    # for DMA, "~76 % of raw": the modelled rate must be that fraction of the datasheet figure, and
    # never above the raw rate.
    raw_bps = 8e9 * 16 * (128 / 130) / 8
    t1, t2 = transfer_s(card, [1000], [0]), transfer_s(card, [1_001_000], [0])
    modelled_bps = 1e6 / (t2 - t1)
    assert modelled_bps <= raw_bps
    assert modelled_bps / raw_bps == pytest.approx(0.76, abs=0.005)


def test_lookup_prediction_parallel_channels_and_memory_budget():
    card = CARDS["u55c"]
    big = 10_000_000  # rows: 640 MB at 64 B a row, far past URAM -> HBM
    one = predict_lookup(card, [40_000], [64], 4096, dims=[4], rows_per_table=[big])
    eight = predict_lookup(card, [40_000] * 8, [64] * 8, 4096, dims=[4] * 8, rows_per_table=[big] * 8)
    # 8 tables in 8 channels run in parallel (narrow outputs: the write stream is not the bottleneck).
    assert eight.kernel_s == pytest.approx(one.kernel_s, rel=0.01)
    assert eight.resources["HBM_bytes"] == 8 * big * 64
    # 40 tables share 32 channels: the busiest channel serves 2 tables, twice the time.
    forty = predict_lookup(card, [40_000] * 40, [64] * 40, 4096, dims=[4] * 40, rows_per_table=[big] * 40)
    assert forty.kernel_s == pytest.approx(2 * one.kernel_s, rel=0.05)
    # A small table goes on chip (URAM) and costs no HBM.
    small = predict_lookup(card, [40_000], [64], 4096, dims=[32], rows_per_table=[10_000])
    assert small.resources["HBM_bytes"] == 0 and small.resources["URAM"] > 0
    # Over the card's memory: the advisor must say so.
    u50 = CARDS["u50"]
    huge = predict_lookup(u50, [10], [64], 1, dims=[32], rows_per_table=[u50.memory_bytes // 64 + 1])
    assert huge.resources["HBM_bytes"] > u50.memory_bytes


class _Ranker(nn.Module):
    def __init__(self, mlp_width: int = 32):
        super().__init__()
        self.bag = nn.EmbeddingBag(5000, 16, mode="sum")
        self.bag2 = nn.EmbeddingBag(3000, 16, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(32, mlp_width), nn.ReLU(), nn.Linear(mlp_width, 1))

    def forward(self, i, o, j, p):
        return self.mlp(torch.cat([self.bag(i, o), self.bag2(j, p)], 1))


def _ranker_inputs(batch=64, pool=4):
    g = torch.Generator().manual_seed(0)
    off = torch.arange(0, batch * pool, pool)
    return (torch.randint(0, 5000, (batch * pool,), generator=g), off, torch.randint(0, 3000, (batch * pool,), generator=g), off)


def test_advise_measures_and_predicts_every_candidate():
    adv = offload.advise(_Ranker().eval(), _ranker_inputs(), batch_sizes=(1, 256), card="u280", repeats=5, budget_s=0.05)
    names = {r.name for r in adv.rows}
    assert names == {"bag", "bag2", "mlp_0..mlp_2", "all 2 tables (batched)"}
    assert len(adv.rows) == 4 * 2
    for r in adv.rows:
        assert r.host_s > 0 and r.card_s > 0 and r.verdict in ("offload", "keep")
        assert r.fits
        assert (r.verdict == "offload") == (r.card_s < r.host_s)
    k = {(r.name, r.batch): r for r in adv.rows}
    assert k[("bag", 256)].kernel_s > k[("bag", 1)].kernel_s  # 4 x more lookups
    assert "u280" in str(adv) and "DS963" in str(adv)
    json.dumps(adv.to_dict())  # serialisable
    assert adv.verdict("bag", 1) == k[("bag", 1)].verdict
    with pytest.raises(KeyError):
        adv.verdict("nope", 1)


def test_advise_says_keep_when_the_mlp_does_not_fit_the_card():
    # 32 -> 4096 -> 1 at reuse 1 needs 32*4096 + 4096 = 135,168 DSPs; a U50 has 5,952.
    adv = offload.advise(_Ranker(mlp_width=4096).eval(), _ranker_inputs(), batch_sizes=(64,), card="u50", ops=("mlp",), repeats=3, budget_s=0.02)
    (row,) = adv.rows
    assert not row.fits and row.verdict == "keep" and "DSP" in row.why


def test_advise_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_sizes"):
        offload.advise(_Ranker(), _ranker_inputs(), batch_sizes=(0,))
    with pytest.raises(ValueError, match="fmt"):
        offload.advise(_Ranker(), _ranker_inputs(), fmt="float16")


def test_model_against_the_real_hls_report():
    """Predicted worst-case latency and DSPs of the hls4ml autoencoder's convolutions (Vivado HLS 2019.2
    report) within a factor 2 of the report: the model is an estimate, but it must be of the right size."""
    checks = check_autoencoder(AUTOENCODER_RPT)
    assert len(checks) == 7
    # Read off the report by hand ("Detail: Instance" tables): conv config20 max latency 95948
    # cycles and 2 DSP48E; config2 23120 cycles and 30 DSP48E.
    by_name = {c.name: c for c in checks}
    assert (by_name["conv config20"].reported_cycles, by_name["conv config20"].reported_dsp) == (95948, 2)
    assert (by_name["conv config2"].reported_cycles, by_name["conv config2"].reported_dsp) == (23120, 30)
    for c in checks:
        assert 0.5 <= c.cycles_ratio <= 2.0, c
        assert 0.5 <= c.dsp_ratio <= 2.0, c
    total_pred = sum(c.predicted_dsp for c in checks)
    total_rep = sum(c.reported_dsp for c in checks)
    assert total_rep == 118  # the report's DSP total: every DSP of the design is in a convolution
    assert 0.8 <= total_pred / total_rep <= 1.25


def test_cli_advise_json():
    res = CliRunner().invoke(main, ["advise", "risk", "--batch-sizes", "1,32", "--card", "u250", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["card"]["name"] == "u250" and data["batch_sizes"] == [1, 32]
    # The card budget keeps its flat keys; U250 per DS962: 64 GB DDR4 in 4 channels, no HBM, 12,288 DSP.
    assert data["card"] == {"name": "u250", "datasheet": "DS962", "dsp": 12288, "bram36": 2688, "uram": 1280, "lut": 1_728_000,
                            "hbm_bytes": 0, "hbm_channels": 0, "hbm_channel_bps": 0.0, "ddr_bytes": 64 << 30, "ddr_channels": 4,
                            "pcie_bps": 12e9, "kernel_clock_hz": 300e6}
    assert {r["kind"] for r in data["rows"]} == {"mlp"} and len(data["rows"]) == 2
    bad = CliRunner().invoke(main, ["advise", "risk", "--batch-sizes", "0"])
    assert bad.exit_code != 0 and "batch" in bad.output
    unknown = CliRunner().invoke(main, ["advise", "nosuchmodel"])
    assert unknown.exit_code != 0 and "nosuchmodel" in unknown.output


def test_advise_functional_bags_and_batch_groups():
    """F.embedding_bag (offsets passed as a keyword by FX) is measured too; only same dim/mode bags
    are grouped into a batched row, as offload.offload would batch them."""
    import torch.nn.functional as F

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.EmbeddingBag(100, 8, mode="sum")
            self.b = nn.EmbeddingBag(200, 8, mode="sum")
            self.w = nn.Parameter(torch.randn(50, 8))

        def forward(self, i, o):
            return self.a(i, o) + self.b(i, o) + F.embedding_bag(i % 50, self.w, o, mode="mean")

    i, o = torch.randint(0, 100, (40,)), torch.arange(0, 40, 4)
    adv = offload.advise(Mixed().eval(), (i, o), batch_sizes=(8,), repeats=3, budget_s=0.01)
    names = {r.name for r in adv.rows}
    assert names == {"a", "b", "embedding_bag", "all 2 tables (batched)"}
    batched = next(r for r in adv.rows if "batched" in r.name)
    assert batched.shape == "a, b"

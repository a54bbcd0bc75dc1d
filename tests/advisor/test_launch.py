"""offload.advise's launch modes: per-call xrt::run against a persistent kernel polling host memory.

Expected figures are worked out here from the published numbers the card model cites, not read
from the model's own constants:

- per-call: XRT kernel launch 50 us, the low end of the 50-100 us reported on a U55C with Vitis
  2022.1 (Xilinx/XRT issue #8687); every buffer sync 10 us (the fixed cost hls/cards.py assumes).
- persistent: a small host -> card -> host round trip, the largest of the 64/128/256 B readings of
  Coyote's perf_local with the HOST data stream in fpgasystems/Coyote issue #161; the kernel loop's
  poll interval assumed to be one such round trip (one small host-memory read a poll, charged in
  full).
- bytes over PCIe Gen3 x16 at the DMA rate hls/cards.py assumes: 12 GB/s, ~76 % of the 15.75 GB/s
  raw rate (8 GT/s x 16 lanes x 128b/130b; DS978).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner

import offload
from offload.advisor import model as card_model
from offload.advisor.model import predict_lookup, predict_mlp
from offload.cli import main
from offload.examples.risk import make_transactions
from offload.hls.cards import CARDS
from offload.hls.rtl import RtlSummary
from offload.sim.errors import InputError, InputTypeError, OffloadError

US = 1e-6
# fpgasystems/Coyote issue #161, `bin/test -s 1 -h 1 -m 0` and `-m 1` (HOST stream, 50 runs), 64/128/256 B.
COYOTE_161_HOST_US = {"-m 0": (3.00698, 3.02904, 3.06628), "-m 1": (3.56208, 3.80692, 3.10088)}
ROUND_TRIP_S = max(max(v) for v in COYOTE_161_HOST_US.values()) * US
POLL_S = ROUND_TRIP_S
XRT_8687_LAUNCH_S = 50 * US
SYNC_S = 10 * US
DMA_BPS = 12e9
CLOCK_HZ = 300e6  # the Vitis default kernel clock of the U55C platform

# The risk MLP at batch 1: 16 float32 features in (64 B, one 512-bit AXI beat), one 64-bit score out.
RISK_IN_B, RISK_OUT_B = 16 * 4, 8


@pytest.fixture
def one_thread():
    """Host timings on one torch thread: the verdicts compare them with microseconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _risk():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid()).eval()
    x, _ = make_transactions(256)
    return mlp, (torch.from_numpy(x),)


def _advise(launch, **kw):
    model, inputs = _risk()
    return offload.advise(model, inputs, batch_sizes=(1,), card="u55c", ops=("mlp",), repeats=15, budget_s=0.1, launch=launch, **kw)


def test_persistent_flips_the_risk_mlp_at_batch_1_on_u55c(one_thread):
    per_call, persistent = _advise("per_call").rows[0], _advise("persistent").rows[0]
    kernel = per_call.kernel_s
    assert persistent.kernel_s == kernel and 0 < kernel < 1 * US  # tens of cycles at 300 MHz
    wire = (RISK_IN_B + RISK_OUT_B) / DMA_BPS
    # Per call: two buffer syncs, one launch.
    assert per_call.launch == "per_call"
    assert per_call.transfer_s == pytest.approx(2 * SYNC_S + wire, rel=1e-9)
    assert per_call.launch_s == pytest.approx(XRT_8687_LAUNCH_S, rel=1e-9)
    # Persistent: one round trip with the bytes, one poll interval, no launch, no sync.
    assert persistent.launch == "persistent"
    assert persistent.transfer_s == pytest.approx(ROUND_TRIP_S + wire, rel=1e-9)
    assert persistent.launch_s == pytest.approx(POLL_S, rel=1e-9)
    assert persistent.card_s == pytest.approx(2 * ROUND_TRIP_S + wire + kernel, rel=1e-9)
    assert persistent.card_s <= 10 * US  # the goal for the risk MLP at batch 1
    # The flip needs a host between the two: a 3-layer torch MLP at batch 1 takes tens of microseconds.
    for row in (per_call, persistent):
        assert persistent.card_s < row.host_s < per_call.card_s, (row.host_s, persistent.card_s, per_call.card_s)
    assert per_call.verdict == "keep" and "per_call" in per_call.why
    assert persistent.verdict == "offload" and "persistent" in persistent.why and "modelled" in persistent.why
    # Each row carries both modes whichever the verdict uses.
    assert per_call.modes["persistent"]["card_s"] == pytest.approx(persistent.card_s, rel=1e-9)
    assert persistent.modes["per_call"]["card_s"] == pytest.approx(per_call.card_s, rel=1e-9)


def test_kernel_time_from_measured_rtl_cycles_in_both_modes():
    # BENCHMARKS.md's RTL tier: the risk MLP's da4ml pipeline measured 10 cycles under Verilator.
    rtl = RtlSummary(latency_cycles=10, clock_mhz=300.0, stages=9, da4ml_cost_lut=17859.0,
                     resources={"LUT": 16459, "FF": 3952, "CARRY": 0, "DSP": 0, "BRAM": 0})
    card = CARDS["u55c"]
    for launch in ("per_call", "persistent"):
        p = predict_mlp(card, [16, 32, 16, 1], 1, rtl_cycles=10, rtl_resources=rtl.resources, launch=launch)
        assert p.kernel_cycles == 10 + 1  # the pipeline's 10 cycles after the input row's one AXI beat
        assert p.kernel_s == pytest.approx(11 / CLOCK_HZ, rel=1e-12)
        # Back-to-back rows enter at the II the RTL reports (1 unless told otherwise).
        assert predict_mlp(card, [16, 32, 16, 1], 101, rtl_cycles=10, launch=launch).kernel_cycles == 11 + 100
        assert predict_mlp(card, [16, 32, 16, 1], 101, rtl_cycles=10, rtl_ii_cycles=3, launch=launch).kernel_cycles == 11 + 300
    persistent = predict_mlp(card, [16, 32, 16, 1], 1, rtl_cycles=10, launch="persistent")
    assert persistent.total_s == pytest.approx(2 * ROUND_TRIP_S + (RISK_IN_B + RISK_OUT_B) / DMA_BPS + 11 / CLOCK_HZ, rel=1e-9)


def test_per_call_is_the_default_and_unchanged(one_thread):
    default, per_call = _risk_default(), _advise("per_call")
    a, b = default.rows[0], per_call.rows[0]
    assert default.launch == "per_call" and per_call.launch == "per_call"
    assert (a.transfer_s, a.launch_s, a.kernel_s, a.launch) == (b.transfer_s, b.launch_s, b.kernel_s, b.launch)
    # Lookups: three buffers (indices, offsets, output) synced and one launch, as before the modes existed.
    card = CARDS["u55c"]
    p = predict_lookup(card, [40], [32], 4, dims=[16], rows_per_table=[1000])
    assert p.launch == "per_call"
    assert p.launch_s == pytest.approx(XRT_8687_LAUNCH_S, rel=1e-9)
    assert p.transfer_s == pytest.approx(3 * SYNC_S + (40 * 4 + (4 + 1) * 4 + 4 * 16 * 8) / DMA_BPS, rel=1e-9)
    q = predict_lookup(card, [40], [32], 4, dims=[16], rows_per_table=[1000], launch="persistent")
    assert q.kernel_s == p.kernel_s
    assert q.transfer_s == pytest.approx(ROUND_TRIP_S + (40 * 4 + (4 + 1) * 4 + 4 * 16 * 8) / DMA_BPS, rel=1e-9)


def _risk_default():
    model, inputs = _risk()
    return offload.advise(model, inputs, batch_sizes=(1,), card="u55c", ops=("mlp",), repeats=3, budget_s=0.02)


def test_auto_picks_the_faster_mode_at_each_batch_size(one_thread, monkeypatch):
    model, inputs = _risk()
    adv = offload.advise(model, inputs, batch_sizes=(1, 64, 4096), card="u55c", ops=("mlp",), repeats=3, budget_s=0.02, launch="auto")
    assert adv.launch == "auto" and len(adv.rows) == 3
    for r in adv.rows:
        fastest = min(r.modes, key=lambda m: r.modes[m]["card_s"])
        assert r.launch == fastest and r.card_s == r.modes[fastest]["card_s"]
        assert r.card_s == min(m["card_s"] for m in r.modes.values())
        assert (r.verdict == "offload") == (r.card_s < r.host_s)
    # With the cited constants the persistent ring is the faster at every size; make a round trip
    # cost a second and auto must fall back to per-call.
    monkeypatch.setattr(card_model, "HOST_CARD_ROUND_TRIP_S", 1.0)
    slow = offload.advise(model, inputs, batch_sizes=(1, 4096), card="u55c", ops=("mlp",), repeats=3, budget_s=0.02, launch="auto")
    assert [r.launch for r in slow.rows] == ["per_call", "per_call"]
    assert all(r.modes["persistent"]["transfer_s"] > 1.0 for r in slow.rows)


def test_a_platform_without_host_memory_keeps_the_ring_in_card_memory():
    """The U50's gen3x4 shell is in host_memory_simple_xrt's platform blocklist (Vitis_Accel_Examples
    description.json): its ring is in card memory, written and read by DMA in the ring protocol's
    order (inputs, request word; response word, outputs: four syncs), and the kernel polls HBM."""
    import dataclasses

    gen3x4 = dataclasses.replace(CARDS["u50"], platform="xilinx_u50_gen3x4_xdma_2_202010_1")
    hbm_read_s = 150e-9  # the HBM random read latency hls/cards.py assumes (Shuhai's order, FCCM 2020)
    p = predict_mlp(gen3x4, [16, 32, 16, 1], 1, launch="persistent")
    assert p.transfer_s == pytest.approx(4 * SYNC_S + (RISK_IN_B + RISK_OUT_B) / DMA_BPS, rel=1e-9)
    assert p.launch_s == pytest.approx(hbm_read_s, rel=1e-9)
    # Still no launch, so still under the per-call figure; but far from the host-memory ring's.
    per_call = predict_mlp(gen3x4, [16, 32, 16, 1], 1)
    host_ring = predict_mlp(CARDS["u50"], [16, 32, 16, 1], 1, launch="persistent")
    assert host_ring.total_s < p.total_s < per_call.total_s
    model, inputs = _risk()
    adv = offload.advise(model, inputs, batch_sizes=(1,), card=gen3x4, ops=("mlp",), repeats=3, budget_s=0.02, launch="auto")
    assert any("card memory" in n and "u50_gen3x4" in n for n in adv.notes)


@pytest.mark.parametrize("bad, err, builtin", [("turbo", InputError, ValueError), ("Persistent", InputError, ValueError),
                                               (None, InputTypeError, TypeError), (1, InputTypeError, TypeError)])
def test_bad_launch_is_a_typed_error_naming_the_field(bad, err, builtin):
    model, inputs = _risk()
    for call in (lambda: offload.advise(model, inputs, batch_sizes=(1,), launch=bad),
                 lambda: predict_mlp(CARDS["u55c"], [16, 1], 1, launch=bad),
                 lambda: predict_lookup(CARDS["u55c"], [4], [32], 1, launch=bad)):
        with pytest.raises(err, match="launch") as info:
            call()
        assert isinstance(info.value, OffloadError) and isinstance(info.value, builtin)
    # "auto" is a choice of the advisor, not a launch mode of the card model.
    with pytest.raises(InputError, match="launch"):
        predict_mlp(CARDS["u55c"], [16, 1], 1, launch="auto")


def test_cli_shows_both_modes_and_says_persistent_is_modelled():
    runner = CliRunner()
    res = runner.invoke(main, ["advise", "risk", "--batch-sizes", "1,64", "--launch", "persistent", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["launch"] == "persistent"
    assert [r["launch"] for r in data["rows"]] == ["persistent", "persistent"]
    for r in data["rows"]:
        assert set(r["modes"]) == {"per_call", "persistent"}
        assert r["card_s"] == pytest.approx(r["modes"]["persistent"]["card_s"], rel=1e-12)
    assert any("persistent figures are MODELLED, not measured on a card" in n for n in data["notes"])
    assert any("#6601" in n and "#8687" in n for n in data["notes"]) and any("Coyote issue #161" in n for n in data["notes"])
    text = runner.invoke(main, ["advise", "risk", "--batch-sizes", "1"])  # default: auto, a table
    assert text.exit_code == 0, text.output
    assert "launch auto" in text.output and "MODELLED" in text.output and "per-call" in text.output
    bad = runner.invoke(main, ["advise", "risk", "--launch", "turbo"])
    assert bad.exit_code != 0 and "--launch" in bad.output

"""The open RTL tier: ``MLP.to_rtl`` -> da4ml Verilog -> Verilator (bit-exact, measured cycles) -> Yosys.

Small networks only (the Verilator builds are cached under $OFFLOAD_CACHE_DIR/rtl across runs;
Yosys runs on the smallest). Every row of every batch is compared bit for bit with
``mlp.simulate``.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from offload.hls.rtl import sim as rtl_sim
from offload.hls.rtl.yosys import parse_stat
from offload.nn import MLP
from offload.sim.errors import ToolchainMissing, UnsupportedError
from offload.sim.fixed import FixedType
from offload.sim.mlp import forward

pytestmark = pytest.mark.rtl


def _rows(mlp: MLP, rng: np.random.Generator, calib_scale: float = 1.0) -> np.ndarray:
    """Random rows, rows far outside calibration, the input type's extremes and rounding ties."""
    nf = mlp.spec.n_features
    t = FixedType.parse(mlp.spec.input_type)
    parts = [
        rng.normal(size=(300, nf)) * calib_scale,
        rng.normal(size=(100, nf)) * 50.0,  # far outside the calibration range: saturates every layer
        np.full((1, nf), t.max_float), np.full((1, nf), t.min_float), np.zeros((1, nf)),
        (np.floor(rng.normal(size=(40, nf)) / t.lsb) + 0.5) * t.lsb,  # ties
        rng.uniform(t.min_float, t.max_float, size=(200, nf)),  # the whole input code range
    ]
    return np.concatenate(parts)


def _seq_a() -> torch.nn.Sequential:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 8), torch.nn.LeakyReLU(0.1), torch.nn.Linear(8, 4), torch.nn.ReLU(),
        torch.nn.Linear(4, 1), torch.nn.Sigmoid(),
    )


def _trained_bn(seq: torch.nn.Sequential, x: np.ndarray) -> torch.nn.Sequential:
    seq.train()
    with torch.no_grad():
        seq(torch.from_numpy(x).float())
    return seq.eval()


@pytest.fixture(scope="module")
def net_a(tmp_path_factory):
    """BatchNorm (unfolded, first) + LeakyReLU + ReLU + Sigmoid, types from precision='auto'."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6)) * 2 + 0.5
    mlp = MLP.from_float(_trained_bn(_seq_a(), x), calib=x, precision="auto", device="sim")
    rtl = mlp.to_rtl(tmp_path_factory.mktemp("rtl_a"), clock_mhz=300)
    rtl.compile()
    return mlp, rtl


@pytest.fixture(scope="module")
def net_b(tmp_path_factory):
    """Tanh, a BatchNorm after an activation, truncating and wrapping types chosen by hand."""
    torch.manual_seed(2)
    seq = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 3), torch.nn.ReLU()).eval()
    with torch.no_grad():
        seq[2].running_mean.uniform_(-0.5, 0.5)
        seq[2].running_var.uniform_(0.5, 2.0)
        seq[2].weight.uniform_(0.5, 1.5)
    precision = {
        "input": "ap_fixed<8,3,AP_TRN,AP_WRAP>",
        "fc0": {"weight": "ap_fixed<6,1>", "bias": "ap_fixed<6,1>", "accum": "ap_fixed<24,10>", "result": "ap_fixed<9,4,AP_RND,AP_SAT_SYM>"},
        "tanh1": {"table": "ap_fixed<10,2>", "result": "ap_fixed<8,1,AP_TRN,AP_SAT>"},
        "bn2": {"scale": "ap_fixed<8,2>", "bias": "ap_fixed<8,2>", "result": "ap_fixed<8,3,AP_TRN,AP_WRAP>"},
        "fc3": {"weight": "ap_fixed<6,1>", "bias": "ap_fixed<6,1>", "accum": "ap_fixed<24,10>", "result": "ap_fixed<10,4,AP_RND,AP_WRAP>"},
        "relu4": "ap_ufixed<7,3,AP_RND,AP_SAT>",
    }
    mlp = MLP.from_float(seq, precision=precision, n_features=5, device="sim")
    rtl = mlp.to_rtl(tmp_path_factory.mktemp("rtl_b"), clock_mhz=250)
    rtl.compile()
    return mlp, rtl


@pytest.mark.parametrize("which", ["net_a", "net_b"])
def test_rtl_predict_equals_simulate_on_every_row(which, request):
    mlp, rtl = request.getfixturevalue(which)
    x = _rows(mlp, np.random.default_rng(7), calib_scale=2.0)
    got = rtl.predict(x)
    want = mlp.simulate(x)
    assert got.shape == want.shape and got.dtype == want.dtype == np.float64
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} mismatches, first at row {bad[0][0]}: rtl {got[tuple(bad[0])]} vs sim {want[tuple(bad[0])]}"
    # The rows exercise saturation / wrap-around: some layer's raw output sits at its type's extremes.
    _, steps = forward(mlp.spec.input_type, mlp.spec.layers, mlp.spec.tensors(), x, trace=True)
    assert any(((raw == t.max_raw) | (raw == t.min_raw)).any() for name, raw, t in steps if name != "input")


def _half_even_net() -> MLP:
    """Every cast rounds half to even (Brevitas's rounding), under each overflow mode; diagonal
    weights of 1 and -1 make every odd input code a tie (positive and negative) in fc0."""
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LeakyReLU(0.25), torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    with torch.no_grad():
        seq[0].weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, -1, 0, 0], [0, 0, 0.5, 0.25], [0.75, 0, 0, -0.5]]))
        seq[0].bias.copy_(torch.tensor([0.0, 0.03125, -0.03125, 0]))
        seq[2].weight.copy_(torch.tensor([[1.0, -1, 0, 0], [0, 0.5, -1, 0.5], [-0.75, 0, 1, 1]]))
        seq[2].bias.zero_()
    precision = {
        "input": "ap_fixed<10,4>",
        "fc0": {"weight": "ap_fixed<6,2>", "bias": "ap_fixed<8,2>", "accum": "ap_fixed<24,8>",
                "result": "ap_fixed<9,4,AP_RND_CONV,AP_SAT>"},
        "lrelu1": {"param": "ap_fixed<6,2>", "result": "ap_fixed<7,3,AP_RND_CONV,AP_WRAP>"},
        "fc2": {"weight": "ap_fixed<6,2>", "bias": "ap_fixed<6,2>", "accum": "ap_fixed<24,8>",
                "result": "ap_fixed<6,3,AP_RND_CONV,AP_SAT_SYM>"},
        "relu3": "ap_ufixed<3,2,AP_RND_CONV,AP_SAT>",
    }
    return MLP.from_float(seq, precision=precision, n_features=4, device="sim")


def test_rtl_round_half_even_is_bit_exact_on_every_input_code(tmp_path):
    """AP_RND_CONV (ties to even) in the RTL equals the ap_types reference on every input code of
    every lane, the type's extremes and random rows; ties really occur (AP_RND gives other values)."""
    mlp = _half_even_net()
    t = FixedType.parse(mlp.spec.input_type)
    rng = np.random.default_rng(0)
    codes = np.arange(t.min_raw, t.max_raw + 1)
    x = np.concatenate([np.stack([rng.permutation(codes) for _ in range(4)], axis=1) * t.lsb,
                        np.full((1, 4), t.max_float), np.full((1, 4), t.min_float), rng.normal(size=(200, 4)) * 4])
    got, want = mlp.to_rtl(tmp_path / "conv", clock_mhz=300).predict(x), mlp.simulate(x)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} mismatches, first at row {bad[0][0]}: rtl {got[tuple(bad[0])]} vs sim {want[tuple(bad[0])]}"
    # fc0 lane 0 is x0 with one fraction bit dropped: odd codes are ties, on both signs.
    odd = (codes % 2 == 1)
    assert (codes[odd] < 0).any() and (codes[odd] > 0).any()
    up_layers = tuple(dataclasses.replace(l, result=str(l.result).replace("AP_RND_CONV", "AP_RND")) for l in mlp.spec.layers)
    assert not np.array_equal(want, forward(mlp.spec.input_type, up_layers, mlp.spec.tensors(), x))
    # Saturation edges are reached: fc0 and fc2 hit their extremes.
    _, steps = forward(mlp.spec.input_type, mlp.spec.layers, mlp.spec.tensors(), x, trace=True)
    assert all(((raw == tt.max_raw) | (raw == tt.min_raw)).any() for name, raw, tt in steps if name in ("fc0", "fc2"))


def test_rtl_sigmoid_table_edges(net_a):
    """Inputs that walk the last dense layer's output across its whole code range hit every table entry."""
    mlp, rtl = net_a
    rng = np.random.default_rng(3)
    base = rng.normal(size=(1, 6))
    direction = rng.normal(size=(1, 6))
    x = base + np.linspace(-40, 40, 4001)[:, None] * direction
    got, want = rtl.predict(x), mlp.simulate(x)
    assert np.array_equal(got, want)
    assert len(np.unique(want)) > 20  # the walk really crosses the table


def test_rtl_latency_is_the_pipeline_depth_da4ml_reports(net_a, net_b):
    for mlp, rtl in (net_a, net_b):
        assert isinstance(rtl.latency_cycles, int)
        # One register before each of da4ml's stages plus the output register.
        assert rtl.latency_cycles == rtl.stages + 1 == rtl.pipeline_depth
        assert 1 <= rtl.stages <= 4 * len(mlp.spec.layers)
        assert rtl.latency_ns == pytest.approx(rtl.latency_cycles * 1000.0 / rtl.meta["clock_mhz"])


def test_misaligned_valid_line_is_caught(net_a, tmp_path):
    """A top whose valid line is one cycle short samples the wrong row: predict must disagree."""
    mlp, _ = net_a
    rtl = mlp.to_rtl(tmp_path / "short", clock_mhz=300)
    top = rtl.directory / "src" / "offload_top.v"
    depth = rtl.pipeline_depth
    text = top.read_text()
    assert f"assign out_valid = valid_q[{depth - 1}];" in text
    top.write_text(text.replace(f"assign out_valid = valid_q[{depth - 1}];", f"assign out_valid = valid_q[{depth - 2}];"))
    x = _rows(mlp, np.random.default_rng(11))
    got = rtl.compile().predict(x)
    assert rtl.latency_cycles == depth - 1
    assert not np.array_equal(got, mlp.simulate(x))


def test_higher_clock_never_gives_fewer_stages(net_a, tmp_path):
    mlp, rtl300 = net_a
    from offload.hls.rtl import emit

    slow = emit.trace_spec(mlp.spec, mlp.spec.tensors(), clock_mhz=100)
    fast = emit.trace_spec(mlp.spec, mlp.spec.tensors(), clock_mhz=600)
    assert slow.stages <= rtl300.stages <= fast.stages
    assert fast.stages > slow.stages


def test_report_shows_rtl_cycles(net_a):
    mlp, rtl = net_a
    rtl.predict(np.zeros((2, 6)))
    assert mlp.report.rtl is not None and mlp.report.rtl.latency_cycles == rtl.latency_cycles
    text = str(mlp.report)
    assert f"{rtl.latency_cycles} cycles" in text
    assert mlp.report.to_json()["rtl"]["latency_cycles"] == rtl.latency_cycles


def test_resources_from_yosys_have_no_dsp(tmp_path):
    """The smallest network: a 3-2 dense layer and a ReLU (Yosys is the slow part)."""
    torch.manual_seed(4)
    seq = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()).eval()
    x = np.random.default_rng(0).normal(size=(64, 3))
    mlp = MLP.from_float(seq, calib=x, precision="auto", device="sim")
    rtl = mlp.to_rtl(tmp_path / "tiny")
    res = rtl.resources()
    assert set(res) == {"LUT", "FF", "CARRY", "DSP", "BRAM"}
    assert res["DSP"] == 0 and res["BRAM"] == 0
    assert res["LUT"] > 0 and res["FF"] > 0
    assert np.array_equal(rtl.predict(x * 10), mlp.simulate(x * 10))


def test_narrow_saturating_accumulator_is_refused_with_the_layer_named(tmp_path):
    seq = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
    mlp = MLP.from_float(seq, precision={"default": "ap_fixed<8,3>", "fc0": {"accum": "ap_fixed<8,3,AP_TRN,AP_SAT>"}}, n_features=4,
                         device="sim")
    with pytest.raises(UnsupportedError, match="fc0.*saturates step by step"):
        mlp.to_rtl(tmp_path / "narrow")


def test_distributed_arithmetic_mlp_runs_bit_exact_where_latency_accumulators_would_saturate(tmp_path):
    """strategy='distributed_arithmetic': exact sums then one cast into each result type, as hls4ml's
    DA firmware computes (tests/nn/test_mlp_da.py); the RTL equals simulate on every row, and
    differs from the same network with narrow saturating latency accumulators (which to_rtl refuses)."""
    torch.manual_seed(6)
    seq = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2), torch.nn.Sigmoid()).eval()
    types = {"default": "ap_fixed<8,3>", "relu1": "ap_ufixed<8,3,AP_RND,AP_SAT>"}
    da = MLP.from_float(seq, precision=types, n_features=5, device="sim", strategy="distributed_arithmetic")
    rtl = da.to_rtl(tmp_path / "da")
    x = _rows(da, np.random.default_rng(12), calib_scale=3.0)
    got, want = rtl.predict(x), da.simulate(x)
    assert np.array_equal(got, want)
    narrow = dict(types, fc0={"accum": "ap_fixed<8,3,AP_TRN,AP_SAT>"}, fc2={"accum": "ap_fixed<8,3,AP_TRN,AP_SAT>"})
    lat = MLP.from_float(seq, precision=narrow, n_features=5, device="sim")
    assert not np.array_equal(want, lat.simulate(x))
    with pytest.raises(UnsupportedError, match="saturates step by step"):
        lat.to_rtl(tmp_path / "lat")


def test_narrow_wrapping_accumulator_is_realised_step_by_step(tmp_path):
    """Latency-strategy semantics: products truncated into a narrow accum_t that wraps, bit for bit."""
    torch.manual_seed(5)
    seq = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).eval()
    precision = {"default": "ap_fixed<8,3>", "fc0": {"accum": "ap_fixed<9,4>"}, "fc2": {"accum": "ap_fixed<10,3,AP_RND,AP_WRAP>"}}
    mlp = MLP.from_float(seq, precision=precision, n_features=5, device="sim")
    rtl = mlp.to_rtl(tmp_path / "wrap")
    x = _rows(mlp, np.random.default_rng(9), calib_scale=3.0)
    got, want = rtl.predict(x), mlp.simulate(x)
    assert np.array_equal(got, want)
    # The accumulator really wraps and rounds here: exact accumulation would give other values.
    exact = MLP.from_float(seq, precision={"default": "ap_fixed<8,3>", "fc0": {"accum": "ap_fixed<40,20>"},
                                           "fc2": {"accum": "ap_fixed<40,20>"}}, n_features=5, device="sim")
    assert not np.array_equal(want, exact.simulate(x))


def test_clock_out_of_range_is_refused(net_a, tmp_path):
    from offload.sim.errors import InputError

    mlp, _ = net_a
    with pytest.raises(InputError, match="clock_mhz"):
        mlp.to_rtl(tmp_path / "x", clock_mhz=0)


# -- missing tools ---------------------------------------------------------------------------------
def _tiny(tmp_path):
    torch.manual_seed(6)  # the same network every run: its Verilator build stays cached
    seq = torch.nn.Sequential(torch.nn.Linear(2, 1)).eval()
    mlp = MLP.from_float(seq, precision={"default": "ap_fixed<8,3>", "fc0": {"accum": "ap_fixed<20,8>"}}, n_features=2, device="sim")
    return mlp.to_rtl(tmp_path / "tiny")


def test_missing_verilator_names_it(tmp_path, monkeypatch):
    rtl = _tiny(tmp_path)
    monkeypatch.setenv("OFFLOAD_VERILATOR_ROOT", str(tmp_path / "nowhere"))
    with pytest.raises(ToolchainMissing, match="verilator"):
        rtl.compile()


def test_missing_perl_and_yosys_on_path_are_named(tmp_path, monkeypatch):
    rtl = _tiny(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("OFFLOAD_YOSYS", raising=False)
    with pytest.raises(ToolchainMissing, match="perl"):
        rtl.compile()
    with pytest.raises(ToolchainMissing, match="yosys"):
        rtl.resources()


# -- pieces without tools ---------------------------------------------------------------------------
@pytest.mark.parametrize("lane_bits,n,signed", [(5, 3, True), (9, 16, True), (8, 1, False), (24, 7, True), (33, 3, False)])
def test_pack_unpack_round_trip(lane_bits, n, signed):
    rng = np.random.default_rng(lane_bits)
    lo, hi = (-(1 << (lane_bits - 1)), (1 << (lane_bits - 1)) - 1) if signed else (0, (1 << lane_bits) - 1)
    raw = rng.integers(lo, hi, size=(50, n), endpoint=True)
    raw[0] = lo
    raw[1] = hi
    assert np.array_equal(rtl_sim.unpack(rtl_sim.pack(raw, lane_bits), n, lane_bits, signed), raw)


def test_parse_stat_counts_xilinx_cells():
    text = """
   Number of wires:                 10
   Number of cells:                 17
     CARRY8                          3
     FDRE                            5
     LUT2                            4
     LUT6                            2
     RAM32M                          1
     RAMB18E2                        1
     DSP48E2                         1
"""
    assert parse_stat(text) == {"LUT": 7, "FF": 5, "CARRY": 3, "DSP": 1, "BRAM": 0.5}


def test_regress_rtl_checks_catalogue_mlps_against_golden(tmp_path):
    from offload.hls.regress import run_regression

    rep = run_regression(["mlp/8-4/*", "mlp/12-8-2/*"], device=None, rtl=True, workdir=tmp_path)
    checks = {r.name: r.checks["rtl"] for r in rep.results}
    tanh = checks["mlp/8-4/ap_fixed8_3/r1/tanh+tanh"]
    assert tanh.status == "pass" and tanh.data["mismatches"] == {"y": 0} and tanh.data["latency_cycles"] == tanh.data["stages"] + 1
    # AP_RND_CONV rounding (ties to even) is realised in the RTL too.
    conv = checks["mlp/12-8-2/ap_fixed10_4-sat/r1/tanh"]
    assert conv.status == "pass" and conv.data["mismatches"] == {"y": 0}
    assert rep.ok


def test_advise_uses_measured_rtl_cycles_and_yosys_counts():
    """A measured RTL summary replaces the model's pipeline latency and resources for that MLP."""
    import offload
    from offload.hls.rtl import RtlSummary

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

        def forward(self, x):
            return self.mlp(x)

    x = torch.randn(64, 6)
    kw = dict(batch_sizes=(1,), ops=("mlp",), repeats=3, budget_s=0.02)
    plain = offload.advise(Net().eval(), (x,), **kw)
    name = plain.rows[0].name
    summary = RtlSummary(latency_cycles=3, clock_mhz=300.0, stages=2, da4ml_cost_lut=100.0,
                         resources={"LUT": 1234, "FF": 50, "CARRY": 7, "DSP": 0, "BRAM": 0})
    measured = offload.advise(Net().eval(), (x,), rtl={name: summary}, **kw)
    p, m = plain.rows[0], measured.rows[0]
    assert m.resources["LUT"] == 1234 and m.resources["DSP"] == 0 and p.resources["DSP"] > 0
    assert m.kernel_s < p.kernel_s  # 3 measured cycles against the model's DSP pipelines and adder trees
    assert any("3 cycles measured under Verilator" in n and "not Vivado" in n for n in measured.notes)
    with pytest.raises(ValueError, match="no MLP candidate"):
        offload.advise(Net().eval(), (x,), rtl={"nope": summary}, **kw)


def test_offload_advise_cli_reads_a_to_rtl_directory(tmp_path):
    from click.testing import CliRunner

    from offload.cli import main

    rtl = _tiny(tmp_path)
    args = ["advise", "dlrm-small", "--ops", "mlp", "--batch-sizes", "1", "--json"]
    r = CliRunner().invoke(main, [*args, "--rtl", f"top_0..top_5={rtl.directory}"])
    assert r.exit_code != 0 and "run predict() first" in r.output  # nothing measured yet: refused, not guessed
    rtl.predict(np.zeros((1, 2)))
    r = CliRunner().invoke(main, [*args, "--rtl", f"top_0..top_5={rtl.directory}"])
    assert r.exit_code == 0, r.output
    notes = json.loads(r.output)["notes"]
    assert any(f"top_0..top_5: kernel time from RTL, {rtl.latency_cycles} cycles measured" in n for n in notes)
    r = CliRunner().invoke(main, [*args, "--rtl", f"nope={rtl.directory}"])
    assert r.exit_code != 0 and "no MLP candidate named" in r.output
    r = CliRunner().invoke(main, [*args, "--rtl", f"top_0..top_5={tmp_path / 'missing'}"])
    assert r.exit_code != 0 and "not a to_rtl() directory" in r.output

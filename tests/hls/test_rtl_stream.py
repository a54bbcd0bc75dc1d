"""The AXI4-Stream top (``offload_stream``) under Verilator: tags, order, backpressure, latency, II.

Every response is checked against ``mlp.simulate`` bit for bit and against its request's tag, in
order, exactly once. The checks are shown to fail: designs with a tag line one level short, a FIFO
that lets a response go without ``m_axis_tready``, one that shows a response again after a stall,
and one with too few credits for a request every cycle are each caught.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from offload.hls.rtl import stream_sim
from offload.hls.rtl.stream import STREAM_TOP, fifo_depth, tdata_bits
from offload.hls.rtl.stream_sim import StreamTrace
from offload.nn import MLP
from offload.sim.errors import CSimError, InputError

pytestmark = pytest.mark.rtl

SRC = f"src/{STREAM_TOP}.v"


def _mlp() -> MLP:
    """Dense, ReLU, dense, sigmoid (a lookup table): two unsigned output lanes."""
    torch.manual_seed(3)
    seq = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2), torch.nn.Sigmoid()).eval()
    return MLP.from_float(seq, calib=np.random.default_rng(0).normal(size=(256, 5)), precision="auto", device="sim")


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    mlp = _mlp()
    return mlp, mlp.to_rtl(tmp_path_factory.mktemp("stream"), clock_mhz=300)


def _x(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(size=(n, 5)) * 2, rng.normal(size=(n // 4, 5)) * 40])


def _mutant(mlp: MLP, tmp_path, old: str, new: str):
    """A fresh copy of the design with one edit to the stream top (the edit must apply)."""
    rtl = mlp.to_rtl(tmp_path / "mutant", clock_mhz=300)
    path = rtl.directory / SRC
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    return rtl


def test_latency_and_initiation_interval_are_what_the_design_claims(net):
    mlp, rtl = net
    sc = rtl.stream_cycles
    # The pipeline's register levels plus the FIFO's write; a request every cycle.
    assert sc.latency_cycles == rtl.meta["stream_latency"] == rtl.pipeline_depth + 1
    assert sc.ii_cycles == rtl.meta["stream_ii"] == 1
    assert sc.fifo_depth == rtl.meta["fifo_depth"] == fifo_depth(rtl.pipeline_depth) >= rtl.pipeline_depth + 2
    assert sc.latency_ns == pytest.approx(sc.latency_cycles * 1000.0 / 300.0)
    measured = json.loads((rtl.directory / "measured.json").read_text())
    assert measured["stream"]["latency_cycles"] == sc.latency_cycles and measured["stream"]["ii_cycles"] == 1
    assert mlp.report.rtl.stream == sc
    assert f"{sc.latency_cycles} cycles" in "\n".join(mlp.report.rtl.lines())


def test_back_to_back_requests_are_bit_exact_in_order(net):
    mlp, rtl = net
    x = _x(800, 1)
    assert np.array_equal(rtl.stream_predict(x), mlp.simulate(x))
    # Every row went in on consecutive cycles and came out a fixed latency later.
    raw = rtl.input_type.quantize(x)
    tags = (np.arange(len(x)) * 7919 + 5) % (1 << 16)
    trace = rtl.stream_run(raw, tags)
    lat = stream_sim.check(trace, tags)
    assert (trace.intervals == 1).all() and (lat == rtl.meta["stream_latency"]).all()


@pytest.mark.parametrize("valid_pct,ready_pct,tb_seed", [(100, 30, 1), (70, 50, 2), (100, 90, 3), (40, 20, 4)])
def test_backpressure_loses_and_repeats_nothing(net, valid_pct, ready_pct, tb_seed):
    mlp, rtl = net
    x = _x(600, 10 + tb_seed)
    assert np.array_equal(rtl.stream_predict(x, valid_pct=valid_pct, ready_pct=ready_pct, tb_seed=tb_seed), mlp.simulate(x))
    raw = rtl.input_type.quantize(x)
    tags = np.random.default_rng(tb_seed).permutation(1 << 16)[: len(x)]
    trace = rtl.stream_run(raw, tags, valid_pct=valid_pct, ready_pct=ready_pct, tb_seed=tb_seed)
    lat = stream_sim.check(trace, tags)
    # The FIFO really held responses back, and under full load the credits really stopped requests.
    assert lat.max() > rtl.meta["stream_latency"]
    if valid_pct == 100 and ready_pct < 50:
        assert trace.intervals.max() > 1


def test_one_at_a_time(net):
    mlp, rtl = net
    x = _x(40, 4)
    assert np.array_equal(rtl.stream_predict(x, one_at_a_time=True), mlp.simulate(x))


def test_stream_from_a_random_start_after_reset(net):
    """Every register starts at a value Verilator draws; the reset must bring the control to order."""
    mlp, rtl = net
    exe = stream_sim.build(rtl.directory, rtl.meta, x_initial="unique")
    x = _x(300, 6)
    raw = rtl.input_type.quantize(x)
    tags = np.arange(len(x))
    want = rtl.reference(raw) >> (rtl.output_type.F - int(rtl.meta["out_frac"]))
    for seed in (17, 123457):
        trace = stream_sim.run(exe, rtl.directory, rtl.meta, raw, tags, ready_pct=60, tb_seed=seed, seed=seed)
        stream_sim.check(trace, tags, want)


def test_ports_follow_the_layout(net):
    _, rtl = net
    text = (rtl.directory / SRC).read_text()
    m = rtl.meta
    assert f"input  wire [{tdata_bits(m['n_in'], m['in_bits']) - 1}:0] s_axis_tdata" in text
    assert f"output wire [{tdata_bits(m['n_out'], m['out_bits']) - 1}:0] m_axis_tdata" in text
    assert f"[{m['tag_bits'] - 1}:0] s_axis_tuser" in text and f"[{m['tag_bits'] - 1}:0] m_axis_tuser" in text
    assert tdata_bits(3, 9) == 32 and tdata_bits(1, 9) == 16 and tdata_bits(2, 8) == 16


# -- the checks can fail -----------------------------------------------------------------------------
def test_a_tag_line_one_level_short_is_caught(net, tmp_path):
    mlp, good = net
    depth, tag = good.pipeline_depth, good.meta["tag_bits"]
    rtl = _mutant(mlp, tmp_path, f"tag_q[{depth * tag - 1}:{(depth - 1) * tag}], result", f"tag_q[{(depth - 1) * tag - 1}:{(depth - 2) * tag}], result")
    x = _x(100, 7)
    with pytest.raises(CSimError, match=r"response 0 carries tag 1 \(request 1's tag\), expected 0"):
        rtl.stream_predict(x)


def test_a_response_let_go_without_ready_is_caught(net, tmp_path):
    mlp, _ = net
    rtl = _mutant(mlp, tmp_path, "if (take) rd_ptr", "if (m_axis_tvalid) rd_ptr")
    x = _x(300, 8)
    assert np.array_equal(rtl.stream_predict(x), mlp.simulate(x))  # never pushed back: unseen
    with pytest.raises(CSimError, match="shown and not taken changed or went away"):
        rtl.stream_predict(x, ready_pct=40, tb_seed=5)
    # The tags alone tell too: the first response the FIFO let go is missing from the sequence.
    tags = np.arange(len(x))
    trace = rtl.stream_run(rtl.input_type.quantize(x), tags, ready_pct=40, tb_seed=5)
    with pytest.raises(CSimError, match=r"dropped, duplicated or swapped|missing \(dropped\)"):
        stream_sim.check(dataclasses.replace(trace, violations=0), tags)


def test_a_response_shown_again_after_a_stall_is_caught(net, tmp_path):
    mlp, _ = net
    # The first handshake after a stall is not honoured: the same response is shown again.
    rtl = _mutant(mlp, tmp_path, "wire take = m_axis_tvalid & m_axis_tready;",
                  "reg stall_q;\n    always @(posedge ap_clk) stall_q <= m_axis_tvalid & ~m_axis_tready;\n"
                  "    wire take = m_axis_tvalid & m_axis_tready & ~stall_q;")
    x = _x(300, 9)
    assert np.array_equal(rtl.stream_predict(x), mlp.simulate(x))  # never pushed back: unseen
    with pytest.raises(CSimError, match="duplicated"):
        rtl.stream_predict(x, ready_pct=40, tb_seed=6)


def test_too_few_credits_show_as_an_initiation_interval_above_one(net, tmp_path):
    mlp, good = net
    fifo, depth = good.meta["fifo_depth"], good.pipeline_depth
    aw = fifo.bit_length() - 1
    rtl = _mutant(mlp, tmp_path, f"credits <= {aw + 1}'d{fifo};", f"credits <= {aw + 1}'d{depth};")
    x = _x(200, 10)
    assert np.array_equal(rtl.stream_predict(x, ready_pct=50, tb_seed=2), mlp.simulate(x))  # still correct...
    sc = rtl.stream_cycles
    assert sc.latency_cycles == good.meta["stream_latency"]
    assert sc.ii_cycles > rtl.meta["stream_ii"] == 1  # ...but slower than claimed


# -- the verdict without tools -------------------------------------------------------------------------
def _trace(tags, raw, accept=None, resp=None, violations=0):
    """A trace of four requests taken on cycles 0..3 (unless ``accept``) and the responses given."""
    accept = np.arange(4) if accept is None else np.asarray(accept)
    resp = (np.arange(len(raw)) + 5) if resp is None else np.asarray(resp)
    return StreamTrace(accept, resp, np.asarray(tags, dtype=np.int64), np.asarray(raw, dtype=np.int64).reshape(-1, 1),
                       100, violations, "at cycle 3: x" if violations else "")


def test_check_names_each_fault():
    tags = np.array([10, 11, 12, 13])
    raw = np.array([1, 2, 3, 4])
    assert list(stream_sim.check(_trace(tags, raw), tags, raw[:, None])) == [5, 5, 5, 5]
    with pytest.raises(CSimError, match=r"response 1 carries tag 12 \(request 2's tag\), expected 11"):
        stream_sim.check(_trace([10, 12, 11, 13], raw), tags)
    with pytest.raises(CSimError, match="missing"):
        stream_sim.check(_trace(tags[:3], raw[:3]), tags)
    with pytest.raises(CSimError, match="duplicated"):
        stream_sim.check(_trace([10, 11, 12, 13, 13], [1, 2, 3, 4, 4]), tags)
    with pytest.raises(CSimError, match="corrupted"):
        stream_sim.check(_trace([10, 11, 99, 13], raw), tags)
    with pytest.raises(CSimError, match="response 2 lane 0: rtl 3, expected 7"):
        stream_sim.check(_trace(tags, raw), tags, np.array([[1], [2], [7], [4]]))
    with pytest.raises(CSimError, match="rule broken"):
        stream_sim.check(_trace(tags, raw, violations=1), tags)
    with pytest.raises(CSimError, match="3 of 4 requests accepted"):
        stream_sim.check(_trace(tags, raw, accept=[0, 1, 2]), tags)


def test_bad_stream_arguments_are_refused(net):
    _, rtl = net
    raw = np.zeros((3, 5), dtype=np.int64)
    with pytest.raises(InputError, match="tags"):
        rtl.stream_run(raw, np.array([0, 1, 1 << 16]))
    with pytest.raises(InputError, match="ready_pct"):
        rtl.stream_run(raw, np.arange(3), ready_pct=101)
    with pytest.raises(InputError, match="above 0"):
        rtl.stream_run(raw, np.arange(3), valid_pct=0)
    with pytest.raises(InputError, match="raw_in"):
        rtl.stream_run(np.zeros((3, 4), dtype=np.int64), np.arange(3))
    with pytest.raises(InputError, match="tag_bits"):
        mlp = _mlp()
        from offload.hls.rtl import RtlModel

        RtlModel.generate(mlp.spec, mlp.spec.tensors(), rtl.directory.parent / "badtag", tag_bits=0)

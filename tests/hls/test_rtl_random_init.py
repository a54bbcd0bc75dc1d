"""The RTL from a random start: every register begins at a value drawn by Verilator, not at 0.

``--x-initial fast`` (the default build) starts every register at 0, so a register whose reset
value was forgotten still reads 0 and the design passes. Built with ``x_initial="unique"`` and run
with ``seed`` (``+verilator+rand+reset+2 +verilator+seed+N``) the start is random: the design must
still match ``mlp.simulate`` bit for bit on every row, with the same fixed latency. Each network runs
with one seed fixed by name (reproducible) and one drawn at run time (printed on failure).
"""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
import torch

from offload.hls.rtl import sim as rtl_sim
from offload.nn import MLP
from offload.sim.errors import CSimError
from offload.sim.fixed import FixedType

pytestmark = pytest.mark.rtl


def _net_auto(tmp_path_factory):
    """BatchNorm + LeakyReLU + ReLU + Sigmoid (a lookup table), types from precision='auto'."""
    torch.manual_seed(1)
    seq = torch.nn.Sequential(torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 8), torch.nn.LeakyReLU(0.1), torch.nn.Linear(8, 4),
                              torch.nn.ReLU(), torch.nn.Linear(4, 1), torch.nn.Sigmoid())
    x = np.random.default_rng(0).normal(size=(400, 6)) * 2 + 0.5
    seq.train()
    with torch.no_grad():
        seq(torch.from_numpy(x).float())
    mlp = MLP.from_float(seq.eval(), calib=x, precision="auto", device="sim")
    return mlp, mlp.to_rtl(tmp_path_factory.mktemp("rand_auto"), clock_mhz=300)


def _net_wrap(tmp_path_factory):
    """Tanh, truncating and wrapping types chosen by hand."""
    torch.manual_seed(2)
    seq = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3), torch.nn.ReLU()).eval()
    precision = {
        "input": "ap_fixed<8,3,AP_TRN,AP_WRAP>",
        "fc0": {"weight": "ap_fixed<6,1>", "bias": "ap_fixed<6,1>", "accum": "ap_fixed<24,10>", "result": "ap_fixed<9,4,AP_RND,AP_SAT_SYM>"},
        "tanh1": {"table": "ap_fixed<10,2>", "result": "ap_fixed<8,1,AP_TRN,AP_SAT>"},
        "fc2": {"weight": "ap_fixed<6,1>", "bias": "ap_fixed<6,1>", "accum": "ap_fixed<24,10>", "result": "ap_fixed<10,4,AP_RND,AP_WRAP>"},
        "relu3": "ap_ufixed<7,3,AP_RND,AP_SAT>",
    }
    mlp = MLP.from_float(seq, precision=precision, n_features=5, device="sim")
    return mlp, mlp.to_rtl(tmp_path_factory.mktemp("rand_wrap"), clock_mhz=250)


NETS = {"auto": _net_auto, "wrap": _net_wrap}


@pytest.fixture(scope="module", params=sorted(NETS))
def net(request, tmp_path_factory):
    return request.param, *NETS[request.param](tmp_path_factory)


def _rows(mlp: MLP, rng: np.random.Generator) -> np.ndarray:
    nf = mlp.spec.n_features
    t = FixedType.parse(mlp.spec.input_type)
    return np.concatenate([rng.normal(size=(200, nf)) * 2, rng.normal(size=(50, nf)) * 50.0,
                           np.full((1, nf), t.max_float), np.full((1, nf), t.min_float), rng.uniform(t.min_float, t.max_float, size=(100, nf))])


def _predict(rtl, exe, x: np.ndarray, seed: int | None) -> tuple[np.ndarray, int]:
    """What ``RtlModel.predict`` does, through ``exe`` and from the random start of ``seed``."""
    lanes, lat = rtl_sim.run(exe, rtl.directory, rtl.meta, rtl.input_type.quantize(x), seed=seed)
    shift = rtl.output_type.F - int(rtl.meta["out_frac"])  # lanes sit at 2**-out_frac
    return rtl.output_type.to_float(lanes << shift if shift >= 0 else lanes >> -shift), lat


def _seed(name: str) -> int:
    """A reproducible seed in Verilator's range [1, 2**31 - 1]."""
    return zlib.crc32(name.encode()) % (2**31 - 1) + 1


def _seeds(name: str) -> list[int]:
    return [_seed(name), random.SystemRandom().randrange(1, 2**31)]


def test_the_design_matches_the_simulator_from_a_random_start(net):
    name, mlp, rtl = net
    exe = rtl_sim.build(rtl.directory, rtl.meta, x_initial="unique")
    x = _rows(mlp, np.random.default_rng(zlib.crc32(name.encode())))
    want = mlp.simulate(x)
    for seed in _seeds(name):
        got, lat = _predict(rtl, exe, x, seed)
        bad = np.argwhere(got != want)
        assert bad.size == 0, f"seed {seed}: {len(bad)} mismatches, first at row {bad[0][0]}: rtl {got[tuple(bad[0])]} vs sim {want[tuple(bad[0])]}"
        assert lat == rtl.pipeline_depth, f"seed {seed}: latency {lat} cycles, the pipeline has {rtl.pipeline_depth}"


def test_a_valid_line_without_its_reset_value_fails_from_a_random_start(net, tmp_path):
    """The check can fail: drop the valid register's initial value and random starts raise
    out_valid before any input, while the all-zeros start still passes (the hole this closes)."""
    name, mlp, good = net
    rtl = mlp.to_rtl(tmp_path / "noreset", clock_mhz=float(good.meta["clock_mhz"]))
    top = rtl.directory / "src" / "offload_top.v"
    depth = rtl.pipeline_depth
    text = top.read_text()
    decl = f"reg [{depth - 1}:0] valid_q = {depth}'b0;"
    assert decl in text
    top.write_text(text.replace(decl, f"reg [{depth - 1}:0] valid_q;"))
    x = _rows(mlp, np.random.default_rng(5))
    want = mlp.simulate(x)
    got, _lat = _predict(rtl, rtl_sim.build(rtl.directory, rtl.meta), x, None)
    assert np.array_equal(got, want)  # all registers at 0: the missing reset value goes unseen
    exe = rtl_sim.build(rtl.directory, rtl.meta, x_initial="unique")
    caught = []
    # Each seed is deterministic; a start with every valid bit 0 (chance 2^-depth) would pass, so several.
    for seed in [_seed(f"{name}{i}") for i in range(4)]:
        try:
            got, _lat = _predict(rtl, exe, x, seed)
            caught.append(not np.array_equal(got, want))
        except CSimError as e:
            caught.append("out_valid without an input" in str(e))
    assert any(caught), caught

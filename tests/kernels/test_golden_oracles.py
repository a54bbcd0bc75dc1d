"""The committed golden vectors against oracles that share no code with offload's reference, so a
reference bug cannot hide by being regenerated into the vectors:

- embedding entries with an overflow-free accumulator: torch's float64 ``embedding_bag`` over the
  dequantized tables, exact for sum and max, within half an output lsb for mean (the one rounding
  the format adds);
- a hand-worked example, small enough to check on paper;
- MLP entries: hls4ml's own compiled C-simulation of the same spec.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offload.hls.mlp import build_model
from offload.kernels.catalogue import entries, load_golden
from offload.kernels.embedding import TableSpec, make_kernel, make_spec
from offload.kernels.registry import get_kind
from offload.sim.fixed import FixedType

# Entries whose accumulator is the kind's overflow-free default and whose output is that
# accumulator: their outputs are the exact sums of the dequantized values (means: rounded once).
EXACT = [e.name for e in entries("emb/*") if "acc" not in e.name and "out12" not in e.name]


def _float_tables(g) -> list[np.ndarray]:
    spec = g.kernel().spec
    out = []
    for t, ts in enumerate(spec.tables):
        raw = g.tensors[f"table{t}"].astype(np.float64)
        if ts.rowwise:
            lsb = float(FixedType.parse(ts.param_type).lsb)
            params = g.tensors[f"params{t}"].astype(np.float64) * lsb
            out.append(raw * params[:, :1] + params[:, 1:])
        else:
            out.append(raw * float(FixedType.parse(ts.fmt).lsb))
    return out


@pytest.mark.parametrize("name", EXACT)
def test_embedding_golden_outputs_equal_torch_on_the_dequantized_tables(name):
    g = load_golden(name)
    spec = g.kernel().spec
    tables = _float_tables(g)
    idx, off = g.inputs["indices"].astype(np.int64), g.inputs["offsets"].astype(np.int64)
    psw = g.inputs.get("per_sample_weights")
    w = None if psw is None else psw.astype(np.float64) * float(spec.weight_type.lsb)
    T = spec.num_tables
    B = (len(off) - 1) // T
    cols = []
    for t, ts in enumerate(spec.tables):
        o = off[t * B : (t + 1) * B + 1]
        sl = slice(int(o[0]), int(o[-1]))
        cols.append(torch.nn.functional.embedding_bag(
            torch.from_numpy(idx[sl]), torch.from_numpy(tables[t]), torch.from_numpy(o - o[0]), mode=spec.mode,
            per_sample_weights=None if w is None else torch.from_numpy(w[sl]), include_last_offset=True,
            padding_idx=ts.padding_idx).numpy())
    want = np.concatenate(cols, axis=1)
    got = g.outputs["out"].astype(np.float64) * float(spec.out_type.lsb)
    # float64 sums of at most 64 terms: relative error below 64 * 2^-53 of the terms' magnitude.
    terms = np.concatenate([np.abs(tt).max(initial=0.0) * np.ones((B, ts.dim)) for tt, ts in zip(tables, spec.tables)], axis=1)
    tol = 64 * 2.0**-53 * terms * spec.max_bag_size * (1.0 if w is None else float(np.abs(w).max(initial=1.0)))
    if spec.mode == "mean":
        tol = tol + 0.5 * float(spec.out_type.lsb)
    assert np.all(np.abs(got - want) <= tol), float(np.abs(got - want).max())


def test_a_hand_worked_example():
    # ap_fixed<8,3>: lsb 1/32. Rows 1.5, -2.25, 0.125 (exact in the format). Bags {0, 1}, {2, 2, 0}, {}.
    rows = np.array([[1.5], [-2.25], [0.125]])
    idx, off = np.array([0, 1, 2, 2, 0]), np.array([0, 2, 5, 5])
    expect = {"sum": [-0.75, 1.75, 0.0], "max": [1.5, 1.5, 0.0], "mean": [-0.375, 1.75 / 3, 0.0]}
    for mode, want in expect.items():
        spec = make_spec([TableSpec("t", 3, 1, "ap_fixed<8,3>")], mode=mode, max_bag_size=4)
        k = make_kernel("k", spec, [rows])
        raw = get_kind("embedding").reference(spec, k.tensors, {"indices": idx, "offsets": off})["out"]
        got = raw[:, 0] * float(spec.out_type.lsb)
        # 1.75 / 3 = 0.58333... is rounded half-to-even into the accumulator's lsb.
        assert np.all(np.abs(got - want) <= 0.5 * float(spec.out_type.lsb)), (mode, got)
        if mode != "mean":
            assert got.tolist() == want
    # Weighted: 2 * 1.5 + 0.5 * (-2.25) = 1.875, exact.
    spec = make_spec([TableSpec("t", 3, 1, "ap_fixed<8,3>")], mode="sum", max_bag_size=4)
    k = make_kernel("k", spec, [rows])
    wt = spec.weight_type
    w = np.asarray(wt.quantize(np.array([2.0, 0.5])), dtype=np.int64)
    raw = get_kind("embedding").reference(spec, k.tensors, {"indices": idx[:2], "offsets": np.array([0, 2]), "per_sample_weights": w})["out"]
    assert raw[0, 0] * float(spec.out_type.lsb) == 1.875


MLP = ["mlp/12-8-2/ap_fixed10_4-sat/r1/tanh", "mlp/16-bn-8-1/ap_fixed16_6/r2/relu+sigmoid", "mlp/16-16-4/ap_fixed16_6-wrap/r1/leaky_relu"]


@pytest.mark.hls
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", MLP)
def test_mlp_golden_outputs_equal_hls4ml_csim(name, tmp_path):
    g = load_golden(name)
    k = g.kernel()
    model = build_model(k.spec, tmp_path)
    model.compile()
    x = np.ascontiguousarray(g.inputs["x"], dtype=np.float64)
    y = np.asarray(model.predict(x)).reshape(len(x), -1)
    np.testing.assert_array_equal(g.outputs["y"], y)

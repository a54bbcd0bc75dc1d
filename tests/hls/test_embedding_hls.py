"""The generated HLS C++ (compiled with g++ against ap_types) against the simulator: zero
mismatches over formats x modes x random shapes and adversarial cases."""

from __future__ import annotations

import numpy as np
import pytest

from offload.hls import csim
from offload.hls.registry import get_hls_kind
from offload.kernels import get_kind
from offload.kernels.embedding import ROWWISE, TableSpec, make_kernel, make_spec, rowwise_param_type

from _embedding_harness import SPECS, make_case, random_tables, run_cpp

KIND = get_kind("embedding")

pytestmark = pytest.mark.skipif(not csim.ap_types_include().is_dir(), reason="ap_types headers missing")


def _compare(spec, kernel, inputs):
    KIND.validate(spec, kernel.tensors, inputs)
    want = KIND.reference(spec, kernel.tensors, inputs)["out"]
    got = run_cpp(spec, kernel.tensors, inputs)["out"]
    assert got.shape == want.shape
    mism = int((got != want).sum())
    assert mism == 0, f"{mism} of {want.size} raw outputs differ"
    return want


# One multi-table kernel per mode covers every storage format (fixed signed/unsigned, row-wise),
# padding rows and per-table dims in one compile each.
def _mode_spec(mode):
    return make_spec([
        TableSpec("fx", 61, 5, "ap_fixed<16,6,AP_RND_CONV,AP_SAT>", padding_idx=0),
        TableSpec("rw", 33, 7, ROWWISE, "ap_fixed<22,4,AP_RND_CONV,AP_SAT>", padding_idx=32),
        TableSpec("ux", 17, 3, "ap_ufixed<10,3>"),
    ], mode=mode, max_bag_size=24)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_cpp_matches_sim_random_and_edges(mode):
    rng = np.random.default_rng({"sum": 1, "mean": 2, "max": 3}[mode])
    spec = _mode_spec(mode)
    tables = random_tables(rng, spec)
    tables[2] = np.abs(tables[2])
    kernel = make_kernel("k", spec, tables)
    for B, max_len in [(9, 24), (40, 5), (1, 24), (3, 0)]:
        for weighted in ([False, True] if mode == "sum" else [False]):
            inputs = make_case(rng, spec, B, max_len, weighted=weighted, pad_frac=0.25)
            if weighted and B == 9:  # weights at the ends of weight_type's range
                wt = spec.weight_type
                inputs["per_sample_weights"][::3] = wt.min_raw
                inputs["per_sample_weights"][1::3] = wt.max_raw
            _compare(spec, kernel, inputs)
    # int32 indices/offsets take the same path (the ABI widens to int64).
    inputs = make_case(rng, spec, 5, 6)
    _compare(spec, kernel, {k: v.astype(np.int32) for k, v in inputs.items()})


@pytest.mark.parametrize("name", ["sat-acc", "wrap-acc", "sat-mean", "sat-max"])
def test_cpp_matches_sim_adversarial_accumulators(name):
    # Saturating / wrapping accumulators, rounding ties on weighted products (4+4 frac bits -> 7),
    # SAT_SYM / SAT_ZERO / RND_ZERO / RND_INF output and accumulator modes.
    rng = np.random.default_rng(7)
    spec = SPECS[name]()
    kernel = make_kernel("k", spec, random_tables(rng, spec, scale=4.0))
    for B in (12, 1):
        inputs = make_case(rng, spec, B, spec.max_bag_size, weighted=spec.mode == "sum", pad_frac=0.0)
        _compare(spec, kernel, inputs)


def test_cpp_max_ties_negative_rows_and_table_ends():
    # Every row equal in some columns (ties), all-negative rows, only rows 0 and N-1 looked up.
    spec = make_spec([TableSpec("t", 8, 4, "ap_fixed<12,4,AP_RND_CONV,AP_SAT>", padding_idx=3)], mode="max", max_bag_size=6)
    W = -np.abs(np.random.default_rng(5).standard_normal((8, 4)))
    W[:, 0] = -1.25
    W[:, 1] = 0.5
    kernel = make_kernel("k", spec, [W])
    inputs = {"indices": np.array([0, 7, 7, 0, 3, 3, 7, 0, 0], dtype=np.int64),
              "offsets": np.array([0, 2, 4, 6, 6, 9], dtype=np.int64)}
    out = _compare(spec, kernel, inputs)
    acc = spec.out_type
    np.testing.assert_array_equal(acc.to_float(out[:, 0]), [-1.25, -1.25, 0.0, 0.0, -1.25])  # bag 2: only padding
    np.testing.assert_array_equal(acc.to_float(out[:, 1]), [0.5, 0.5, 0.0, 0.0, 0.5])


def test_generated_sources_follow_the_abi():
    spec = _mode_spec("sum")
    hk = get_hls_kind("embedding")
    srcs = hk.sources(spec)
    top = next(v for k, v in srcs.items() if k.endswith(".cpp"))
    assert f'extern "C" void {hk.top_name(spec)}(' in top
    args = hk.top_args(spec)
    roles = [a.role for a in args]
    assert roles == ["resident"] * 4 + ["input"] * 3 + ["output"] + ["scalar"] * 2
    assert {a.bundle for a in args if a.role == "resident"} == {"gmem0", "gmem1", "gmem2"}
    for a in args:
        if a.role != "scalar":
            assert f"bundle = {a.bundle}" in top and f"port = {a.name} " in top
    assert "s_axilite port = return" in top
    assert "PIPELINE II = 1" in (csim.offload_include() / "offload_embedding.h").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_cpp_matches_sim_random_specs_sweep(seed):
    # Every storage format in every mode, random table shapes / padding rows / max bag sizes.
    rng = np.random.default_rng(2024 + seed)
    fmts = ["ap_fixed<8,3,AP_RND,AP_SAT>", "ap_fixed<24,10,AP_TRN,AP_WRAP>", "ap_ufixed<12,4,AP_RND_ZERO,AP_SAT>",
            "ap_fixed<32,8,AP_RND_CONV,AP_SAT>", ROWWISE]
    for mode in ("sum", "mean", "max"):
        tables, weights = [], []
        for t, fmt in enumerate(fmts):
            rows, dim = int(rng.integers(2, 40)), int(rng.integers(1, 9))
            W = rng.standard_normal((rows, dim)) * 3
            pad = int(rng.integers(rows)) if rng.random() < 0.5 else None
            tables.append(TableSpec(f"t{t}", rows, dim, fmt, rowwise_param_type(W, 18) if fmt == ROWWISE else None, pad))
            weights.append(W)
        spec = make_spec(tables, mode=mode, max_bag_size=int(rng.integers(1, 30)))
        kernel = make_kernel("k", spec, weights)
        for B in (1, 17):
            inputs = make_case(rng, spec, B, spec.max_bag_size, weighted=mode == "sum", pad_frac=0.2)
            _compare(spec, kernel, inputs)


def test_emu_device_runs_modules_bit_identical_to_sim():
    # The emu device (another layer's code) drives this kind through HlsKind alone: same outputs.
    torch = pytest.importorskip("torch")
    import offload

    torch.manual_seed(0)
    bags = [torch.nn.EmbeddingBag(40, 6, mode="sum", padding_idx=1), torch.nn.EmbeddingBag(25, 3, mode="sum")]
    fmts = ["int8_rowwise", "ap_fixed<12,4,AP_RND_CONV,AP_SAT>"]
    sim = offload.nn.TableBatchedEmbeddingBags.from_float(bags, fmt=fmts, max_bag_size=16, device="sim")
    emu = offload.nn.TableBatchedEmbeddingBags.from_float(bags, fmt=fmts, max_bag_size=16, device="emu")
    idx = torch.cat([torch.randint(0, 40, (30,)), torch.randint(0, 25, (20,))])
    off = torch.tensor([0, 0, 14, 30, 35, 35, 50])
    for w in (None, torch.rand(50)):
        assert torch.equal(sim(idx, off, w), emu(idx, off, w))
    with pytest.raises(IndexError, match="table 't1' with 25 rows"):
        emu(torch.cat([idx[:30], torch.full((20,), 25)]), off)

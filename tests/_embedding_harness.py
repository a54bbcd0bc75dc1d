"""Private helpers of the embedding tests: the ctypes harness for the generated C++ and case makers."""

from __future__ import annotations

import ctypes

import numpy as np

from offload.hls import csim
from offload.hls.registry import get_hls_kind
from offload.kernels.embedding import ROWWISE, TableSpec, make_spec


def run_cpp(spec, tensors, inputs) -> dict[str, np.ndarray]:
    """Compile the kernel's generated sources with g++ (shared), call its top function through
    ctypes with ``pack_resident``/``pack_inputs`` buffers, and ``unpack_outputs``."""
    hk = get_hls_kind("embedding")
    lib = csim.load_library(csim.build(hk.sources(spec), shared=True))
    fn = getattr(lib, hk.top_name(spec))
    args = list(hk.top_args(spec))
    fn.argtypes = [ctypes.c_int32 if a.role == "scalar" else ctypes.c_void_p for a in args]
    fn.restype = None
    res = hk.pack_resident(spec, tensors)
    packed = hk.pack_inputs(spec, inputs)
    values = []
    for a in args:
        if a.role == "resident":
            v = res[a.name]
        else:
            v = packed[a.name]
        if a.role == "scalar":
            values.append(int(v))
        else:
            assert isinstance(v, np.ndarray) and v.flags.c_contiguous and v.dtype == np.dtype(a.dtype), a
            values.append(v.ctypes.data)
    fn(*values)
    return hk.unpack_outputs(spec, inputs, {k: packed[k] for k in packed if isinstance(packed[k], np.ndarray)})


def make_case(rng, spec, B, max_len, weighted=False, pad_frac=0.0):
    """Random call inputs with empty bags, bags of max length and rows at both table ends."""
    T = spec.num_tables
    lens = rng.integers(0, max_len + 1, size=T * B)
    lens[rng.random(T * B) < 0.15] = 0
    lens[rng.random(T * B) < 0.15] = max_len
    off = np.concatenate(([0], np.cumsum(lens)))
    parts = []
    for t, ts in enumerate(spec.tables):
        n = int(lens[t * B:(t + 1) * B].sum())
        ii = rng.integers(0, ts.num_rows, n)
        ends = rng.random(n)
        ii[ends < 0.1] = 0
        ii[ends > 0.9] = ts.num_rows - 1
        if ts.padding_idx is not None:
            ii[rng.random(n) < pad_frac] = ts.padding_idx
        parts.append(ii)
    inputs = {"indices": np.concatenate(parts).astype(np.int64), "offsets": off.astype(np.int64)}
    if weighted:
        wt = spec.weight_type
        inputs["per_sample_weights"] = rng.integers(wt.min_raw, wt.max_raw + 1, off[-1]).astype(np.int64)
    return inputs


def random_tables(rng, spec, scale=1.0):
    out = []
    for ts in spec.tables:
        out.append(rng.standard_normal((ts.num_rows, ts.dim)) * scale)
    return out


SPECS = {
    "fixed-sum": lambda: make_spec([TableSpec("a", 50, 5, "ap_fixed<16,6,AP_RND_CONV,AP_SAT>", padding_idx=7),
                                    TableSpec("b", 9, 3, "ap_fixed<10,3>")], mode="sum", max_bag_size=12),
    "mixed-mean": lambda: make_spec([TableSpec("a", 50, 4, "ap_fixed<12,4,AP_RND,AP_SAT>", padding_idx=0),
                                     TableSpec("r", 30, 6, ROWWISE, "ap_fixed<20,3,AP_RND_CONV,AP_SAT>", padding_idx=29)],
                                    mode="mean", max_bag_size=9),
    "mixed-max": lambda: make_spec([TableSpec("a", 40, 4, "ap_ufixed<10,3,AP_RND_CONV,AP_SAT>"),
                                    TableSpec("r", 30, 6, ROWWISE, "ap_fixed<20,3,AP_RND_CONV,AP_SAT>", padding_idx=5)],
                                   mode="max", max_bag_size=9),
    # Narrow accumulators: per-step saturation, wrap-around, rounding ties on the weighted products.
    "sat-acc": lambda: make_spec([TableSpec("a", 20, 4, "ap_fixed<8,4>"), TableSpec("r", 20, 3, ROWWISE, "ap_fixed<12,5>")],
                                 mode="sum", max_bag_size=16, acc_type="ap_fixed<12,5,AP_RND_CONV,AP_SAT>",
                                 weight_type="ap_fixed<8,4>", out_type="ap_fixed<8,4,AP_RND_ZERO,AP_SAT_SYM>"),
    "wrap-acc": lambda: make_spec([TableSpec("a", 20, 4, "ap_fixed<8,4>")], mode="sum", max_bag_size=16,
                                  acc_type="ap_fixed<10,4,AP_RND,AP_WRAP>", weight_type="ap_fixed<6,2>"),
    "sat-mean": lambda: make_spec([TableSpec("a", 20, 4, "ap_fixed<8,4>")], mode="mean", max_bag_size=16,
                                  acc_type="ap_fixed<9,5,AP_TRN,AP_SAT_ZERO>", out_type="ap_fixed<6,3,AP_RND_INF,AP_SAT>"),
    "sat-max": lambda: make_spec([TableSpec("a", 20, 4, "ap_fixed<16,6>")], mode="max", max_bag_size=16,
                                 acc_type="ap_fixed<6,2,AP_RND,AP_SAT>"),
}

"""A private, test-only kernel kind: ``y[b, i] = x[b, i] * scale + bias[i]`` with int32 wrap-around.

It exercises the device, bundle and build layers without depending on the real kinds: a spec
dataclass, a NumPy reference, typed validation, generated HLS C++ and the marshalling hooks.
Importing this module registers it (idempotent). Never shipped in the package.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from offload.hls.registry import HlsKind, KernelArg, get_hls_kind, register_hls_kind
from offload.kernels.registry import Kernel, KernelKind, get_kind, register_kind
from offload.kernels.ring import RING_CAPACITY, register_capacity

KIND = "test_scale_add"


@dataclass(frozen=True)
class ScaleAddSpec:
    n: int
    scale: int
    kind: str = KIND

    def to_json(self) -> dict:
        return {"n": self.n, "scale": self.scale}


def _spec_from_json(d: dict) -> ScaleAddSpec:
    return ScaleAddSpec(int(d["n"]), int(d["scale"]))


def _validate(spec, tensors, inputs) -> None:
    if "x" not in inputs:
        raise KeyError("inputs: 'x' is required")
    x = np.asarray(inputs["x"])
    if x.ndim != 2 or x.shape[1] != spec.n:
        raise ValueError(f"x: shape must be (batch, {spec.n}), got {x.shape}")
    if x.dtype.kind not in "iu":
        raise TypeError(f"x: integer dtype required, got {x.dtype}")
    if x.size and (x.min() < -(2**31) or x.max() > 2**31 - 1):
        raise ValueError("x: values must fit int32 [-2147483648, 2147483647]")


def _reference(spec, tensors, inputs) -> dict:
    x = np.asarray(inputs["x"]).astype(np.int64)
    y = (x * spec.scale + tensors["bias"].astype(np.int64)) & 0xFFFFFFFF
    return {"y": y.astype(np.uint32).view(np.int32)}


def _top_name(spec) -> str:
    return f"test_scale_add_n{spec.n}_s{spec.scale}"


def _sources(spec) -> dict[str, str]:
    top = _top_name(spec)
    return {
        f"{top}.cpp": f"""#include <stdint.h>
extern "C" void {top}(const int32_t *bias, const int32_t *x, int32_t *y, int32_t batch) {{
#pragma HLS INTERFACE m_axi port=bias bundle=gmem0
#pragma HLS INTERFACE m_axi port=x bundle=gmem1
#pragma HLS INTERFACE m_axi port=y bundle=gmem1
    for (int32_t b = 0; b < batch; ++b)
        for (int32_t i = 0; i < {spec.n}; ++i)
            y[b * {spec.n} + i] = (int32_t)((uint32_t)x[b * {spec.n} + i] * (uint32_t){spec.scale}u + (uint32_t)bias[i]);
}}
"""
    }


def _top_args(spec):
    return [
        KernelArg("bias", "resident", np.int32, "gmem0"),
        KernelArg("x", "input", np.int32, "gmem1"),
        KernelArg("y", "output", np.int32, "gmem1"),
        KernelArg("batch", "scalar", np.int32),
    ]


def _pack_inputs(spec, inputs):
    x = np.ascontiguousarray(inputs["x"], dtype=np.int32)
    return {"x": x, "y": np.zeros_like(x), "batch": x.shape[0]}


def _unpack(spec, inputs, bufs):
    return {"y": np.asarray(bufs["y"]).reshape(-1, spec.n)}


def _golden_inputs(spec, rng, case):
    return make_inputs(spec.n, 3 + case, int(rng.integers(1 << 30)))


def register() -> None:
    try:
        get_kind(KIND)
    except KeyError:
        register_kind(KernelKind(KIND, _spec_from_json, _validate, _reference, golden_inputs=_golden_inputs))
    try:
        get_hls_kind(KIND)
    except KeyError:
        register_hls_kind(
            HlsKind(KIND, _top_name, _sources, _top_args, lambda spec, t: {"bias": np.asarray(t["bias"], dtype=np.int32)}, _pack_inputs, _unpack)
        )
    if KIND not in RING_CAPACITY:  # a persistent launch's slot: rows x n in, rows x n out
        register_capacity(KIND, lambda spec, rows: {"x": rows * spec.n, "y": rows * spec.n})


register()


def make_kernel(name: str = "sa", n: int = 8, scale: int = 3, seed: int = 0) -> Kernel:
    rng = np.random.default_rng(seed)
    bias = rng.integers(-(2**31), 2**31, size=n, dtype=np.int64).astype(np.int32)
    return Kernel(name, ScaleAddSpec(n, scale), {"bias": bias})


def make_inputs(n: int = 8, batch: int = 5, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**31), 2**31, size=(batch, n), dtype=np.int64).astype(np.int32)
    # Adversarial corners: extremes wrap around in both the reference and the C++.
    x.flat[:4] = [-(2**31), 2**31 - 1, 0, -1][: min(4, x.size)]
    return {"x": x}

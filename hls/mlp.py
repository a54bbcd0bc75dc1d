"""HLS generator for kernel kind ``mlp``: hls4ml's firmware wrapped in a Vitis kernel.

hls4ml (Vitis backend, io_parallel, the spec's strategy: Latency, or distributed arithmetic on the
Dense layers, written by da4ml into ``nnet_code_gen.h``) writes the network from the spec alone -
layer list and per-layer types built here, no torch - with the weights as C++ constants
(``WriteWeightsTxt=False``). The firmware files are collected flat (``weights/w2.h`` ->
``w2.h``, so ``offload.hls.csim.build`` and the emu device compile them as one source set) and a
kernel from ``hls/templates/mlp/kernel.cpp.tmpl`` wraps the network: m_axi input and output
buffers, s_axilite control, a batch loop pipelined at II = reuse factor.

The generated C++ includes hls4ml's ``nnet_utils`` through the csim include path (the Vivado
flavour; the Vitis backend only overrides stream/conv/pooling headers, none of which an
io_parallel MLP uses) and needs no Vitis to compile.

Top function ABI::

    void offload_mlp_<digest>(
        const <in_store> *x,      // input, bundle gmem_in: B x n_features raw input_t
        <out_store> *y,           // output, bundle gmem_out: B x n_out raw result_t
        int n)                    // scalar: batch size B

Example::

    from offload.hls.registry import get_hls_kind
    hk = get_hls_kind("mlp")
    srcs = hk.sources(spec)          # {"offload_mlp_<digest>.cpp": ..., "mlpnet_<digest>.cpp": ..., ...}
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import string
import tempfile
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from offload.hls import csim
from offload.hls.registry import HlsKind, KernelArg, register_hls_kind
from offload.kernels.mlp import MlpSpec
from offload.kernels.table_format import container_dtype
from offload.sim.mlp.strategy import DA

__all__ = [
    "IN_BUNDLE",
    "OUT_BUNDLE",
    "hls_config",
    "layer_list",
    "build_model",
    "firmware_sources",
    "top_name",
    "top_args",
    "sources",
    "pack_resident",
    "pack_inputs",
    "unpack_outputs",
    "container_dtype",
    "HLS_KIND",
]

IN_BUNDLE = "gmem_in"
OUT_BUNDLE = "gmem_out"
# Samples per call that C/RTL co-simulation provisions: the m_axi depths are sized for it (UG1399,
# "Multi-Access Pointers and RTL Simulation"); the catalogue's golden vectors hold 24 samples.
COSIM_BATCH = 64
INPUT_NAME = "input_1"
_TABLE_OPS = ("sigmoid", "tanh")


_CTYPE = {
    "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
    "int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t",
}


def project_name(spec: MlpSpec) -> str:
    return f"mlpnet_{spec.digest()}"


def top_name(spec: MlpSpec) -> str:
    return f"offload_mlp_{spec.digest()}"


# -- the hls4ml model ----------------------------------------------------------------------------
def hls_config(spec: MlpSpec, *, trace: bool = False) -> dict:
    """hls4ml ``HLSConfig`` (granularity 'name') with exactly the spec's types and reuse factor.

    Every type is explicit, so hls4ml infers nothing and fuses nothing (its BatchNorm fusion only
    applies when the dense output type is unspecified). Activation tables are set through the
    ``table_t`` layer key as well as ``Precision['table']``: hls4ml 1.3 reads only the former.
    A DA spec sets ``Strategy: distributed_arithmetic`` on its Dense layers only: hls4ml's DA pass
    raises for any other layer (``DistributedArithmeticCodegen.match``).
    """
    layers: dict[str, dict] = {INPUT_NAME: {"Trace": trace, "Precision": {"result": str(spec.input_type)}}}
    for layer in spec.layers:
        cfg: dict[str, Any] = {"Trace": trace, "Precision": {r: str(t) for r, t in layer.types().items()}, "ReuseFactor": spec.reuse_factor}
        if layer.op == "dense" and not layer.use_bias:
            cfg["Precision"]["bias"] = "ap_fixed<16,6>"  # unused: hls4ml emits an ap_uint<1> zero bias
        if layer.op in _TABLE_OPS:
            cfg["TableSize"] = int(layer.table_size)
            cfg["table_t"] = str(layer.table)
        if layer.op == "dense" and spec.strategy == DA:
            cfg["Strategy"] = "distributed_arithmetic"
        layers[layer.name] = cfg
    return {
        "Model": {
            "Precision": {"default": str(spec.input_type)},
            "ReuseFactor": spec.reuse_factor,
            "Strategy": "Latency",
            "BramFactor": 1_000_000_000,
            "TraceOutput": False,
        },
        "LayerName": layers,
    }


def layer_list(spec: MlpSpec, float_weights: Mapping[str, np.ndarray] | None = None) -> list[dict]:
    """The layer dicts hls4ml's PyTorch parser would produce, from the spec.

    ``float_weights`` (name -> float array in the spec's layout) defaults to the spec's raw
    constants as exact dyadic values, which hls4ml prints exactly and the firmware reads back
    unchanged.
    """
    raw = spec.tensors()
    types = spec.tensor_types()
    if float_weights is None:
        float_weights = {k: types[k].to_float(v) for k, v in raw.items()}
    out: list[dict] = [{"name": INPUT_NAME, "class_name": "InputLayer", "input_shape": [spec.n_features]}]
    prev = INPUT_NAME
    for layer in spec.layers:
        d: dict[str, Any] = {"name": layer.name, "inputs": [prev]}
        if layer.op == "dense":
            w = np.asarray(float_weights[f"{layer.name}.weight"], dtype=np.float64)
            d.update(class_name="Dense", n_in=layer.n_in, n_out=layer.n_out, use_bias=layer.use_bias)
            # [n_in, n_out]: the firmware's order (index ii * n_out + jj). The PyTorch parser passes
            # [n_out, n_in] and relies on ChannelsLastConversion to transpose; that pass is off here.
            d["weight_data"] = w
            d["bias_data"] = np.asarray(float_weights[f"{layer.name}.bias"], dtype=np.float64) if layer.use_bias else None
        elif layer.op == "batchnorm":
            d.update(class_name="BatchNormalization", data_format="channels_first", n_in=layer.n_in,
                     n_out=layer.n_out, n_filt=-1, use_gamma=True, use_beta=True, epsilon=0.0)
            d["scale_data"] = np.asarray(float_weights[f"{layer.name}.scale"], dtype=np.float64)
            d["bias_data"] = np.asarray(float_weights[f"{layer.name}.bias"], dtype=np.float64)
        elif layer.op == "leaky_relu":
            d.update(class_name="LeakyReLU", activation="leakyrelu", activ_param=float(layer.alpha))
        else:
            d.update(class_name="Activation", activation=layer.op)
        out.append(d)
        prev = layer.name
    return out


def build_model(
    spec: MlpSpec,
    output_dir: str | os.PathLike,
    *,
    float_weights: Mapping[str, np.ndarray] | None = None,
    project: str | None = None,
    write_weights_txt: bool = True,
    trace: bool = False,
):
    """An hls4ml ``ModelGraph`` (Vitis, io_parallel) of the spec; not written, not compiled.

    ``trace=True`` records every layer's output for ``ModelGraph.trace`` (debugging).
    """
    from hls4ml.model.graph import ModelGraph
    from hls4ml.utils.config import create_config

    config = create_config(
        output_dir=str(output_dir),
        project_name=project or project_name(spec),
        backend="Vitis",
        io_type="io_parallel",
        write_weights_txt=write_weights_txt,
    )
    config["HLSConfig"] = hls_config(spec, trace=trace)
    config["InputShape"] = [spec.n_features]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ModelGraph.from_layer_list(config, layer_list(spec, float_weights), inputs=[INPUT_NAME], outputs=[spec.layers[-1].name])


def _cache_root() -> Path:
    return csim.cache_dir().parent / "mlp-src"


@functools.lru_cache(maxsize=32)
def _firmware_cached(spec_json: str) -> tuple[tuple[str, str], ...]:
    import hls4ml

    spec = MlpSpec.from_json(json.loads(spec_json))
    # Keyed by the hls4ml version too: another hls4ml writes other firmware for the same spec
    # (and by da4ml's under DA, which writes the Dense layers).
    tag = f"hls4ml{hls4ml.__version__}"
    if spec.strategy == DA:
        tag += f"-da4ml{importlib.metadata.version('da4ml')}"
    cached = _cache_root() / f"{spec.digest()}-{tag}.json"
    if cached.is_file():
        return tuple(sorted(json.loads(cached.read_text()).items()))
    proj = project_name(spec)
    with tempfile.TemporaryDirectory(prefix="offload-mlp-") as tmp:
        model = build_model(spec, tmp, write_weights_txt=False)
        model.write()
        fw = Path(tmp) / "firmware"
        files: dict[str, str] = {}
        for p in [fw / f"{proj}.cpp", fw / f"{proj}.h", fw / "defines.h", fw / "parameters.h", *sorted((fw / "weights").glob("*.h"))]:
            text = p.read_text()
            files[p.name] = re.sub(r'#include\s+"weights/', '#include "', text)
        if spec.strategy == DA:
            # da4ml's Dense functions live in the project's copy of nnet_utils/nnet_code_gen.h
            # (hls4ml/writer/vivado_writer.py, write_generated_code). Flattened like the weights:
            # parameters.h includes it first, so its guard also shuts out the installed (empty)
            # copy; its own sibling includes point back at the installed nnet_utils.
            gen = (fw / "nnet_utils" / "nnet_code_gen.h").read_text()
            files["nnet_code_gen.h"] = re.sub(r'#include\s+"(nnet_\w+\.h)"', r'#include "nnet_utils/\1"', gen)
            files["parameters.h"] = files["parameters.h"].replace('#include "nnet_utils/nnet_code_gen.h"', '#include "nnet_code_gen.h"')
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(dir=cached.parent, prefix=".staged-")
    with os.fdopen(fd, "w") as f:
        json.dump(files, f)
    os.replace(staged, cached)
    return tuple(sorted(files.items()))


def firmware_sources(spec: MlpSpec) -> dict[str, str]:
    """hls4ml's firmware for the spec (network, types, parameters, weight headers), flattened."""
    return dict(_firmware_cached(json.dumps(spec.to_json(), sort_keys=True)))


def _prototype(header: str, proj: str) -> tuple[str, str]:
    m = re.search(rf"void\s+{proj}\s*\(\s*(\w+)\s+\w+\[\d+\]\s*,\s*(\w+)\s+\w+\[\d+\]\s*\)", header)
    if not m:
        raise RuntimeError(f"unexpected hls4ml top-level prototype in {proj}.h")
    return m.group(1), m.group(2)


def sources(spec: MlpSpec) -> dict[str, str]:
    """All C++ of the kernel: hls4ml's firmware plus the generated top function."""
    fw = firmware_sources(spec)
    proj = project_name(spec)
    input_t, result_t = _prototype(fw[f"{proj}.h"], proj)
    it, ot = spec.input_type, spec.output_type
    template = (resources.files("offload.hls") / "templates" / "mlp" / "kernel.cpp.tmpl").read_text()
    top = string.Template(template).substitute(
        project=proj,
        top=top_name(spec),
        in_store=_CTYPE[container_dtype(it).name],
        out_store=_CTYPE[container_dtype(ot).name],
        in_bundle=IN_BUNDLE,
        out_bundle=OUT_BUNDLE,
        depth_in=COSIM_BATCH * spec.n_features,
        depth_out=COSIM_BATCH * spec.n_outputs,
        ii=spec.reuse_factor,
        input_t=input_t,
        result_t=result_t,
        n_in=spec.n_features,
        n_out=spec.n_outputs,
        in_w=it.width,
        out_w=ot.width,
        out_int_t=f"ap_{'' if ot.signed else 'u'}int<{ot.width}>",
        out_conv="to_int64" if ot.signed else "to_uint64",
    )
    return {**fw, f"{top_name(spec)}.cpp": top}


def top_args(spec: MlpSpec) -> list[KernelArg]:
    """``x`` (input), ``y`` (output), ``n`` (scalar): the weights are compile-time constants."""
    return [
        KernelArg("x", "input", container_dtype(spec.input_type), IN_BUNDLE),
        KernelArg("y", "output", container_dtype(spec.output_type), OUT_BUNDLE),
        KernelArg("n", "scalar", np.dtype(np.int32)),
    ]


def pack_resident(spec: MlpSpec, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """No resident buffers: hls4ml compiles the weights into the kernel."""
    return {}


def pack_inputs(spec: MlpSpec, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """``x`` float [B, F] -> raw ``input_t`` (``input_t(double)`` as hls4ml's bridge does), zero ``y``, ``n``."""
    x = np.asarray(inputs["x"], dtype=np.float64)
    raw = spec.input_type.quantize(x)
    b = x.shape[0]
    return {
        "x": np.ascontiguousarray(raw.astype(container_dtype(spec.input_type)).ravel()),
        "y": np.zeros(b * spec.n_outputs, dtype=container_dtype(spec.output_type)),
        "n": np.int32(b),
    }


def unpack_outputs(spec: MlpSpec, inputs: Mapping[str, np.ndarray], buffers: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Raw ``result_t`` -> ``{"y": float64 [B, n_out]}`` (``double(result_t)``)."""
    b = np.asarray(inputs["x"]).shape[0]
    y = np.asarray(buffers["y"]).astype(np.int64).reshape(b, spec.n_outputs)
    return {"y": spec.output_type.to_float(y)}


HLS_KIND = register_hls_kind(HlsKind("mlp", top_name, sources, top_args, pack_resident, pack_inputs, unpack_outputs))

"""Trace an ``mlp`` kernel spec into da4ml's fixed-point graph and write it as pipelined Verilog.

Every layer becomes da4ml operations whose values are, by construction, the simulator's
(:mod:`offload.sim.mlp`) bit for bit:

- Dense: ``x @ W`` as a constant matrix-vector product (da4ml's distributed-arithmetic adder
  graph, exact), ``+ bias`` (exact), then the cast into ``result_t``. Exact accumulation is what
  hls4ml's ``distributed_arithmetic`` strategy does (it ignores ``accum_t``), and what the latency
  strategy does too when its ``accum_t`` casts can never round or overflow. When they can, a
  wrapping ``accum_t`` is realised literally (each product cast into it, summed modulo 2**W, no
  shared adder graph); a saturating one raises :class:`~offload.sim.errors.UnsupportedError`.
- BatchNorm: ``x * scale + bias`` with constant multipliers (shift-add), exact, then the cast.
- ReLU / LeakyReLU: ``max(x, 0)`` and ``alpha * min(x, 0)`` (exact), each cast into ``result_t``
  and added (one of the two is always zero, and ``(result_t)0 == 0`` in every mode).
- Sigmoid / Tanh: one lookup table over the whole code domain of the layer's input (every value
  its input can take), each entry computed by the simulator's own activation (hls4ml's table,
  index arithmetic and cast): the RTL equals hls4ml exactly by construction.

Casts use da4ml's ``quantize`` (TRN/RND rounding, WRAP/SAT/SAT_SYM overflow); AP_RND_CONV (ties to
even, Brevitas's and torch's rounding) adds a bias built from the kept LSB and truncates. The other
ap_types modes are accepted only where the cast cannot round (or overflow) at all.

Example::

    design = trace_spec(spec, tensors, clock_mhz=300)
    write_design(design, "build/risk_rtl")     # src/*.v, src/memfiles/*.mem, offload_top.v, offload_stream.v
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Mapping

import numpy as np

from offload.hls.rtl import stream
from offload.sim.errors import InputError, ToolError, UnsupportedError
from offload.sim.fixed import FixedType, mul_type
from offload.sim.mlp import MlpLayer, forward

__all__ = ["Design", "trace_spec", "write_design", "latency_cutoff", "layer_stages", "TOP", "MAX_TABLE_ENTRIES",
           "ADDER_LEVELS_PER_NS"]

TOP = "offload_top"
NET = "offload_net"
# A sigmoid/tanh input wider than 16 bits would need a ROM of more than 64K entries per lane.
MAX_TABLE_ENTRIES = 1 << 16
# da4ml's latency unit is one adder level (cost_add with the default HWConfig). Its command-line
# converter pairs a 5 ns clock with a cutoff of 5 levels (da4ml 0.5.2, _cli/convert.py defaults:
# conservative, 1 level/ns). We assume ~0.65 ns per level on UltraScale+ (-2): a LUT, a CARRY8
# chain of <= 24 bits and local routing; 300 MHz -> 5 levels a stage. An assumption, not a
# Vivado timing result: to_rtl(latency_cutoff=...) overrides it.
ADDER_LEVELS_PER_NS = 1.5
_ROUND = {"AP_TRN": "TRN", "AP_RND": "RND"}
_OVERFLOW = {"AP_WRAP": "WRAP", "AP_SAT": "SAT", "AP_SAT_SYM": "SAT_SYM"}
# float32 holds integers up to 2**24 exactly: da4ml's CMVM solver reads the matrix as float32.
_F32_EXACT = 1 << 24


@dataclass
class Design:
    """A traced network: da4ml's pipeline plus what the testbench and reports need."""

    pipeline: object  # da4ml.cmvm.types.Pipeline
    n_in: int
    n_out: int
    input_type: FixedType
    output_type: FixedType
    clock_mhz: float
    cutoff: float
    in_bits: int  # per input lane in the uniform wrapper port
    out_bits: int  # per output lane in the uniform wrapper port
    out_frac: int  # LSB of the uniform output lanes is 2**-out_frac
    out_signed: bool
    # (layer name, adder levels from the input to the layer's slowest output), in layer order.
    layer_levels: tuple[tuple[str, float], ...] = ()

    @property
    def stages(self) -> int:
        """Combinational stages da4ml split the network into (each ends in a register)."""
        return len(self.pipeline.solutions)

    @property
    def pipeline_depth(self) -> int:
        """Registers between input and output: one before each stage, plus the output register
        (da4ml 0.5.2 codegen/rtl/verilog/pipeline.py: ``stage0_inp <= model_inp`` ...
        ``model_out <= stage{N-1}_out``)."""
        return self.stages + 1

    @property
    def cost(self) -> float:
        """da4ml's own LUT estimate of the logic."""
        return float(self.pipeline.cost)

    @property
    def reg_bits(self) -> int:
        return int(self.pipeline.reg_bits)


def latency_cutoff(clock_mhz: float) -> float:
    """Adder levels per pipeline stage for a clock target (at least one)."""
    if not isinstance(clock_mhz, (int, float)) or not np.isfinite(clock_mhz) or not 1.0 <= clock_mhz <= 2000.0:
        raise InputError(f"clock_mhz must be in 1..2000 MHz, got {clock_mhz!r}")
    return float(max(1, int(1000.0 / clock_mhz * ADDER_LEVELS_PER_NS + 1e-9)))


def _kif(t: FixedType) -> tuple[int, int, int]:
    return int(t.signed), t.I - int(t.signed), t.F


def _half_even_bias(v, f: int):
    """``v`` plus what makes a floor to ``2**-f`` round half to even (AP_RND_CONV), exactly.

    With ``s = 2**-f`` the kept step and ``e`` the step of ``v`` (``e <= s/2``), adding
    ``s/2 - e`` and then ``e`` times the kept LSB of ``floor(v / s)`` moves the floor up exactly
    when the dropped part is over half (it is then at least ``s/2 + e``) or exactly half with an
    odd kept LSB; a dropped part below half is at most ``s/2 - e`` and stays below ``s``. The LSB
    is a one-bit wrap of ``v`` (da4ml's ``quantize(0, 1 - f, f)``, weight ``s``), scaled by
    ``e/s`` (a shift): two additions and no comparison.
    """
    s, e = Decimal(2) ** -f, v.step
    if e >= s:
        return v  # nothing is dropped
    lsb = v.quantize(0, 1 - f, f, "WRAP", "TRN")
    return (v + (s / 2 - e)) + lsb * (e / s)


def _cast(v, t: FixedType, what: str):
    """``(t)v`` on a FixedVariableArray, ap_types semantics."""
    from da4ml.trace import FixedVariableArray

    k, i, f = _kif(t)
    if t.sat_bits:
        raise UnsupportedError(f"{what}: type {t} has saturation bits N={t.sat_bits}; the RTL tier supports N=0")
    rnd = _ROUND.get(t.rounding)
    if rnd is None and t.rounding == "AP_RND_CONV":
        # da4ml rounds only TRN and RND: ties to even is built from exact additions, then truncated.
        biased = np.array([_half_even_bias(x, f) for x in v._vars.ravel()], dtype=object).reshape(v._vars.shape)
        v, rnd = FixedVariableArray(biased, v.solver_options), "TRN"
    elif rnd is None:
        # Any other rounding mode is fine when nothing is rounded away.
        if int(np.max(v.kif[2])) > f:
            raise UnsupportedError(
                f"{what}: rounding mode {t.rounding} of {t} would round here; the RTL tier supports AP_TRN, AP_RND and AP_RND_CONV"
            )
        rnd = "TRN"
    ovf = _OVERFLOW.get(t.overflow)
    if ovf is None:
        lo = min(float(x.low) for x in v._vars.ravel())
        hi = max(float(x.high) for x in v._vars.ravel())
        if lo < t.min_float or hi > t.max_float:
            raise UnsupportedError(f"{what}: overflow mode {t.overflow} of {t} could apply here; the RTL tier supports AP_WRAP, AP_SAT, AP_SAT_SYM")
        ovf = "WRAP"
    return v.quantize(k, i, f, overflow_mode=ovf, round_mode=rnd)


def _floats(raw: np.ndarray, t: FixedType, what: str) -> np.ndarray:
    raw = np.asarray(raw, dtype=np.int64)
    if raw.size and int(np.abs(raw).max()) >= _F32_EXACT:
        raise UnsupportedError(f"{what}: raw constants of {t} exceed 2**24 (da4ml reads constants as float32)")
    return raw.astype(np.float64) * 2.0 ** (-t.F)


def _inexact_accum(layer: MlpLayer, xt: FixedType, x, w_raw: np.ndarray, b_raw: np.ndarray | None) -> str | None:
    """Why a latency-strategy dense layer's accum_t casts could round or overflow (None: they cannot)."""
    at, wt = layer.accum, layer.weight
    pt = mul_type(xt, wt)
    if pt.F > at.F:
        return f"products have {pt.F} fraction bits, accum {at} keeps {at.F}"
    if layer.use_bias and layer.bias.F > at.F:
        return f"bias has more fraction bits than accum {at}"
    if not at.signed:
        return f"accum {at} is unsigned"
    xmax = np.array([max(abs(float(v.low)), abs(float(v.high))) for v in x._vars.ravel()])
    bound = xmax @ np.abs(w_raw.astype(np.float64) * 2.0 ** (-wt.F))
    if b_raw is not None:
        bound = bound + np.abs(b_raw.astype(np.float64)) * 2.0 ** (-layer.bias.F)
    if bound.size and float(bound.max()) > min(at.max_float, -at.min_float):
        return f"partial sums can reach {float(bound.max()):g}, beyond accum {at}"
    return None


def _dense_stepwise(layer: MlpLayer, x, w: np.ndarray, b_raw: np.ndarray | None, why: str):
    """hls4ml's latency-strategy dense layer literally: ``mult = (accum_t)(x * w)``, ``acc += mult``.

    Only for a wrapping accum_t: wrapping every product and every partial sum into W bits is the
    total modulo 2**W, so the products can be added in any order (no shared adder graph: this is
    the latency strategy's datapath, not distributed arithmetic). A saturating accum_t would need a
    clamp after every addition in index order; it is refused.
    """
    at = layer.accum
    what = f"layer {layer.name!r} (dense)"
    if at.overflow != "AP_WRAP" or at.sat_bits:
        raise UnsupportedError(
            f"{what}: its accumulator {at} would round or overflow ({why}) and saturates step by step, which the "
            f"RTL tier does not realise; widen accum or use strategy='distributed_arithmetic'"
        )
    from da4ml.trace import FixedVariableArray

    if b_raw is not None:
        acc0 = at.to_float(at.cast(np.asarray(b_raw, dtype=np.int64), layer.bias))
    else:
        acc0 = np.zeros(layer.n_out)
    outs = []
    for j in range(layer.n_out):
        terms = _cast(x * w[:, j], at, f"{what} product")
        total = terms._vars[0]
        for v in terms._vars[1:]:
            total = total + v
        outs.append(total + float(acc0[j]))
    acc = FixedVariableArray(np.array(outs, dtype=object), x.solver_options)
    return _cast(acc, at, f"{what} accum")


def _table_layer(layer: MlpLayer, xt: FixedType, x):
    """Sigmoid/tanh as per-lane lookups filled by the simulator over each lane's input codes."""
    from da4ml.trace import FixedVariableArray

    rt = layer.result
    one = dataclasses.replace(layer, n_in=1, n_out=1)
    outs = []
    cache: dict[tuple[Decimal, Decimal, Decimal], np.ndarray] = {}
    for v in x._vars.ravel():
        key = (v.low, v.high, v.step)
        if key not in cache:
            n = int((v.high - v.low) / v.step) + 1
            if n > MAX_TABLE_ENTRIES:
                raise UnsupportedError(
                    f"layer {layer.name!r} ({layer.op}): its input {xt} takes {n} values, over the "
                    f"{MAX_TABLE_ENTRIES}-entry lookup limit; use a narrower type before it"
                )
            values = np.array([float(v.low + j * v.step) for j in range(n)], dtype=np.float64)
            raw = forward(str(xt), [one], {}, values[:, None])[:, 0]
            cache[key] = rt.to_float(raw)
        outs.append(v.lookup(cache[key]) if v.low != v.high else cache[key][0])
    return FixedVariableArray(np.array(outs, dtype=object).reshape(x._vars.shape), x.solver_options)


def _levels(x) -> float:
    """Adder levels (da4ml's latency unit) from the network's input to the slowest of ``x``."""
    return max((float(v.latency) for v in x._vars.ravel()), default=0.0)


def _trace_layers(spec, tensors: Mapping[str, np.ndarray], cutoff: float, exact_accumulation: bool, levels: list | None = None):
    from da4ml.trace import FixedVariableArray, HWConfig

    hw = HWConfig(1, -1, cutoff)
    t = spec.input_type
    k, i, f = _kif(t)
    n = spec.n_features
    x_in = FixedVariableArray.from_kif(np.full(n, k), np.full(n, i), np.full(n, f), hwconf=hw)
    x = x_in
    for layer in spec.layers:
        rt = layer.result
        what = f"layer {layer.name!r} ({layer.op})"
        if layer.op == "dense":
            wt = layer.weight
            w_raw = np.asarray(tensors[f"{layer.name}.weight"], dtype=np.int64)
            b_raw = np.asarray(tensors[f"{layer.name}.bias"], dtype=np.int64) if layer.use_bias else None
            w = _floats(w_raw, wt, f"{what} weight")
            why = None if exact_accumulation else _inexact_accum(layer, t, x, w_raw, b_raw)
            if why is None:
                y = x @ w
                if b_raw is not None:
                    y = y + _floats(b_raw, layer.bias, f"{what} bias")
            else:
                y = _dense_stepwise(layer, x, w, b_raw, why)
            x = _cast(y, rt, what)
        elif layer.op == "batchnorm":
            st, bt = layer.scale, layer.bias
            s = _floats(tensors[f"{layer.name}.scale"], st, f"{what} scale")
            b = _floats(tensors[f"{layer.name}.bias"], bt, f"{what} bias")
            x = _cast(x * s + b, rt, what)
        elif layer.op == "relu":
            x = _cast(x.relu(), rt, what)
        elif layer.op == "leaky_relu":
            pt = layer.param
            alpha = float(pt.to_float(pt.quantize(np.float64(layer.alpha))))
            neg = -((-x).relu())
            x = _cast(x.relu(), rt, what) + _cast(neg * alpha, rt, what)
        elif layer.op in ("sigmoid", "tanh"):
            x = _table_layer(layer, t, x)
        else:
            raise UnsupportedError(f"{what}: no RTL mapping")
        t = rt
        if levels is not None:
            levels.append((layer.name, _levels(x)))
    return x_in, x


def layer_stages(layer_levels, cutoff: float) -> list[tuple[str, int]]:
    """Pipeline stages each layer adds: da4ml puts an operation in stage ``floor(levels / cutoff)``
    (da4ml 0.5.2 trace/pipeline.py ``get_stage``), so a layer ending at ``levels`` closes that
    stage; the count is before da4ml's retiming, which moves registers but keeps the total."""
    out, done = [], 0
    for name, lv in layer_levels:
        end = int(np.floor(float(lv) / (cutoff + 1e-9))) + 1
        out.append((name, max(end - done, 0)))
        done = max(done, end)
    return out


def trace_spec(spec, tensors: Mapping[str, np.ndarray], *, clock_mhz: float = 300.0, exact_accumulation: bool = False,
               cutoff: float | None = None) -> Design:
    """Trace ``spec`` (an :class:`offload.kernels.mlp.MlpSpec`) with its raw weights into a pipelined design.

    ``exact_accumulation``: the spec's strategy accumulates exactly (distributed arithmetic);
    otherwise every dense layer's accum_t must be exact for its inputs (checked).
    """
    from da4ml.cmvm.types import _minimal_kif
    from da4ml.trace import comb_trace, to_pipeline

    if cutoff is None:
        cutoff = latency_cutoff(clock_mhz)
    elif not isinstance(cutoff, (int, float)) or not 1 <= cutoff <= 1000:
        raise InputError(f"latency_cutoff must be 1..1000 adder levels, got {cutoff!r}")
    levels: list[tuple[str, float]] = []
    x_in, y = _trace_layers(spec, tensors, cutoff, exact_accumulation, levels)
    comb = comb_trace(x_in, y, keep_dead_inputs=True)
    pipe = to_pipeline(comb, cutoff, verbose=False)
    kin = [_minimal_kif(q) for q in pipe.inp_qint]
    kout = [_minimal_kif(q) for q in pipe.out_qint]
    in_bits = max(kk + ii for kk, ii, _ in kin) + max(ff for _, _, ff in kin)
    out_bits = max(kk + ii for kk, ii, _ in kout) + max(ff for _, _, ff in kout)
    t_in = spec.input_type
    if in_bits != t_in.W or max(ff for _, _, ff in kin) != t_in.F:
        raise ToolError(f"da4ml narrowed the input lanes to {kin[0]}, expected {_kif(t_in)} (the testbench feeds whole input codes)")
    return Design(pipe, spec.n_features, spec.n_outputs, t_in, spec.output_type, float(clock_mhz), cutoff,
                  in_bits, max(out_bits, 1), max(ff for _, _, ff in kout), any(kk for kk, _, _ in kout), tuple(levels))


def top_verilog(d: Design) -> str:
    """The testbench's top: da4ml's uniform-port wrapper plus a valid bit travelling beside the data."""
    depth = d.pipeline_depth
    return f"""`timescale 1 ns / 1 ps
// Generated by offload.hls.rtl: {NET}_wrapper (da4ml) with a valid line of the pipeline's depth.
module {TOP} (
    input clk,
    input in_valid,
    input [{d.n_in * d.in_bits - 1}:0] in_data,
    output out_valid,
    output [{d.n_out * d.out_bits - 1}:0] out_data
);
    reg [{depth - 1}:0] valid_q = {depth}'b0;
    always @(posedge clk) valid_q <= {{valid_q[{max(depth - 2, 0)}:0], in_valid}};
    assign out_valid = valid_q[{depth - 1}];
    {NET}_wrapper net (.clk(clk), .model_inp(in_data), .model_out(out_data));
endmodule
"""


def warm() -> None:
    """Trace a 4-2 dense layer once: compiles and caches da4ml's numba kernels (set-up runs this)."""
    from offload.kernels.mlp import MlpSpec

    spec = MlpSpec(4, "ap_fixed<8,3>", (MlpLayer("fc0", "dense", 4, 2, "ap_fixed<12,5>", weight="ap_fixed<6,1>",
                                                bias="ap_fixed<6,1>", accum="ap_fixed<20,8>"),),
                   {"fc0.weight": np.arange(8) - 4, "fc0.bias": np.array([3, -2])})
    trace_spec(spec, spec.tensors())


def write_design(d: Design, out_dir: str | Path, *, tag_bits: int = stream.TAG_BITS) -> dict[str, object]:
    """Write da4ml's Verilog project and our two tops (``offload_top``: a valid line; ``offload_stream``:
    AXI4-Stream ports, ``tag_bits`` of request tag) into ``out_dir``; returns the metadata written."""
    from da4ml.codegen import VerilogModel

    stream.check_tag_bits(tag_bits)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = VerilogModel(d.pipeline, NET, out, latency_cutoff=d.cutoff, print_latency=False, clock_period=1000.0 / d.clock_mhz,
                         part_name="xcu55c-fsvh2892-2L-e")
    meta = {"stages": d.stages, "pipeline_depth": d.pipeline_depth, "clock_mhz": d.clock_mhz, "latency_cutoff": d.cutoff,
            "da4ml_cost_lut": d.cost, "da4ml_reg_bits": d.reg_bits, "in_bits": d.in_bits, "out_bits": d.out_bits,
            "out_frac": d.out_frac, "out_signed": d.out_signed, "n_in": d.n_in, "n_out": d.n_out,
            "layer_levels": [[n, lv] for n, lv in d.layer_levels],
            "layer_stages": [[n, k] for n, k in layer_stages(d.layer_levels, d.cutoff)],
            "tag_bits": tag_bits, "fifo_depth": stream.fifo_depth(d.pipeline_depth)}
    meta["stream_latency"] = stream.claimed_latency(meta)
    meta["stream_ii"] = stream.CLAIMED_II
    model.write(metadata=dict(meta))
    (out / "src" / f"{TOP}.v").write_text(top_verilog(d))
    (out / "src" / f"{stream.STREAM_TOP}.v").write_text(stream.stream_verilog(meta, NET))
    (out / "offload_rtl.json").write_text(json.dumps(meta, sort_keys=True))
    return meta


TOPS = (TOP, stream.STREAM_TOP)


def verilog_sources(out_dir: str | Path, top: str | None = TOP) -> list[Path]:
    """The Verilog files of a written design in a stable order: static cells, da4ml's stages and
    wrapper, then ``top``'s own file (``None``: the network alone, its top ``offload_net_wrapper``)."""
    if top is not None and top not in TOPS:
        raise InputError(f"top must be one of {TOPS}, got {top!r}")
    src = Path(out_dir) / "src"
    net = sorted(p for p in src.glob("*.v") if p.stem not in TOPS)
    return sorted((src / "static").glob("*.v")) + net + ([src / f"{top}.v"] if top is not None else [])

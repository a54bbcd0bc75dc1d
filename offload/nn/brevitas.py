"""A Brevitas network (quantization-aware trained in PyTorch) as an ``mlp`` kernel with the same bits.

Brevitas layers are mapped directly, one ap_types type per quantizer, rather than through QONNX
and hls4ml's ONNX reader: the quantizers' integer weights, power-of-two scales, bit widths,
signedness, narrow range and rounding are all on the modules, and reading them gives the exact
types (QONNX's ``Quant`` nodes carry the same fields, after an export and a clean-up pass that
add nothing the kernel needs).

==================  =====================================================================
Brevitas            kernel
==================  =====================================================================
QuantIdentity       the input type (first layer), else the result type of the Linear before it
QuantLinear         dense: weights as their exact quantized values in ``ap_fixed<b, b-f>``
                    (``AP_SAT_SYM`` for narrow range), bias quantized as Brevitas does
                    (``Int*Bias``: scale = input scale x weight scale) or, unquantized, in
                    the fewest fraction bits that hold its float32 value; an exact
                    accumulator (no rounding, no overflow); ``output_quant`` its result type
QuantReLU           relu whose result type is the activation quantizer's
QuantSigmoid/Tanh   hls4ml's table sigmoid/tanh with the quantizer's result type (see below)
Dropout, Identity   nothing
==================  =====================================================================

Rounding: Brevitas's ``ROUND`` is ``torch.round``, half to even: ``AP_RND_CONV``; ``FLOOR`` is
``AP_TRN``, ``ROUND_TO_ZERO`` is ``AP_TRN_ZERO``; clamping is ``AP_SAT`` (``AP_SAT_SYM`` for a
signed narrow range). Refused, with the layer named (:class:`~offload.sim.errors.UnsupportedError`):
a scale that is not a power of two, a non-zero zero point, per-channel scales on an activation,
a rounding mode ap_types lacks (``CEIL``), a layer with no kernel counterpart, a network without
an input quantizer (a float input has no type).

Where the two agree bit for bit, and where not:

- Linear, ReLU, Identity with quantized (or no) bias: Brevitas computes in float32, which is exact
  while every accumulator, counted in units of its step, stays below 2**24; the kernel's is exact
  always. Then ``simulate`` equals Brevitas's forward bit for bit (``exact_in_float32`` per layer
  says whether the bound holds; where it does not, Brevitas itself rounds, and the kernel is the
  exact one).
- A float (unquantized) bias: Brevitas adds it in float32, rounding the sum to 24 significant
  bits; the kernel adds it exactly. The next quantizer's output then differs by one step, and only
  on rows whose exact sum lies within half a float32 ulp of a rounding tie (``float_bias`` lists
  those layers).
- Sigmoid/Tanh: Brevitas quantizes float32 ``sigmoid(x)``; hls4ml reads a table of ``table_size``
  entries over [-8, 8) (tanh: [-4, 4)) indexed by the truncated input: outputs differ by at most
  ``table_bound`` (the table's step times the function's largest slope, plus a table lsb, plus one
  output step), reported per layer.

Example::

    mlp = offload.nn.MLP.from_brevitas(qmodel)        # qmodel: QuantIdentity, QuantLinear, QuantReLU, ...
    mlp.simulate(x) == qmodel(torch.from_numpy(x)).value.numpy()
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from offload.quant.ptq import FloatLayer
from offload.sim.errors import UnsupportedError
from offload.sim.fixed import FixedType

__all__ = ["BrevitasMapping", "LayerMap", "map_brevitas", "ROUNDING"]

ROUNDING = {"ROUND": "AP_RND_CONV", "FLOOR": "AP_TRN", "ROUND_TO_ZERO": "AP_TRN_ZERO"}
_FLOAT32_EXACT_BITS = 24  # float32's significand: integers below 2**24 are exact
_MAX_BIAS_FRACTION = 40
_TABLE_SIZE = 1024
_TABLE_TYPE = "ap_fixed<18,2,AP_RND_CONV,AP_SAT>"


@dataclass
class LayerMap:
    """How one Brevitas module became kernel layers."""

    path: str
    module: str
    kernel_layer: str
    types: dict[str, str]
    exact_in_float32: bool = True
    float_bias: bool = False
    table_bound: float = 0.0


@dataclass
class BrevitasMapping:
    """The kernel's input type, layers and per-layer types, and where Brevitas's own float32 is not exact."""

    input_type: str
    layers: list[FloatLayer]
    types: dict[str, dict[str, Any]]
    rows: list[LayerMap] = field(default_factory=list)

    @property
    def bit_exact(self) -> bool:
        """Whether ``simulate`` equals Brevitas's forward bit for bit on every input."""
        return all(r.exact_in_float32 and not r.float_bias and r.table_bound == 0.0 for r in self.rows)

    @property
    def max_output_deviation(self) -> float:
        """The largest |simulate - Brevitas| the mapping allows (0 when :attr:`bit_exact`; one output
        step where a float bias or float32 rounding can move a tie; the table bound for sigmoid/tanh)."""
        if not self.rows:
            return 0.0
        out = FixedType.parse(self.types[self.layers[-1].name]["result"])
        dev = 0.0
        for r in self.rows:
            if not r.exact_in_float32 or r.float_bias:
                dev = max(dev, out.lsb)
            dev = max(dev, r.table_bound)
        return dev


def _modules() -> dict[str, type]:
    try:
        import brevitas.nn as qnn
    except ImportError as e:  # pragma: no cover - the qat extra
        raise ImportError("MLP.from_brevitas needs Brevitas: pip install 'offload[qat]'") from e
    return {n: getattr(qnn, n) for n in ("QuantIdentity", "QuantLinear", "QuantReLU", "QuantSigmoid", "QuantTanh")}


def _flatten(seq: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    out = []
    for name, child in seq.named_children():
        if isinstance(child, torch.nn.Sequential):
            out += _flatten(child, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", child))
    return out


def _pow2_exponent(scale: torch.Tensor, where: str) -> int | np.ndarray:
    """log2 of a power-of-two scale (an array for per-channel scales); refuses anything else."""
    s = scale.detach().double().cpu().numpy().ravel()
    e = np.log2(s)
    if not np.all(np.isfinite(e)) or not np.all(e == np.round(e)):
        bad = s[~(np.isfinite(e) & (e == np.round(e)))][0]
        raise UnsupportedError(f"{where}: scale {float(bad)!r} is not a power of two; the kernel's fixed-point types need "
                               "power-of-two scales (Brevitas's *FixedPoint quantizers, restrict_scaling_type=POWER_OF_TWO)")
    e = np.round(e).astype(np.int64)
    return int(e[0]) if e.size == 1 or np.all(e == e[0]) else e


def _rounding(proxy: Any, where: str) -> str:
    mode = str(getattr(proxy, "rounding_mode", "ROUND")).upper()
    if mode not in ROUNDING:
        raise UnsupportedError(f"{where}: rounding_mode {mode!r} has no ap_fixed counterpart; supported: {sorted(ROUNDING)}")
    return ROUNDING[mode]


def _zero_point_zero(zp: Any, where: str) -> None:
    if zp is not None and bool(torch.as_tensor(zp).detach().abs().max() != 0):
        raise UnsupportedError(f"{where}: non-zero zero point (asymmetric quantization): the kernel's types are symmetric")


def _act_type(proxy: Any, where: str) -> str:
    """The ap_types type of an activation quantizer (scale 2**-f, b bits, signed or not)."""
    scale = proxy.scale()
    e = _pow2_exponent(scale, where)
    if not isinstance(e, int):
        raise UnsupportedError(f"{where}: per-channel activation scales; the kernel holds one type a layer's output")
    _zero_point_zero(proxy.zero_point(), where)
    b = int(round(float(proxy.bit_width())))
    signed = bool(proxy.is_signed)
    sat = "AP_SAT_SYM" if signed and bool(proxy.is_narrow_range) else "AP_SAT"
    return str(FixedType(b, b + e, signed, _rounding(proxy, where), sat))


def _frac_bits_exact(v: np.ndarray) -> int:
    """Fewest fraction bits holding every float32 value of ``v`` exactly (capped)."""
    need = 0
    for x in np.asarray(v, dtype=np.float64).ravel():
        f = 0
        while x * 2.0**f != math.floor(x * 2.0**f) and f < _MAX_BIAS_FRACTION:
            f += 1
        need = max(need, f)
    return need


def _int_bits(m: float) -> int:
    return 1 if m <= 0 else math.floor(math.log2(m)) + 2


class _Builder:
    def __init__(self) -> None:
        self.input_type: str | None = None
        self.layers: list[FloatLayer] = []
        self.types: dict[str, dict[str, Any]] = {}
        self.rows: list[LayerMap] = []
        self.exact_result: set[str] = set()  # dense layers whose result type is still the exact accumulator

    @property
    def current(self) -> FixedType:
        if not self.layers:
            return FixedType.parse(self.input_type)
        return FixedType.parse(self.types[self.layers[-1].name]["result"])

    def requantize(self, t: str, where: str) -> str:
        """A quantizer on the value flowing: the input type, or the result type of the Linear before it."""
        if self.input_type is None:
            self.input_type = t
            return "input"
        last = self.layers[-1] if self.layers else None
        if last is not None and last.name in self.exact_result:
            self.types[last.name]["result"] = t
            self.exact_result.discard(last.name)
            return last.name
        if str(self.current) == str(FixedType.parse(t)):
            return last.name if last else "input"
        raise UnsupportedError(f"{where}: a quantizer right after another quantized layer (requantizing "
                               f"{self.current} to {t}); the kernel quantizes once a layer")

    def dense(self, path: str, m: Any) -> None:
        if self.input_type is None:
            raise UnsupportedError(f"layer {path!r} (QuantLinear): the network has no input quantizer; start it with a "
                                   "QuantIdentity (or give the first QuantLinear an input_quant) so the kernel's input type is defined")
        if m.input_quant.is_quant_enabled:
            self.requantize(_act_type(m.input_quant, f"layer {path!r} (QuantLinear input_quant)"), path)
        where = f"layer {path!r} (QuantLinear)"
        x_t = self.current
        qw = m.quant_weight()
        _zero_point_zero(qw.zero_point, where)
        e = _pow2_exponent(qw.scale, where + " weight")
        ints = qw.int().detach().cpu().numpy().astype(np.int64)  # [out, in]
        b = int(round(float(qw.bit_width)))
        narrow = bool(m.weight_quant.is_narrow_range)
        if isinstance(e, int):
            w_t = FixedType(b, b + e, bool(qw.signed), "AP_RND_CONV", "AP_SAT_SYM" if narrow else "AP_SAT")
            values = ints.astype(np.float64) * 2.0**e
        else:  # per-output-channel power-of-two scales: one type as fine as the finest, as wide as the widest
            e = e.reshape(-1)
            lo, hi = int(e.min()), int(e.max())
            w_t = FixedType(b + hi - lo, b + hi, bool(qw.signed), "AP_RND_CONV", "AP_SAT")
            values = ints.astype(np.float64) * 2.0 ** e[:, None]
        w = values.T.astype(np.float32)  # [in, out], exact
        params = {"weight": w}
        row = LayerMap(path, type(m).__name__, "", {"weight": str(w_t)})
        f_acc = x_t.F + w_t.F
        if m.bias is not None:
            bias = m.bias.detach().cpu().double().numpy()
            if m.bias_quant.is_quant_enabled:
                if not isinstance(e, int):
                    raise UnsupportedError(f"{where}: a quantized bias with per-channel weight scales")
                # Brevitas's own bias quantizer, given the input's scale (Int*Bias: input scale x weight scale)
                from brevitas.quant_tensor import IntQuantTensor

                x_q = IntQuantTensor(torch.zeros(1, m.in_features), torch.tensor(2.0 ** -x_t.F), torch.tensor(0.0),
                                     torch.tensor(float(x_t.width)), x_t.signed, False)
                qb = m.bias_quant(m.bias, x_q, qw)
                _zero_point_zero(qb.zero_point, where + " bias")
                b_exp = _pow2_exponent(qb.scale, where + " bias")
                bw = int(round(float(qb.bit_width)))
                bias = qb.int().detach().cpu().double().numpy() * 2.0**b_exp
                b_t = FixedType(bw, bw + b_exp, True, "AP_RND_CONV", "AP_SAT")
            else:
                f_b = _frac_bits_exact(bias.astype(np.float32))
                b_t = FixedType(max(1, _int_bits(float(np.abs(bias).max())) + f_b), _int_bits(float(np.abs(bias).max())), True,
                                "AP_RND_CONV", "AP_SAT")
                row.float_bias = True
            params["bias"] = bias.astype(np.float32)
            row.types["bias"] = str(b_t)
            f_acc = max(f_acc, b_t.F)
        xmax = max(abs(x_t.min_float), abs(x_t.max_float))
        worst = float((xmax * np.abs(w.astype(np.float64)).sum(axis=0) + np.abs(params.get("bias", 0.0))).max())
        acc = FixedType(_int_bits(worst) + f_acc, _int_bits(worst), True, "AP_TRN", "AP_WRAP")
        row.exact_in_float32 = worst * 2.0 ** (x_t.F + w_t.F) < 2**_FLOAT32_EXACT_BITS
        name = f"fc{len(self.layers)}"
        self.layers.append(FloatLayer(name, "dense", w.shape[0], w.shape[1], params, None, path))
        t = {"weight": str(w_t), "bias": row.types.get("bias", str(acc)), "accum": str(acc), "result": str(acc)}
        self.types[name] = t
        self.exact_result.add(name)
        row.kernel_layer, row.types["accum"] = name, str(acc)
        self.rows.append(row)
        if m.output_quant.is_quant_enabled:
            self.requantize(_act_type(m.output_quant, f"{where} output_quant"), path)
        row.types["result"] = self.types[name]["result"]

    def activation(self, path: str, m: Any, op: str) -> None:
        where = f"layer {path!r} ({type(m).__name__})"
        if self.input_type is None:
            raise UnsupportedError(f"{where} comes before any quantizer: the kernel's input type is undefined")
        n = self.layers[-1].n_out if self.layers else None
        if n is None:
            raise UnsupportedError(f"{where}: an activation before the first QuantLinear")
        t = _act_type(m.act_quant, where) if m.act_quant.is_quant_enabled else str(self.current)
        name = f"{op}{len(self.layers)}"
        self.layers.append(FloatLayer(name, op, n, n, {}, None, path))
        self.types[name] = {"result": t}
        row = LayerMap(path, type(m).__name__, name, {"result": t})
        if op in ("sigmoid", "tanh"):
            self.types[name].update({"table": _TABLE_TYPE, "table_size": _TABLE_SIZE})
            span = 16.0 if op == "sigmoid" else 8.0
            slope = 0.25 if op == "sigmoid" else 1.0
            row.table_bound = span / _TABLE_SIZE * slope + FixedType.parse(_TABLE_TYPE).lsb + FixedType.parse(t).lsb
            row.types.update({"table": _TABLE_TYPE})
        self.rows.append(row)


def map_brevitas(qmodel: torch.nn.Module) -> BrevitasMapping:
    """The kernel layers and types of a Brevitas ``nn.Sequential`` (see the module doc)."""
    q = _modules()
    if not isinstance(qmodel, torch.nn.Module):
        raise TypeError(f"MLP.from_brevitas needs a torch.nn.Module, got {type(qmodel).__name__}")
    children = _flatten(qmodel) if isinstance(qmodel, torch.nn.Sequential) else [("0", qmodel)]
    bld = _Builder()
    for path, m in children:
        if isinstance(m, (torch.nn.Dropout, torch.nn.Identity)):
            continue
        if isinstance(m, q["QuantLinear"]):
            bld.dense(path, m)
        elif isinstance(m, q["QuantReLU"]):
            bld.activation(path, m, "relu")
        elif isinstance(m, q["QuantSigmoid"]):
            bld.activation(path, m, "sigmoid")
        elif isinstance(m, q["QuantTanh"]):
            bld.activation(path, m, "tanh")
        elif isinstance(m, q["QuantIdentity"]):
            where = f"layer {path!r} (QuantIdentity)"
            if not m.act_quant.is_quant_enabled:
                continue
            kl = bld.requantize(_act_type(m.act_quant, where), where)
            bld.rows.append(LayerMap(path, "QuantIdentity", kl, {"result": bld.input_type if kl == "input" else bld.types[kl]["result"]}))
        else:
            raise UnsupportedError(f"layer {path!r} ({type(m).__name__}) has no kernel counterpart; MLP.from_brevitas maps "
                                   "QuantIdentity, QuantLinear, QuantReLU, QuantSigmoid, QuantTanh, Dropout, Identity")
    if not bld.layers:
        raise UnsupportedError("MLP.from_brevitas: the network has no QuantLinear")
    return BrevitasMapping(bld.input_type, bld.layers, bld.types, bld.rows)

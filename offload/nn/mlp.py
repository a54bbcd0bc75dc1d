"""``offload.nn.MLP``: a small scoring ``torch.nn.Sequential`` as an hls4ml fixed-point kernel.

The float model's layers (Linear with or without bias, ReLU, LeakyReLU, Sigmoid, Tanh,
BatchNorm1d; Dropout and Identity vanish at inference) become an ``mlp`` kernel whose every type
is explicit. ``forward`` runs ``torch.ops.offload.mlp_score`` on the active device; ``simulate``
is the bit-exact NumPy model; ``to_hls4ml`` hands the same network, with the same types, to
hls4ml (Vitis backend, io_parallel) for its C-simulation or synthesis.

Example::

    mlp = offload.nn.MLP.from_float(seq, calib=X_calib, precision="auto")
    scores = mlp(torch.from_numpy(X))               # on $OFFLOAD_DEVICE (sim by default)
    exact = mlp.simulate(X)                         # float64, bit for bit hls4ml's C-simulation
    hls_model = mlp.to_hls4ml("build/risk_hls")     # hls_model.compile(); hls_model.predict(X)
    print(mlp.report)
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
import torch

import offload.ops.mlp  # noqa: F401  (registers torch.ops.offload.mlp_score)
from offload.hls.mlp import hls_config
from offload.kernels import Kernel
from offload.kernels.mlp import MlpSpec, validate
from offload.kernels.mlp import run_rows as _simulate
from offload.ops.resident import make_resident, release_resident
from offload.quant.drift import check_drift
from offload.quant.ptq import (
    FloatLayer,
    QuantReport,
    build_layers,
    choose_precision,
    fixed_precision,
    quant_report,
)
from offload.sim.errors import InputError
from offload.sim.mlp.strategy import DA, LATENCY, STRATEGIES

__all__ = ["MLP", "SUPPORTED_LAYERS", "float_layers"]

SUPPORTED_LAYERS = ("Linear", "ReLU", "LeakyReLU", "Sigmoid", "Tanh", "BatchNorm1d", "Dropout", "Identity")
_OP_PREFIX = {"dense": "fc", "batchnorm": "bn", "relu": "relu", "leaky_relu": "lrelu", "sigmoid": "sigmoid", "tanh": "tanh"}


def _flatten(seq: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    out = []
    for name, child in seq.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, torch.nn.Sequential):
            out += _flatten(child, path + ".")
        else:
            out.append((path, child))
    return out


def _np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float32).numpy()


def float_layers(seq: torch.nn.Module, n_features: int | None = None, *, fold_batchnorm: bool = True) -> list[FloatLayer]:
    """The inference layers of ``seq`` with their float parameters (float32 values, as hls4ml reads them).

    BatchNorm1d becomes ``x * scale + bias`` with ``scale = gamma / sqrt(var + eps)`` and
    ``bias = beta - scale * mean`` computed in float32 NumPy, exactly as hls4ml's converter does.
    With ``fold_batchnorm`` a BatchNorm1d right after a Linear is folded into it (``W * scale``,
    ``b * scale + bias``, in float64 then stored as float32), which saves its multipliers on the
    card; hls4ml would do the same only for layers whose output type it infers itself.
    """
    if not isinstance(seq, torch.nn.Module):
        raise TypeError(f"MLP.from_float needs a torch.nn.Sequential, got {type(seq).__name__}")
    children = _flatten(seq) if isinstance(seq, torch.nn.Sequential) else [("0", seq)]
    layers: list[FloatLayer] = []
    width = n_features
    for idx, (path, m) in enumerate(children):
        name = None
        if isinstance(m, (torch.nn.Dropout, torch.nn.Identity)):
            continue
        if isinstance(m, torch.nn.Linear):
            if width is not None and m.in_features != width:
                raise ValueError(f"layer {path!r} (Linear): in_features={m.in_features} but its input has {width} features")
            params = {"weight": _np32(m.weight).T.copy()}
            if m.bias is not None:
                params["bias"] = _np32(m.bias)
            op, n_in, n_out = "dense", m.in_features, m.out_features
        elif isinstance(m, torch.nn.BatchNorm1d):
            if m.running_mean is None or m.running_var is None:
                raise InputError(f"layer {path!r} (BatchNorm1d): needs running statistics (track_running_stats=True)")
            if width is not None and m.num_features != width:
                raise ValueError(f"layer {path!r} (BatchNorm1d): num_features={m.num_features} but its input has {width} features")
            gamma = _np32(m.weight) if m.affine else 1
            beta = _np32(m.bias) if m.affine else 0
            scale = gamma / np.sqrt(_np32(m.running_var) + m.eps)
            bias = beta - scale * _np32(m.running_mean)
            params = {"scale": np.asarray(scale, dtype=np.float32), "bias": np.asarray(bias, dtype=np.float32)}
            op, n_in, n_out = "batchnorm", m.num_features, m.num_features
        elif isinstance(m, (torch.nn.ReLU, torch.nn.LeakyReLU, torch.nn.Sigmoid, torch.nn.Tanh)):
            if width is None:
                raise ValueError(f"layer {path!r} ({type(m).__name__}) comes first: pass n_features")
            op = {torch.nn.ReLU: "relu", torch.nn.LeakyReLU: "leaky_relu", torch.nn.Sigmoid: "sigmoid", torch.nn.Tanh: "tanh"}[type(m)]
            params, n_in, n_out = {}, width, width
        else:
            raise TypeError(
                f"layer {path!r} ({type(m).__name__}) is not supported by offload.nn.MLP; "
                f"supported: {', '.join(SUPPORTED_LAYERS)}"
            )
        for k, v in params.items():
            if not np.isfinite(v).all():
                raise InputError(f"layer {path!r}: parameter {k} has NaN or infinite values")
        alpha = float(m.negative_slope) if op == "leaky_relu" else None
        name = f"{_OP_PREFIX[op]}{idx}"
        if fold_batchnorm and op == "batchnorm" and layers and layers[-1].op == "dense":
            prev = layers[-1]
            sc, bb = params["scale"].astype(np.float64), params["bias"].astype(np.float64)
            prev.params["weight"] = (prev.params["weight"].astype(np.float64) * sc).astype(np.float32)
            pb = prev.params.get("bias", np.zeros(prev.n_out, np.float32)).astype(np.float64)
            prev.params["bias"] = (pb * sc + bb).astype(np.float32)
            prev.source += f"+{path}"
            continue
        layers.append(FloatLayer(name, op, n_in, n_out, params, alpha, path))
        width = n_out
    if not layers:
        raise ValueError("the model has no inference layers (only Dropout/Identity?)")
    if not any(layer.op in ("dense", "batchnorm") for layer in layers) and n_features is None:
        raise ValueError("cannot infer the number of input features: pass n_features")
    return layers


class MLP(torch.nn.Module):
    """A fixed-point scoring MLP running on an offload device; build with :meth:`from_float`."""

    def __init__(self, spec: MlpSpec, layers: list[FloatLayer], report: QuantReport | None = None, name: str = "mlp",
                 device: Any = None) -> None:
        super().__init__()
        self.spec = spec
        self.kernel_name = name
        self._float_layers = layers
        self.report = report
        # Read-only arrays that own their memory: simulate()'s compiled program then takes them as
        # constant instead of comparing them with a snapshot on every call.
        self._tensors = {k: np.array(v, copy=True) for k, v in spec.tensors().items()}
        for v in self._tensors.values():
            v.setflags(write=False)
        self.rtl = None  # the last to_rtl() result
        # Resident once, on the active device (or ``device``); the op only carries the id.
        self._res = make_resident(self.offload_kernels()[0], device)
        self.rid: int = self._res.id
        weakref.finalize(self, release_resident, self.rid)

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_float(
        cls,
        seq: torch.nn.Module,
        calib: Any = None,
        precision: str | Mapping[str, Any] = "auto",
        reuse_factor: int = 1,
        *,
        labels: Any = None,
        reference: Any = None,
        n_features: int | None = None,
        table_size: int = 1024,
        cos_threshold: float = 0.999,
        budget: float | None = None,
        drift_threshold: float = 0.2,
        fold_batchnorm: bool = True,
        name: str = "mlp",
        device: Any = None,
        strategy: str = LATENCY,
    ) -> "MLP":
        """Quantize ``seq`` (a ``torch.nn.Sequential`` in eval semantics) into an MLP kernel.

        ``precision``: ``"auto"`` (calibrated search on ``calib``, see :mod:`offload.quant.ptq`),
        one ap_types type string for every type, or a dict ``{layer name: {role: type}}`` (roles
        ``weight``, ``bias``, ``accum``, ``result``, ``scale``, ``param``, ``table``; a plain string
        sets all of a layer's roles; key ``"input"`` sets the input type). Layer names are
        ``fc<i>``, ``bn<i>``, ``relu<i>``, ``lrelu<i>``, ``sigmoid<i>``, ``tanh<i>`` with ``i`` the
        index in ``seq`` (see ``MLP.layer_names(seq)``).
        ``labels`` (with "auto") switch the end-to-end budget to AUC drop; ``reference`` is a
        feature sample the calibration set is checked against (``CalibrationDriftWarning``).
        ``fold_batchnorm``: fold a BatchNorm1d that follows a Linear into its weights (default).
        ``device``: where the kernel lives (a spec string or Device; default the active device).
        ``strategy``: hls4ml's Dense strategy, ``"latency"`` (multipliers, default) or
        ``"distributed_arithmetic"`` (da4ml adder graphs, no DSPs; ``reuse_factor`` must be 1).
        Under DA accumulation is exact (hls4ml ignores ``accum_t``): the simulator and
        ``precision="auto"`` use the exact accumulator, and an explicit ``accum`` role in
        ``precision`` raises ``InputError`` rather than being silently ignored (a plain type
        string for a whole layer or model does not count: it sets the roles DA uses).
        """
        if not isinstance(reuse_factor, int) or reuse_factor < 1:
            raise ValueError(f"reuse_factor must be an int >= 1, got {reuse_factor!r}")
        if strategy not in STRATEGIES:
            raise InputError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
        if strategy == DA:
            _check_da_request(precision, reuse_factor)
        calib_np = None if calib is None else _as_features(calib, "calib")
        nf = n_features if n_features is not None else (calib_np.shape[1] if calib_np is not None else None)
        layers = float_layers(seq, nf, fold_batchnorm=fold_batchnorm)
        nf = layers[0].n_in
        if calib_np is not None and calib_np.shape[1] != nf:
            raise ValueError(f"calib has {calib_np.shape[1]} features, the model takes {nf}")
        ref = None if reference is None else _as_features(reference, "reference")
        lab = None if labels is None else np.asarray(labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else labels, dtype=np.float64).ravel()
        if isinstance(precision, str) and precision == "auto":
            if calib_np is None:
                raise ValueError('precision="auto" needs a calibration set: from_float(seq, calib=X)')
            input_type, types, report = choose_precision(
                layers, calib_np, labels=lab, reference=ref, cos_threshold=cos_threshold, budget=budget,
                table_size=table_size, drift_threshold=drift_threshold, strategy=strategy,
            )
        else:
            input_type, types = fixed_precision(layers, precision, table_size=table_size)
            report = None
            if calib_np is not None:
                if ref is not None:
                    check_drift(calib_np, ref, threshold=drift_threshold)
                report = quant_report(layers, input_type, types, calib_np, labels=lab, strategy=strategy)
        try:
            sim_layers, consts = build_layers(layers, types, input_type=input_type, strategy=strategy)
            spec = MlpSpec(nf, input_type, tuple(sim_layers), consts, reuse_factor, strategy=strategy)
        except ValueError as e:  # kernels.mlp's contract checks (too many features, a type too wide)
            raise InputError(str(e)) from e
        return cls(spec, layers, report, name, device)

    @classmethod
    def from_brevitas(cls, qmodel: torch.nn.Module, calib: Any = None, reuse_factor: int = 1, *, name: str = "mlp",
                      device: Any = None) -> "MLP":
        """The kernel computing a Brevitas network's quantized forward (QuantIdentity, QuantLinear,
        QuantReLU, QuantSigmoid/Tanh; power-of-two scales), types read from its quantizers: see
        :mod:`offload.nn.brevitas` for the mapping and where it is, and is not, bit for bit. ``calib``
        (optional features) fills ``report``; ``mlp.brevitas`` is the mapping.

        Example::

            mlp = MLP.from_brevitas(qmodel); mlp.brevitas.bit_exact
        """
        from offload.nn.brevitas import map_brevitas

        mapping = map_brevitas(qmodel)
        try:
            sim_layers, consts = build_layers(mapping.layers, mapping.types, input_type=mapping.input_type)
            spec = MlpSpec(mapping.layers[0].n_in, mapping.input_type, tuple(sim_layers), consts, reuse_factor)
        except ValueError as e:  # kernels.mlp's contract checks (a type too wide for the datapath)
            raise InputError(str(e)) from e
        report = None if calib is None else quant_report(mapping.layers, mapping.input_type, mapping.types, _as_features(calib, "calib"))
        mlp = cls(spec, mapping.layers, report, name, device)
        mlp.brevitas = mapping
        return mlp

    @staticmethod
    def layer_names(seq: torch.nn.Module, n_features: int | None = None, *, fold_batchnorm: bool = True) -> list[str]:
        """Names ``from_float`` gives the inference layers of ``seq`` (keys of a precision dict)."""
        return [layer.name for layer in float_layers(seq, n_features, fold_batchnorm=fold_batchnorm)]

    # -- running ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores [B, n_out] in ``x``'s dtype, computed by the kernel on the active device."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MLP.forward takes a torch.Tensor, got {type(x).__name__}")
        return torch.ops.offload.mlp_score(self.rid, x)

    def simulate(self, x: Any) -> np.ndarray:
        """Exact fixed-point outputs (float64 [B, n_out]) of float features ``x`` [B, F]."""
        xa = np.asarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x)
        validate(self.spec, self._tensors, {"x": xa})
        return _simulate(self.spec.input_type, self.spec.layers, self._tensors, xa.astype(np.float64))

    def offload_kernels(self) -> list[Kernel]:
        """The kernel(s) a bundle saves: one ``mlp`` kernel (spec JSON + raw weights)."""
        return [Kernel(self.kernel_name, self.spec, {k: v.copy() for k, v in self._tensors.items()})]

    @property
    def strategy(self) -> str:
        """hls4ml's Dense strategy of the kernel: ``"latency"`` or ``"distributed_arithmetic"``."""
        return self.spec.strategy

    @property
    def device(self):
        """The offload device the kernel is resident on."""
        return self._res.device

    # -- hls4ml ----------------------------------------------------------------------------------
    def _dense_params(self, fl: FloatLayer) -> dict[str, np.ndarray]:
        """The float32 Linear parameters hls4ml is given for dense layer ``fl``.

        Latency: the float model's (hls4ml quantizes them into weight_t/bias_t itself, as the spec
        did). DA: da4ml uses the weight data exactly and never reads weight_t, so it gets the spec's
        quantized values, exact in float32 (the spec keeps them within 24 bits).
        """
        if self.spec.strategy != DA:
            return fl.params
        layer = next(sl for sl in self.spec.layers if sl.name == fl.name)
        out = {"weight": layer.weight.to_float(self._tensors[f"{fl.name}.weight"]).astype(np.float32)}
        if layer.use_bias:
            out["bias"] = layer.bias.to_float(self._tensors[f"{fl.name}.bias"]).astype(np.float32)
        return out

    def canonical_torch(self) -> torch.nn.Sequential:
        """The float model as hls4ml sees it: inference layers only, named as in the spec."""
        mods: "OrderedDict[str, torch.nn.Module]" = OrderedDict()
        for fl in self._float_layers:
            if fl.op == "dense":
                p = self._dense_params(fl)
                lin = torch.nn.Linear(fl.n_in, fl.n_out, bias="bias" in p)
                with torch.no_grad():
                    lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(p["weight"].T)))
                    if "bias" in p:
                        lin.bias.copy_(torch.from_numpy(p["bias"]))
                mods[fl.name] = lin
            elif fl.op == "batchnorm":
                # hls4ml recomputes scale = gamma / sqrt(var + eps) and bias = beta - scale * mean:
                # gamma = scale, beta = bias, mean = 0, var = 1, eps = 0 give back our float32 values exactly.
                bn = torch.nn.BatchNorm1d(fl.n_in, eps=0.0)
                with torch.no_grad():
                    bn.weight.copy_(torch.from_numpy(fl.params["scale"]))
                    bn.bias.copy_(torch.from_numpy(fl.params["bias"]))
                    bn.running_mean.zero_()
                    bn.running_var.fill_(1.0)
                mods[fl.name] = bn
            elif fl.op == "relu":
                mods[fl.name] = torch.nn.ReLU()
            elif fl.op == "leaky_relu":
                mods[fl.name] = torch.nn.LeakyReLU(fl.alpha)
            elif fl.op == "sigmoid":
                mods[fl.name] = torch.nn.Sigmoid()
            else:
                mods[fl.name] = torch.nn.Tanh()
        return torch.nn.Sequential(mods).eval()

    def to_hls4ml(self, output_dir: str, *, project_name: str = "myproject", trace: bool = False):
        """hls4ml ``ModelGraph`` (Vitis backend, io_parallel) with exactly these types; not compiled.

        Built with ``hls4ml.converters.convert_from_pytorch_model`` from the float weights, so
        hls4ml quantizes them itself; ``compile()`` then ``predict(x)`` equals :meth:`simulate`.
        Under ``strategy="distributed_arithmetic"`` the Dense layers (only they: hls4ml's DA pass
        refuses the others) get ``Strategy: distributed_arithmetic`` and da4ml writes them as adder
        graphs when the model is written or compiled (slow: tens of seconds per layer).
        """
        import hls4ml


        seq = self.canonical_torch()
        shape = (self.spec.n_features,)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = hls4ml.utils.config_from_pytorch_model(seq, input_shape=shape, granularity="name", backend="Vitis",
                                                         default_precision=str(self.spec.input_type))
            ours = hls_config(self.spec, trace=trace)
            missing = set(ours["LayerName"]) - set(cfg["LayerName"])
            if missing:
                raise RuntimeError(f"hls4ml named the layers {sorted(cfg['LayerName'])}, expected {sorted(ours['LayerName'])}")
            for lname, lcfg in ours["LayerName"].items():
                cfg["LayerName"][lname].update(lcfg)
            cfg["Model"].update(ours["Model"])
            return hls4ml.converters.convert_from_pytorch_model(
                seq, input_shape=shape, hls_config=cfg, backend="Vitis", io_type="io_parallel",
                output_dir=str(output_dir), project_name=project_name,
            )

    # -- RTL (da4ml Verilog, Verilator, Yosys) ----------------------------------------------------
    def to_rtl(self, output_dir: str, clock_mhz: float = 300.0, *, latency_cutoff: float | None = None):
        """The whole network as pipelined Verilog (da4ml) in ``output_dir``, for ``clock_mhz``.

        Returns an :class:`offload.hls.rtl.RtlModel`: ``compile()`` (Verilator, cached),
        ``predict(x)`` (cycle-accurate, equal to :meth:`simulate`), ``latency_cycles`` (measured),
        ``resources()`` (Yosys ``synth_xilinx -family xcup``). Its figures then appear in
        ``mlp.report``. ``latency_cutoff`` overrides the adder levels per pipeline stage.
        """
        from offload.hls.rtl import RtlModel

        # The RTL accumulates exactly (distributed arithmetic); with the latency strategy the
        # generator checks that every accum_t is wide enough for that to be the same datapath
        # (or realises a wrapping one step by step).
        rtl = RtlModel.generate(self.spec, self._tensors, output_dir, clock_mhz=clock_mhz,
                                exact_accumulation=self.spec.strategy == DA,
                                latency_cutoff=latency_cutoff)
        if self.report is not None:
            rtl.on_update = self.report.set_rtl
        self.rtl = rtl
        return rtl

    def extra_repr(self) -> str:
        kinds = ", ".join(f"{layer.name}:{layer.op}" for layer in self.spec.layers)
        return f"n_features={self.spec.n_features}, n_out={self.spec.n_outputs}, layers=[{kinds}]"


def _check_da_request(precision: Any, reuse_factor: int) -> None:
    """Refuse what distributed arithmetic cannot honour, naming the field."""
    if reuse_factor != 1:
        raise InputError(f"reuse_factor must be 1 with strategy={DA!r} (hls4ml refuses rf > 1), got {reuse_factor}")
    if isinstance(precision, Mapping):
        for lname, roles in precision.items():
            if isinstance(roles, Mapping) and "accum" in roles:
                raise InputError(
                    f"precision[{lname!r}]['accum']: with strategy={DA!r} hls4ml/da4ml accumulate exactly and ignore "
                    "accum_t; remove it (the kernel uses the exact accumulator)"
                )


def _as_features(x: Any, what: str) -> np.ndarray:
    a = np.asarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] == 0:
        raise InputError(f"{what} must be a non-empty [rows, features] array, got shape {list(a.shape)}")
    bad = ~np.isfinite(a)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InputError(f"{what} row {int(r)} column {int(c)} is not finite")
    return a

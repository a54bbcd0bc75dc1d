"""``RtlModel``: an ``mlp`` kernel as pipelined Verilog, simulated by Verilator, synthesised by Yosys.

Example::

    rtl = RtlModel.generate(spec, tensors, "build/risk_rtl", clock_mhz=300)
    rtl.compile()                      # Verilator build (cached by content hash)
    y = rtl.predict(x)                 # == offload.sim.mlp.simulate(...) bit for bit
    rtl.latency_cycles, rtl.latency_ns, rtl.resources()
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from offload.hls.rtl import emit, sim, tools, yosys
from offload.sim.errors import InputError
from offload.sim.fixed import FixedType

__all__ = ["RtlModel", "RtlSummary", "MEASURED"]

MEASURED = "measured.json"  # latency and resources as measured, next to the design (offload advise --rtl reads it)


@dataclass(frozen=True)
class RtlSummary:
    """What a report shows of an RTL build: measured cycles, clock, Yosys and da4ml counts."""

    latency_cycles: int | None
    clock_mhz: float
    stages: int
    da4ml_cost_lut: float
    resources: Mapping[str, float] | None

    @property
    def latency_ns(self) -> float | None:
        return None if self.latency_cycles is None else self.latency_cycles * 1000.0 / self.clock_mhz

    def to_json(self) -> dict[str, Any]:
        return {"latency_cycles": self.latency_cycles, "latency_ns": self.latency_ns, "clock_mhz": self.clock_mhz,
                "stages": self.stages, "da4ml_cost_lut": self.da4ml_cost_lut,
                "resources": None if self.resources is None else dict(self.resources)}

    @classmethod
    def load(cls, directory: str | Path) -> "RtlSummary":
        """The summary a to_rtl() directory recorded (``offload_rtl.json`` plus what was measured)."""
        d = Path(directory)
        try:
            meta = json.loads((d / "offload_rtl.json").read_text())
            measured = json.loads((d / MEASURED).read_text()) if (d / MEASURED).is_file() else {}
        except (OSError, ValueError) as e:
            raise InputError(f"{d}: not a to_rtl() directory ({e})") from None
        return cls(measured.get("latency_cycles"), float(meta["clock_mhz"]), int(meta["stages"]), float(meta["da4ml_cost_lut"]),
                   measured.get("resources"))

    def lines(self) -> list[str]:
        lat = "not simulated yet" if self.latency_cycles is None else f"{self.latency_cycles} cycles = {self.latency_ns:.1f} ns"
        out = [f"RTL (da4ml, Verilator): {lat} at {self.clock_mhz:g} MHz, {self.stages} stages; da4ml estimate {self.da4ml_cost_lut:.0f} LUT"]
        if self.resources is not None:
            r = self.resources
            out.append(f"Yosys synth_xilinx xcup (not Vivado's mapping): LUT {r['LUT']}, FF {r['FF']}, CARRY {r['CARRY']}, DSP {r['DSP']}, BRAM {r['BRAM']}")
        return out


class RtlModel:
    """A network written as Verilog in ``directory``; see the module docstring."""

    def __init__(self, directory: str | Path, meta: Mapping[str, Any], input_type: str, output_type: str, n_features: int) -> None:
        self.directory = Path(directory)
        self.meta = dict(meta)
        self.input_type = FixedType.parse(input_type)
        self.output_type = FixedType.parse(output_type)
        self.n_features = n_features
        self._exe: Path | None = None
        self._latency: int | None = None
        self._resources: dict[str, float] | None = None
        # Called with summary() whenever a measurement lands (MLP.to_rtl points it at mlp.report).
        self.on_update: Callable[[RtlSummary], None] | None = None

    @classmethod
    def generate(cls, spec, tensors: Mapping[str, np.ndarray], directory: str | Path, *, clock_mhz: float = 300.0,
                 exact_accumulation: bool = False, latency_cutoff: float | None = None) -> "RtlModel":
        """Trace ``spec`` with da4ml and write the Verilog (no tool runs yet besides da4ml)."""
        tools.da4ml_version()
        design = emit.trace_spec(spec, tensors, clock_mhz=clock_mhz, exact_accumulation=exact_accumulation,
                                 cutoff=latency_cutoff)
        meta = emit.write_design(design, directory)
        return cls(directory, meta, spec.input_type, spec.output_type, spec.n_features)

    # -- Verilator ---------------------------------------------------------------------------------
    def compile(self) -> "RtlModel":
        """Build the cycle-accurate simulator (cached by a hash of the sources and flags)."""
        self._exe = sim.build(self.directory, self.meta)
        return self

    def predict_raw(self, raw_in: np.ndarray) -> np.ndarray:
        """Raw input codes [B, F] -> raw ``result_t`` codes [B, n_out] from the RTL."""
        if self._exe is None:
            self.compile()
        lanes, lat = sim.run(self._exe, self.directory, self.meta, raw_in)
        self._latency = lat
        self._notify()
        # Lanes are LSB-aligned at 2**-out_frac; result_t's grid is 2**-F (da4ml may trim zero LSBs).
        shift = self.output_type.F - int(self.meta["out_frac"])
        return lanes << shift if shift >= 0 else lanes >> -shift

    def predict(self, x: Any) -> np.ndarray:
        """Float64 outputs [B, n_out] of float features ``x`` [B, F]: same values as the simulator."""
        xa = np.asarray(x, dtype=np.float64)
        if xa.ndim != 2 or xa.shape[1] != self.n_features:
            raise InputError(f"x must have shape [batch, {self.n_features}], got {list(xa.shape)}")
        if xa.shape[0] == 0:
            raise InputError("x must hold at least one row")
        if not np.isfinite(xa).all():
            r, c = np.argwhere(~np.isfinite(xa))[0]
            raise InputError(f"x row {int(r)} column {int(c)} is not finite")
        raw = self.input_type.quantize(xa)
        return self.output_type.to_float(self.predict_raw(raw))

    @property
    def latency_cycles(self) -> int:
        """Cycles from input valid to output valid, as the testbench measured them (runs one row if needed)."""
        if self._latency is None:
            self.predict_raw(np.zeros((1, self.n_features), dtype=np.int64))
        return int(self._latency)

    @property
    def latency_ns(self) -> float:
        return self.latency_cycles * 1000.0 / float(self.meta["clock_mhz"])

    @property
    def stages(self) -> int:
        return int(self.meta["stages"])

    @property
    def pipeline_depth(self) -> int:
        """Register levels da4ml's pipeline has (stages + the output register)."""
        return int(self.meta["pipeline_depth"])

    # -- Yosys -------------------------------------------------------------------------------------
    def resources(self) -> dict[str, float]:
        """{"LUT", "FF", "CARRY", "DSP", "BRAM"} from Yosys ``synth_xilinx -family xcup`` (cached)."""
        if self._resources is None:
            self._resources = yosys.synthesize(self.directory)
            self._notify()
        return dict(self._resources)

    def _notify(self) -> None:
        (self.directory / MEASURED).write_text(json.dumps({"latency_cycles": self._latency, "resources": self._resources}))
        if self.on_update is not None:
            self.on_update(self.summary())

    def summary(self) -> RtlSummary:
        return RtlSummary(self._latency, float(self.meta["clock_mhz"]), self.stages, float(self.meta["da4ml_cost_lut"]),
                          None if self._resources is None else dict(self._resources))

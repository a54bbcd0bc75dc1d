"""``RtlModel``: an ``mlp`` kernel as pipelined Verilog, simulated by Verilator, synthesised by Yosys.

Example::

    rtl = RtlModel.generate(spec, tensors, "build/risk_rtl", clock_mhz=300)
    rtl.compile()                      # Verilator build (cached by content hash)
    y = rtl.predict(x)                 # == offload.sim.mlp.simulate(...) bit for bit
    rtl.latency_cycles, rtl.latency_ns, rtl.resources()
    rtl.stream_cycles                  # StreamCycles: request word -> response word, and the II
    rtl.stream_predict(x, ready_pct=50)   # through the AXI4-Stream top, with backpressure
    rtl.resources(top="offload_stream")   # Yosys counts with the stream ports, tag line and FIFO
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from offload.hls.rtl import emit, sim, stream_sim, tools, yosys
from offload.hls.rtl.stream import STREAM_TOP
from offload.hls.rtl.stream_sim import StreamCycles, StreamTrace
from offload.sim.errors import CSimError, InputError
from offload.sim.fixed import FixedType
from offload.sim.mlp import forward

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
    # The AXI4-Stream top's measured cycles (request word taken -> response word taken; II), once run.
    stream: StreamCycles | None = None

    @property
    def latency_ns(self) -> float | None:
        return None if self.latency_cycles is None else self.latency_cycles * 1000.0 / self.clock_mhz

    def to_json(self) -> dict[str, Any]:
        return {"latency_cycles": self.latency_cycles, "latency_ns": self.latency_ns, "clock_mhz": self.clock_mhz,
                "stages": self.stages, "da4ml_cost_lut": self.da4ml_cost_lut,
                "resources": None if self.resources is None else dict(self.resources),
                "stream": None if self.stream is None else self.stream.to_json()}

    @classmethod
    def load(cls, directory: str | Path) -> "RtlSummary":
        """The summary a to_rtl() directory recorded (``offload_rtl.json`` plus what was measured)."""
        d = Path(directory)
        try:
            meta = json.loads((d / "offload_rtl.json").read_text())
            measured = json.loads((d / MEASURED).read_text()) if (d / MEASURED).is_file() else {}
        except (OSError, ValueError) as e:
            raise InputError(f"{d}: not a to_rtl() directory ({e})") from None
        st = measured.get("stream")
        return cls(measured.get("latency_cycles"), float(meta["clock_mhz"]), int(meta["stages"]), float(meta["da4ml_cost_lut"]),
                   measured.get("resources"), None if st is None else StreamCycles.from_json(st))

    def lines(self) -> list[str]:
        lat = "not simulated yet" if self.latency_cycles is None else f"{self.latency_cycles} cycles = {self.latency_ns:.1f} ns"
        out = [f"RTL (da4ml, Verilator): {lat} at {self.clock_mhz:g} MHz, {self.stages} stages; da4ml estimate {self.da4ml_cost_lut:.0f} LUT"]
        if self.resources is not None:
            r = self.resources
            out.append(f"Yosys synth_xilinx xcup (not Vivado's mapping): LUT {r['LUT']}, FF {r['FF']}, CARRY {r['CARRY']}, DSP {r['DSP']}, BRAM {r['BRAM']}")
        if self.stream is not None:
            s = self.stream
            out.append(f"AXI4-Stream top: {s.latency_cycles} cycles = {s.latency_ns:.1f} ns request word to response word, "
                       f"initiation interval {s.ii_cycles} (FIFO {s.fifo_depth}, {s.tag_bits}-bit tag)")
        return out


class RtlModel:
    """A network written as Verilog in ``directory``; see the module docstring."""

    def __init__(self, directory: str | Path, meta: Mapping[str, Any], input_type: str, output_type: str, n_features: int,
                 reference: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.directory = Path(directory)
        self.meta = dict(meta)
        self.input_type = FixedType.parse(input_type)
        self.output_type = FixedType.parse(output_type)
        self.n_features = n_features
        # Raw input codes -> raw result_t codes by the simulator: what the stream runs are checked against.
        self.reference = reference
        self._exe: Path | None = None
        self._stream_exe: Path | None = None
        self._latency: int | None = None
        self._resources: dict[str, float] | None = None
        self._stream: StreamCycles | None = None
        # Called with summary() whenever a measurement lands (MLP.to_rtl points it at mlp.report).
        self.on_update: Callable[[RtlSummary], None] | None = None

    @classmethod
    def generate(cls, spec, tensors: Mapping[str, np.ndarray], directory: str | Path, *, clock_mhz: float = 300.0,
                 exact_accumulation: bool = False, latency_cutoff: float | None = None, tag_bits: int = 16) -> "RtlModel":
        """Trace ``spec`` with da4ml and write the Verilog (no tool runs yet besides da4ml);
        ``tag_bits``: width of the stream top's request tag."""
        tools.da4ml_version()
        design = emit.trace_spec(spec, tensors, clock_mhz=clock_mhz, exact_accumulation=exact_accumulation,
                                 cutoff=latency_cutoff)
        meta = emit.write_design(design, directory, tag_bits=tag_bits)
        t_in = spec.input_type
        layers, weights = tuple(spec.layers), dict(tensors)

        def reference(raw: np.ndarray) -> np.ndarray:
            return forward(spec.input_type, layers, weights, t_in.to_float(np.asarray(raw, dtype=np.int64)))

        return cls(directory, meta, spec.input_type, spec.output_type, spec.n_features, reference)

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
        return self._from_lanes(lanes)

    def _from_lanes(self, lanes: np.ndarray) -> np.ndarray:
        # Lanes are LSB-aligned at 2**-out_frac; result_t's grid is 2**-F (da4ml may trim zero LSBs).
        shift = self.output_type.F - int(self.meta["out_frac"])
        return lanes << shift if shift >= 0 else lanes >> -shift

    def _raw_rows(self, x: Any) -> np.ndarray:
        xa = np.asarray(x, dtype=np.float64)
        if xa.ndim != 2 or xa.shape[1] != self.n_features:
            raise InputError(f"x must have shape [batch, {self.n_features}], got {list(xa.shape)}")
        if xa.shape[0] == 0:
            raise InputError("x must hold at least one row")
        if not np.isfinite(xa).all():
            r, c = np.argwhere(~np.isfinite(xa))[0]
            raise InputError(f"x row {int(r)} column {int(c)} is not finite")
        return self.input_type.quantize(xa)

    def predict(self, x: Any) -> np.ndarray:
        """Float64 outputs [B, n_out] of float features ``x`` [B, F]: same values as the simulator."""
        return self.output_type.to_float(self.predict_raw(self._raw_rows(x)))

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

    # -- the AXI4-Stream top ------------------------------------------------------------------------
    def stream_run(self, raw_in: np.ndarray, tags: np.ndarray, **modes: Any) -> StreamTrace:
        """Raw rows [B, n_in] and tags [B] through ``offload_stream``: what the testbench saw, unchecked.
        ``modes``: ``one_at_a_time``, ``valid_pct``, ``ready_pct``, ``tb_seed`` (see :mod:`~offload.hls.rtl.stream_sim`)."""
        if self._stream_exe is None:
            self._stream_exe = stream_sim.build(self.directory, self.meta)
        return stream_sim.run(self._stream_exe, self.directory, self.meta, raw_in, tags, **modes)

    def _stream_checked(self, raw: np.ndarray, tags: np.ndarray, **modes: Any) -> tuple[np.ndarray, np.ndarray]:
        """Lanes in request order and per-request latencies; CSimError for a lost, extra, swapped or wrong word."""
        trace = self.stream_run(raw, tags, **modes)
        want = None
        if self.reference is not None:
            shift = self.output_type.F - int(self.meta["out_frac"])
            ref = np.asarray(self.reference(raw), dtype=np.int64)
            want = ref >> shift if shift >= 0 else ref << -shift
        lat = stream_sim.check(trace, tags, want)
        return trace, lat

    def stream_predict(self, x: Any, **modes: Any) -> np.ndarray:
        """Float64 outputs [B, n_out] through the stream top, each response checked for its request's
        tag, order and count (and value, against the simulator); ``modes`` as :meth:`stream_run`."""
        raw = self._raw_rows(x)
        tags = np.arange(raw.shape[0], dtype=np.int64) % (1 << int(self.meta["tag_bits"]))
        trace, _ = self._stream_checked(raw, tags, **modes)
        return self.output_type.to_float(self._from_lanes(trace.resp_raw))

    @property
    def stream_cycles(self) -> StreamCycles:
        """The stream top's latency (request word taken -> response word taken, one request at a time)
        and initiation interval (cycles between requests taken back to back, the response side always
        ready), measured under Verilator on random input codes (runs them if needed)."""
        if self._stream is None:
            self._stream = self._measure_stream()
            self._notify()
        return self._stream

    def _measure_stream(self, rows: int = 256) -> StreamCycles:
        rng = np.random.default_rng(0)
        t, tag_bits = self.input_type, int(self.meta["tag_bits"])
        raw = rng.integers(t.min_raw, t.max_raw, size=(rows, self.n_features), endpoint=True)
        tags = rng.integers(0, 1 << tag_bits, size=rows)
        _, single = self._stream_checked(raw[:16], tags[:16], one_at_a_time=True)
        if single.min() != single.max():
            raise CSimError(f"stream latency differs between single requests: {single.min()}..{single.max()} cycles")
        trace, full = self._stream_checked(raw, tags)
        if (full != single[0]).any():
            raise CSimError(f"back-to-back requests took {full.min()}..{full.max()} cycles, one at a time {single[0]}: "
                            "the response side was always ready, nothing should wait")
        return StreamCycles(int(single[0]), int(trace.intervals.max()), float(self.meta["clock_mhz"]), tag_bits,
                            int(self.meta["fifo_depth"]))

    # -- Yosys -------------------------------------------------------------------------------------
    def resources(self, top: str | None = None) -> dict[str, float]:
        """{"LUT", "FF", "CARRY", "DSP", "BRAM"} from Yosys ``synth_xilinx -family xcup`` (cached):
        the network alone, or with ``top="offload_stream"`` its stream top (ports, tag line, FIFO)."""
        if top is not None:
            if top != STREAM_TOP:
                raise InputError(f"top must be None or {STREAM_TOP!r}, got {top!r}")
            return yosys.synthesize(self.directory, top=top)
        if self._resources is None:
            self._resources = yosys.synthesize(self.directory)
            self._notify()
        return dict(self._resources)

    def _notify(self) -> None:
        (self.directory / MEASURED).write_text(json.dumps({"latency_cycles": self._latency, "resources": self._resources,
                                                            "stream": None if self._stream is None else self._stream.to_json()}))
        if self.on_update is not None:
            self.on_update(self.summary())

    def summary(self) -> RtlSummary:
        return RtlSummary(self._latency, float(self.meta["clock_mhz"]), self.stages, float(self.meta["da4ml_cost_lut"]),
                          None if self._resources is None else dict(self._resources), self._stream)

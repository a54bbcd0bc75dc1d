"""Running the regression: every stage of one entry (:func:`check_entry`) and the selected
entries in parallel threads (:func:`run_regression`); the work is g++ / vitis_hls subprocesses.

Example::

    from offload.host import open_device
    from offload.hls.regress.run import run_regression
    rep = run_regression("emb/sum/*", device=open_device("emu"), jobs=2)
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from offload.hls.cards import CARDS
from offload.hls.regress.baselines import Tolerances, compare_baseline, read_baselines, write_baselines
from offload.hls.regress.golden import patterns_of, select, stale_check
from offload.hls.regress.report import Check, EntryResult, RegressReport, compare_outputs
from offload.hls.regress.synth import entry_dir, synth_entry
from offload.hls.vitis import vitis_hls
from offload.kernels.catalogue import Entry, Golden, GoldenError, load_golden
from offload.kernels.registry import get_kind
from offload.sim.errors import UnsupportedError

__all__ = ["DEFAULT_PART", "DEFAULT_CLOCK_NS", "check_entry", "run_regression"]

DEFAULT_PART = CARDS["u55c"].part
DEFAULT_CLOCK_NS = 3.333  # 300 MHz kernel clock, the Alveo default (CARDS[...].kernel_clock_hz)


def _check_rtl(entry: Entry, golden: Golden, workdir: Path, clock_ns: float) -> Check:
    """The entry's network as da4ml Verilog under Verilator (cached builds) against the golden outputs."""
    from offload.hls.rtl import RtlModel  # the rtl extra's tools: imported only when the stage runs

    kernel = golden.kernel()
    try:
        rtl = RtlModel.generate(kernel.spec, kernel.tensors, entry_dir(workdir / "rtl", entry.name), clock_mhz=1000.0 / clock_ns)
        got = {"y": rtl.compile().predict(golden.inputs["x"])}
    except UnsupportedError as e:
        return Check("skipped", f"not expressible in the RTL tier: {e}")
    check = compare_outputs(got, golden.outputs)
    check.data.update({"latency_cycles": rtl.latency_cycles, "stages": rtl.stages})
    return check


def check_entry(entry: Entry, device: Any, *, golden_root: Path | None = None, csynth: bool = False, cosim: bool = False,
                part: str = DEFAULT_PART, clock_ns: float = DEFAULT_CLOCK_NS, baselines: Mapping[str, Any] | None = None,
                tolerances: Tolerances = Tolerances(), workdir: Path = Path("build/regress"), timeout: float = 3600.0,
                rtl: bool = False) -> EntryResult:
    """Run every stage for one entry; never raises for a kernel problem (it becomes a failed check)."""
    t0 = time.perf_counter()
    res = EntryResult(entry.name, entry.kind)
    try:
        golden = load_golden(entry.name, golden_root)
    except GoldenError as e:
        res.checks["golden"] = Check("error", str(e))
        res.seconds = time.perf_counter() - t0
        return res
    try:
        res.checks["golden"] = stale_check(entry, golden)
    except Exception as e:  # noqa: BLE001 - a builder failure is reported against the entry
        res.checks["golden"] = Check("error", f"building the catalogue entry failed: {type(e).__name__}: {e}")
    kernel = golden.kernel()
    kind = get_kind(kernel.kind)
    try:
        kind.validate(kernel.spec, kernel.tensors, golden.inputs)
        res.checks["sim"] = compare_outputs(kind.reference(kernel.spec, kernel.tensors, golden.inputs), golden.outputs)
    except Exception as e:  # noqa: BLE001
        res.checks["sim"] = Check("error", f"{type(e).__name__}: {e}")
    if device is not None:
        try:
            handle = device.load(kernel)
            res.checks["csim"] = compare_outputs(device.run(handle, golden.inputs), golden.outputs)
        except Exception as e:  # noqa: BLE001
            res.checks["csim"] = Check("error", f"{type(e).__name__}: {e}")
    if rtl and kernel.kind == "mlp":
        try:
            res.checks["rtl"] = _check_rtl(entry, golden, workdir, clock_ns)
        except Exception as e:  # noqa: BLE001 - a missing tool or a failed build is reported against the entry
            res.checks["rtl"] = Check("error", f"{type(e).__name__}: {e}")
    if csynth or cosim:
        if vitis_hls() is None:
            skip = Check("skipped", "neither vitis-run nor vitis_hls is on PATH (set VITIS_HLS or source the Vitis settings64.sh)")
            if csynth:
                res.checks["csynth"] = skip
            if cosim:
                res.checks["cosim"] = skip
        else:
            try:
                synth, cos = synth_entry(entry, golden, workdir, part=part, clock_ns=clock_ns, cosim=cosim, timeout=timeout)
            except OSError as e:  # the tool named by VITIS_HLS is missing or cannot start
                synth = Check("error", f"{type(e).__name__}: {e}")
                cos = synth if cosim else None
            if synth.status == "pass":
                entries_ = (baselines or {}).get("entries", {})
                cmp = compare_baseline(synth.data["metrics"], entries_.get(entry.name), tolerances)
                cmp.data.update({k: v for k, v in synth.data.items() if k != "metrics"})
                synth = cmp
            res.checks["csynth"] = synth
            if cos is not None:
                res.checks["cosim"] = cos
    res.seconds = time.perf_counter() - t0
    return res


def run_regression(selection: Iterable[Entry] | Iterable[str] | str | None = None, *, device: Any = None, jobs: int = 1,
                   golden_root: Path | None = None, csynth: bool = False, cosim: bool = False, part: str = DEFAULT_PART,
                   clock_ns: float = DEFAULT_CLOCK_NS, baselines_root: Path | None = None, tolerances: Tolerances = Tolerances(),
                   update_baselines: bool = False, workdir: Path = Path("build/regress"), rtl: bool = False,
                   on_start: Callable[[Entry], None] | None = None, on_result: Callable[[EntryResult], None] | None = None) -> RegressReport:
    """Check the selected entries (patterns, entries, or all) with ``jobs`` threads.

    ``device`` runs the C-simulation (``open_device("emu")``); ``None`` skips that stage.
    ``update_baselines`` writes the measured synthesis metrics as the part's new baselines.
    ``rtl`` also builds each ``mlp`` entry to Verilog (da4ml) and checks it under Verilator.
    """
    sel = select(selection)
    if jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    baselines = read_baselines(part, baselines_root) if csynth else None
    t0 = time.perf_counter()
    results: dict[str, EntryResult] = {}
    lock = threading.Lock()

    def one(e: Entry) -> EntryResult:
        if on_start:
            with lock:
                on_start(e)
        return check_entry(e, device, golden_root=golden_root, csynth=csynth, cosim=cosim, part=part, clock_ns=clock_ns,
                           baselines=baselines, tolerances=tolerances, workdir=workdir, rtl=rtl)

    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="offload-regress") as pool:
        futs = {pool.submit(one, e): e for e in sel}
        for f in as_completed(futs):
            r = f.result()
            results[r.name] = r
            if on_result:
                with lock:
                    on_result(r)
    ordered = [results[e.name] for e in sel]
    if update_baselines and csynth:
        measured = {r.name: r.checks["csynth"].data["metrics"] for r in ordered if r.checks.get("csynth") and r.checks["csynth"].data.get("metrics")}
        if measured:
            tool = next((r.checks["csynth"].data.get("tool_version") for r in ordered if r.name in measured), None)
            write_baselines(part, clock_ns, tool and f"vitis_hls {tool}", measured, baselines_root)
    settings = {"kernel": patterns_of(selection), "jobs": jobs, "device": None if device is None else device.name, "csynth": csynth, "cosim": cosim,
                "rtl": rtl}
    if csynth or cosim:
        settings.update({"part": part, "clock_ns": clock_ns, "tolerances": asdict(tolerances)})
    return RegressReport(ordered, settings, time.perf_counter() - t0)

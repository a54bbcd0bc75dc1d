"""The HLS kernel regression runner behind ``offload regress``.

For each selected catalogue entry (:mod:`offload.kernels.catalogue`):

1. **golden**: its golden vectors are loaded and the catalogue is checked to still build the same
   kernel (spec, tensors, inputs); a difference means the vectors are stale.
2. **sim**: the bit-exact reference model reproduces the expected raw outputs, zero mismatches.
3. **csim**: the kernel's generated HLS C++, compiled with g++ (cached by content hash) and run
   through a device with card semantics (the caller passes one, normally ``open_device("emu")``:
   this layer does not import ``offload.host``), reproduces them bit for bit.
4. optionally **csynth** (``vitis-run`` or ``vitis_hls`` on PATH): a Tcl project is written and synthesised, the
   report parsed (:mod:`offload.hls.reports`) and compared with the committed baseline of the
   target part (``kernels/baselines/<part>.json``) within :class:`Tolerances`;
   **cosim**: a generated C testbench drives ``cosim_design`` with the golden inputs and the
   buffers it writes back are unpacked and compared with the golden outputs.

Entries run in parallel threads (``jobs``): the work is g++ / vitis_hls subprocesses.

Example::

    from offload.host import open_device
    from offload.hls.regress import run_regression
    rep = run_regression("emb/sum/*", device=open_device("emu"), jobs=2)
    print(rep.ok, rep.to_markdown())
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

import offload.kernels
from offload.hls import csim
from offload.hls.registry import get_hls_kind
from offload.hls.reports import ReportError, find_report, parse_report
from offload.kernels.catalogue import Entry, Golden, GoldenError, diff_golden, golden_dir, load_golden, read_index, write_golden
from offload.kernels.catalogue import entries as catalogue_entries
from offload.kernels.registry import get_kind

__all__ = [
    "DEFAULT_PART",
    "DEFAULT_CLOCK_NS",
    "Tolerances",
    "Check",
    "EntryResult",
    "RegressReport",
    "check_entry",
    "run_regression",
    "regenerate",
    "compare_outputs",
    "compare_baseline",
    "baselines_dir",
    "read_baselines",
    "write_baselines",
    "synthesis_tcl",
    "testbench",
    "vitis_hls",
    "read_testbench_outputs",
    "describe_change",
]

DEFAULT_PART = "xcu55c-fsvh2892-2L-e"  # Alveo U55C
DEFAULT_CLOCK_NS = 3.333  # 300 MHz kernel clock, the Alveo default

FAILING = ("fail", "error", "regression")


@dataclass(frozen=True)
class Tolerances:
    """How much worse than the baseline a synthesis metric may get (relative) before it is a regression.

    Latency and II are checked together (``latency``), resources together (``resources``), the
    estimated clock period on its own (``clock``). A value below the baseline is an improvement.
    """

    latency: float = 0.05
    resources: float = 0.10
    clock: float = 0.05

    @classmethod
    def parse(cls, text: str) -> "Tolerances":
        """``"latency=0.05,resources=0.1"`` (missing keys keep their defaults); ``ValueError`` names a bad key."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, val = part.partition("=")
            key = key.strip()
            if key not in known:
                raise ValueError(f"tolerance {key!r}: unknown, expected one of {sorted(known)}")
            try:
                kw[key] = float(val)
            except ValueError:
                raise ValueError(f"tolerance {key}: {val!r} is not a number") from None
            if kw[key] < 0:
                raise ValueError(f"tolerance {key}: must be >= 0, got {kw[key]}")
        return cls(**kw)

    def for_metric(self, metric: str) -> float:
        if metric.startswith(("latency", "interval")):
            return self.latency
        if metric == "estimated_clock_ns":
            return self.clock
        return self.resources


@dataclass
class Check:
    """Outcome of one stage of one entry: ``pass``, ``fail``, ``error``, ``skipped``,
    ``regression``, ``improvement`` or ``no-baseline``; ``detail`` says why, ``data`` carries numbers."""

    status: str
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class EntryResult:
    name: str
    kind: str
    checks: dict[str, Check] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(c.status in FAILING for c in self.checks.values())

    @property
    def status(self) -> str:
        for s in FAILING:
            if any(c.status == s for c in self.checks.values()):
                return s
        return "pass"

    def problems(self) -> list[str]:
        return [f"{stage}: {c.detail or c.status}" for stage, c in self.checks.items() if c.status in FAILING]


@dataclass
class RegressReport:
    """All results of a run, in catalogue order, with the run's settings."""

    results: list[EntryResult]
    settings: dict[str, Any]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "seconds": round(self.seconds, 3),
            "settings": self.settings,
            "results": [
                {"name": r.name, "kind": r.kind, "status": r.status, "seconds": round(r.seconds, 3), "checks": {k: asdict(c) for k, c in r.checks.items()}}
                for r in self.results
            ],
        }

    def to_markdown(self) -> str:
        stages = [s for s in ("golden", "sim", "csim", "csynth", "cosim") if any(s in r.checks for r in self.results)]
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items()))
        lines = [
            "# offload regress",
            "",
            f"**{'PASS' if self.ok else 'FAIL'}**: {len(self.results)} entries ({counts}) in {self.seconds:.1f} s; "
            + ", ".join(f"{k}={v}" for k, v in self.settings.items() if v not in (None, False, [], "")),
            "",
            "| entry | kind | " + " | ".join(stages) + " | s |",
            "|---|---|" + "---|" * len(stages) + "---|",
        ]
        for r in self.results:
            cells = [r.checks[s].status if s in r.checks else "" for s in stages]
            lines.append(f"| `{r.name}` | {r.kind} | " + " | ".join(cells) + f" | {r.seconds:.2f} |")
        bad = [r for r in self.results if not r.ok]
        if bad:
            lines += ["", "## Failures", ""]
            for r in bad:
                for p in r.problems():
                    lines.append(f"- `{r.name}`: {p}")
        synth = [(r, r.checks["csynth"]) for r in self.results if "csynth" in r.checks and r.checks["csynth"].data.get("metrics")]
        if synth:
            lines += ["", "## Synthesis", "", "| entry | status | metric | baseline | now | change |", "|---|---|---|---|---|---|"]
            for r, c in synth:
                deltas = c.data.get("deltas", {})
                for m, now in c.data["metrics"].items():
                    d = deltas.get(m)
                    base = "" if d is None else f"{d['baseline']:g}"
                    change = "" if d is None else f"{d['relative'] * 100:+.1f}% ({d['verdict']})"
                    lines.append(f"| `{r.name}` | {c.status} | {m} | {base} | {now:g} | {change} |")
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- comparisons


def compare_outputs(got: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> Check:
    """Bit-exact comparison of raw outputs: every expected output present, same shape, equal values."""
    problems: list[str] = []
    counts: dict[str, int] = {}
    for name, exp in expected.items():
        if name not in got:
            problems.append(f"output {name!r} missing (got {sorted(got)})")
            continue
        g = np.asarray(got[name])
        if g.shape != exp.shape:
            problems.append(f"output {name!r}: shape {list(g.shape)}, expected {list(exp.shape)}")
            continue
        bad = g != exp
        n = int(np.count_nonzero(bad))
        counts[name] = n
        if n:
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            problems.append(f"output {name!r}: {n} of {exp.size} values differ (first at {list(first)}: got {g[first]}, expected {exp[first]})")
    if problems:
        return Check("fail", "; ".join(problems), {"mismatches": counts})
    return Check("pass", f"{sum(v.size for v in expected.values())} values bit-exact", {"mismatches": counts})


def compare_baseline(metrics: Mapping[str, float], baseline: Mapping[str, float] | None, tol: Tolerances) -> Check:
    """Synthesis metrics against a baseline: regression beyond the tolerance, improvement below it."""
    if not baseline:
        return Check("no-baseline", "no committed baseline for this entry and part", {"metrics": dict(metrics)})
    deltas: dict[str, dict[str, Any]] = {}
    worse, better = [], []
    for m, now in metrics.items():
        if m not in baseline:
            continue
        old = float(baseline[m])
        rel = (now - old) / max(abs(old), 1.0)  # a 0 -> 1 change counts as +100 %
        limit = tol.for_metric(m)
        verdict = "regression" if rel > limit else "improvement" if now < old else "same" if now == old else "within tolerance"
        deltas[m] = {"baseline": old, "now": now, "relative": rel, "limit": limit, "verdict": verdict}
        if verdict == "regression":
            worse.append(f"{m} {old:g} -> {now:g} ({rel * 100:+.1f}% > {limit * 100:.0f}%)")
        elif verdict == "improvement":
            better.append(f"{m} {old:g} -> {now:g} ({rel * 100:+.1f}%)")
    data = {"metrics": dict(metrics), "baseline": dict(baseline), "deltas": deltas}
    if worse:
        return Check("regression", "; ".join(worse), data)
    if better:
        return Check("improvement", "; ".join(better), data)
    return Check("pass", "within tolerance of the baseline", data)


# ---------------------------------------------------------------- baselines


def baselines_dir() -> Path:
    """Committed baselines (``$OFFLOAD_BASELINES_DIR`` overrides the packaged ``kernels/baselines``)."""
    env = os.environ.get("OFFLOAD_BASELINES_DIR")
    if env:
        return Path(env)

    return Path(offload.kernels.__file__).parent / "baselines"


def _baseline_file(part: str, root: Path | None) -> Path:
    return (root or baselines_dir()) / f"{part}.json"


def read_baselines(part: str, root: Path | None = None) -> dict[str, Any]:
    """The baseline file of ``part``: ``{"format": 1, "part", "clock_ns", "tool", "entries": {name: metrics}}``."""
    p = _baseline_file(part, root)
    if not p.is_file():
        return {"format": 1, "part": part, "clock_ns": None, "tool": None, "entries": {}}
    data = json.loads(p.read_text())
    if data.get("format") != 1:
        raise ValueError(f"{p}: unknown baseline format {data.get('format')!r} (expected 1)")
    return data


def write_baselines(part: str, clock_ns: float, tool: str | None, metrics: Mapping[str, Mapping[str, float]], root: Path | None = None) -> Path:
    """Merge ``metrics`` (entry name -> metrics) into the baseline file of ``part``."""
    data = read_baselines(part, root)
    data.update({"part": part, "clock_ns": clock_ns, "tool": tool})
    data["entries"] = {**data.get("entries", {}), **{k: dict(v) for k, v in metrics.items()}}
    data["entries"] = {k: data["entries"][k] for k in sorted(data["entries"])}
    p = _baseline_file(part, root)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1) + "\n")
    return p


# ---------------------------------------------------------------- Vitis HLS projects

_C_TYPES = {
    "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
    "int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t",
    "float32": "float", "float64": "double",
}  # fmt: skip


@dataclass(frozen=True)
class HlsTool:
    """The Vitis HLS front end: ``vitis-run --mode hls --tcl`` (Vitis 2024.2 deprecates
    ``vitis_hls -f``; UG1399) or, on older Vitis, ``vitis_hls -f``."""

    path: str

    @property
    def unified(self) -> bool:
        return Path(self.path).name.startswith("vitis-run")

    def command(self, tcl: str) -> list[str]:
        return [self.path, "--mode", "hls", "--tcl", tcl] if self.unified else [self.path, "-f", tcl]


def hls_tool() -> HlsTool | None:
    """``$VITIS_HLS`` (either tool), else ``vitis-run`` on PATH, else ``vitis_hls``, else ``None``."""
    path = os.environ.get("VITIS_HLS") or shutil.which("vitis-run") or shutil.which("vitis_hls")
    return HlsTool(path) if path else None


def vitis_hls() -> str | None:
    """Path of the HLS tool :func:`hls_tool` picks, or ``None``."""
    tool = hls_tool()
    return tool.path if tool else None


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def synthesis_tcl(top: str, sources: Sequence[str], *, part: str, clock_ns: float, testbench: str | None = None,
                  tb_args: str = "", include_dirs: Sequence[str | os.PathLike] = (), cosim: bool = False,
                  project: str = "prj", solution: str = "solution1") -> str:
    """The Vitis HLS Tcl script: open_project, set_top, add_files, open_solution, set_part,
    create_clock, csynth_design (and cosim_design with a testbench)."""
    cflags = " ".join(["-std=c++14", *(f"-I{Path(d).resolve()}" for d in include_dirs)])
    lines = [f"open_project -reset {project}", f"set_top {top}"]
    lines += [f'add_files {{{s}}} -cflags "{cflags}"' for s in sources]
    if testbench:
        lines.append(f'add_files -tb {{{testbench}}} -cflags "{cflags}"')
    lines += [
        f"open_solution -reset {solution} -flow_target vitis",
        f"set_part {{{part}}}",
        f"create_clock -period {clock_ns:g} -name default",
        "csynth_design",
    ]
    if cosim:
        lines.append(f"cosim_design -argv {{{tb_args}}}" if tb_args else "cosim_design")
    lines.append("exit")
    return "\n".join(lines) + "\n"


_M_AXI = re.compile(r"#pragma HLS INTERFACE m_axi port = (\w+)[^\n]*?depth = (\d+)")


def depth_shortfalls(spec: Any, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> list[str]:
    """The m_axi ports whose declared ``depth`` is smaller than what ``inputs`` hand them (or that
    declare none): co-simulation would read past the depth and stall or fail (UG1399)."""
    hk = get_hls_kind(spec.kind)
    top = hk.top_name(spec)
    declared = {m.group(1): int(m.group(2)) for m in _M_AXI.finditer(hk.sources(spec)[f"{top}.cpp"])}
    given = {**hk.pack_resident(spec, tensors), **hk.pack_inputs(spec, inputs)}
    out = []
    for a in hk.top_args(spec):
        if a.role == "scalar":
            continue
        n = np.asarray(given[a.name]).size
        if a.name not in declared:
            out.append(f"port {a.name} declares no depth")
        elif n > declared[a.name]:
            out.append(f"port {a.name} gets {n} elements, its declared depth is {declared[a.name]}")
    return out


def testbench(spec: Any, tensors: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray], data_dir: Path) -> str:
    """A C testbench for the kernel's top function, plus its data files in ``data_dir``.

    Buffers are packed by the kind's own ``pack_resident`` / ``pack_inputs`` and written as raw
    little-endian files; the testbench reads them, calls the top function once and writes every
    output buffer to ``<name>.out.bin``, which :func:`read_testbench_outputs` unpacks. Pointer
    arguments are declared with the C type of their NumPy dtype.
    """
    hk = get_hls_kind(spec.kind)
    args = list(hk.top_args(spec))
    values = {**hk.pack_resident(spec, tensors), **hk.pack_inputs(spec, inputs)}
    data_dir.mkdir(parents=True, exist_ok=True)
    proto, body, call, outs = [], [], [], []
    for i, a in enumerate(args):
        ctype = _C_TYPES[np.dtype(a.dtype).name]
        if a.role == "scalar":
            proto.append(f"{ctype} {a.name}")
            v = values[a.name]
            call.append(f"({ctype}){int(v) if np.dtype(a.dtype).kind in 'iu' else float(v)!r}")
            continue
        arr = np.ascontiguousarray(values[a.name], dtype=a.dtype)
        (data_dir / f"{a.name}.bin").write_bytes(arr.tobytes())
        proto.append(f"{ctype} *{a.name}")
        body.append(f'    std::vector<{ctype}> b{i} = load<{ctype}>(dir, "{a.name}.bin", {arr.size}u);')
        call.append(f"b{i}.data()")
        if a.role == "output":
            outs.append(f'    save<{ctype}>(dir, "{a.name}.out.bin", b{i});')
    return "\n".join([
        "// Generated by offload.hls.regress: drives the top function with golden inputs.",
        "#include <cstdint>",
        "#include <cstdio>",
        "#include <string>",
        "#include <vector>",
        '#include "offload_csim_io.h"',
        f'extern "C" void {hk.top_name(spec)}({", ".join(proto)});',
        "template <typename T> static std::vector<T> load(const std::string &dir, const char *name, size_t n) {",
        '    std::FILE *f = std::fopen((dir + "/" + name).c_str(), "rb");',
        '    if (!f) { std::fprintf(stderr, "testbench: cannot open %s\\n", name); std::exit(4); }',
        "    std::vector<T> v = offload_csim::read_array<T>(f, n);",
        "    std::fclose(f);",
        "    return v;",
        "}",
        "template <typename T> static void save(const std::string &dir, const char *name, const std::vector<T> &v) {",
        '    std::FILE *f = std::fopen((dir + "/" + name).c_str(), "wb");',
        '    if (!f) { std::fprintf(stderr, "testbench: cannot write %s\\n", name); std::exit(5); }',
        "    offload_csim::write_array<T>(f, v.data(), v.size());",
        "    std::fclose(f);",
        "}",
        "int main(int argc, char **argv) {",
        f'    const std::string dir = argc > 1 ? argv[1] : "{data_dir.resolve()}";',
        *body,
        f"    {hk.top_name(spec)}({', '.join(call)});",
        *outs,
        "    return 0;",
        "}",
        "",
    ])


def read_testbench_outputs(spec: Any, inputs: Mapping[str, np.ndarray], data_dir: Path) -> dict[str, np.ndarray]:
    """Unpack the output buffers a testbench run wrote (``FileNotFoundError`` when it wrote none)."""
    hk = get_hls_kind(spec.kind)
    packed = hk.pack_inputs(spec, inputs)
    bufs = {}
    for a in hk.top_args(spec):
        if a.role == "output":
            raw = np.fromfile(data_dir / f"{a.name}.out.bin", dtype=a.dtype)
            bufs[a.name] = raw.reshape(np.shape(packed[a.name]))
    return hk.unpack_outputs(spec, inputs, bufs)


def _run_vitis(entry: Entry, golden: Golden, workdir: Path, *, part: str, clock_ns: float, cosim: bool, timeout: float) -> tuple[Check, Check | None]:
    tool = hls_tool()
    kernel = golden.kernel()
    hk = get_hls_kind(kernel.kind)
    top = hk.top_name(kernel.spec)
    if cosim:
        short = depth_shortfalls(kernel.spec, kernel.tensors, golden.inputs)
        if short:
            err = Check("error", "co-simulation would read past the declared m_axi depth: " + "; ".join(short))
            return err, err
    work = workdir / _slug(entry.name)
    if work.exists():
        shutil.rmtree(work)
    src = work / "src"
    src.mkdir(parents=True)
    names = []
    for fname, text in hk.sources(kernel.spec).items():
        (src / fname).write_text(text)
        if not fname.endswith((".h", ".hpp")):
            names.append(str(src / fname))
    tb = None
    data = work / "tb_data"
    if cosim:
        tb = src / "offload_tb.cpp"
        tb.write_text(testbench(kernel.spec, kernel.tensors, golden.inputs, data))
    tcl = synthesis_tcl(top, names, part=part, clock_ns=clock_ns, testbench=str(tb) if tb else None,
                        tb_args=str(data.resolve()) if cosim else "", include_dirs=[src, csim.offload_include(), csim.nnet_utils_include()], cosim=cosim)
    (work / "run.tcl").write_text(tcl)
    try:
        proc = subprocess.run(tool.command("run.tcl"), cwd=work, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        err = Check("error", f"vitis_hls did not finish within {timeout:.0f} s ({work})")
        return err, (err if cosim else None)
    (work / "vitis_hls.out").write_text(proc.stdout + proc.stderr)
    log_tail = " | ".join([ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln][-3:])
    try:
        rep = parse_report(find_report(work / "prj" / "solution1", top))
        synth = Check("pass", "", {"metrics": rep.metrics(), "report": rep.source, "fmax_mhz": rep.fmax_mhz, "tool_version": rep.tool_version})
    except (FileNotFoundError, ReportError) as e:
        synth = Check("error", f"vitis_hls exit {proc.returncode}: {e}" + (f" ({log_tail})" if log_tail else ""))
    cos = None
    if cosim:
        if proc.returncode != 0:
            cos = Check("fail", f"vitis_hls exit {proc.returncode} in cosim_design" + (f": {log_tail}" if log_tail else ""))
        else:
            try:
                got = read_testbench_outputs(kernel.spec, golden.inputs, data)
            except FileNotFoundError as e:
                cos = Check("fail", f"co-simulation testbench wrote no outputs ({e.filename})")
            else:
                cos = compare_outputs(got, golden.outputs)
    return synth, cos


# ---------------------------------------------------------------- the runner


def _stale(entry: Entry, golden: Golden) -> Check:
    case = entry.build()
    fresh = Golden(entry.name, entry.kind, entry.seed, case.kernel.spec.to_json(), case.kernel.tensors, case.inputs, golden.outputs)
    diff = diff_golden(golden, fresh)
    if diff:
        what = ", ".join(f"{k}: {v}" for k, v in diff.items())
        return Check("fail", f"golden vectors are stale ({what}); regenerate with `offload regress --regenerate --kernel '{entry.name}'`", {"diff": diff})
    return Check("pass", "catalogue builds the kernel the golden vectors were made for")


def _check_rtl(entry: Entry, golden: Golden, workdir: Path, clock_ns: float) -> Check:
    """The entry's network as da4ml Verilog under Verilator (cached builds) against the golden outputs."""
    from offload.hls.rtl import RtlModel
    from offload.sim.errors import UnsupportedError

    kernel = golden.kernel()
    try:
        rtl = RtlModel.generate(kernel.spec, kernel.tensors, workdir / "rtl" / _slug(entry.name), clock_mhz=1000.0 / clock_ns)
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
        res.checks["golden"] = _stale(entry, golden)
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
            synth, cos = _run_vitis(entry, golden, workdir, part=part, clock_ns=clock_ns, cosim=cosim, timeout=timeout)
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
    sel = _as_entries(selection)
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
    settings = {"kernel": _patterns_of(selection), "jobs": jobs, "device": None if device is None else device.name, "csynth": csynth, "cosim": cosim,
                "rtl": rtl}
    if csynth or cosim:
        settings.update({"part": part, "clock_ns": clock_ns, "tolerances": asdict(tolerances)})
    return RegressReport(ordered, settings, time.perf_counter() - t0)


def _as_entries(selection: Iterable[Entry] | Iterable[str] | str | None) -> list[Entry]:
    if selection is None or isinstance(selection, str):
        return catalogue_entries(selection)
    items = list(selection)
    if all(isinstance(x, Entry) for x in items):
        return items
    return catalogue_entries([str(x) for x in items])


def _patterns_of(selection: Any) -> list[str]:
    if selection is None:
        return []
    if isinstance(selection, str):
        return [selection]
    return [x if isinstance(x, str) else x.name for x in selection][:20]


# ---------------------------------------------------------------- regeneration


def regenerate(selection: Iterable[Entry] | Iterable[str] | str | None = None, *, device: Any = None, root: Path | None = None,
               jobs: int = 1, prune: bool | None = None, reason: str | None = None) -> dict[str, dict[str, Any]]:
    """Rebuild golden vectors from the catalogue (fixed seeds) and write those that changed.

    Vectors whose kernel and inputs are unchanged but whose expected outputs differ mean the
    reference itself computes something else now: that is exactly what golden vectors exist to
    catch, so such an entry is refused (``{"refused": ...}`` plus the diff, nothing written) unless
    ``reason`` says why the new outputs are right. Changes that follow a catalogue change (spec,
    tensors or inputs differ, new or removed entries) are written.

    Expected outputs come from the reference model; with a ``device`` the C-simulation must agree
    bit for bit or the entry is not written (``{"error": ...}``). Returns entry name -> change
    (:func:`offload.kernels.catalogue.diff_golden`; empty when unchanged, ``{"removed": True}`` for
    pruned entries). ``prune`` (default: when the whole catalogue is selected) drops index entries
    no longer in the catalogue.
    """
    sel = _as_entries(selection)
    root = root or golden_dir()
    prune = (selection is None) if prune is None else prune

    def one(e: Entry) -> tuple[Entry, Golden | None, dict[str, Any]]:
        try:
            return _regenerate_one(e)
        except Exception as ex:  # noqa: BLE001 - reported against the entry; the others still regenerate
            return e, None, {"error": f"{type(ex).__name__}: {ex}"}

    def _regenerate_one(e: Entry) -> tuple[Entry, Golden | None, dict[str, Any]]:
        case = e.build()
        k = case.kernel
        kind = get_kind(k.kind)
        kind.validate(k.spec, k.tensors, case.inputs)
        outs = {n: np.asarray(v) for n, v in kind.reference(k.spec, k.tensors, case.inputs).items()}
        new = Golden(e.name, e.kind, e.seed, k.spec.to_json(), {n: np.asarray(v) for n, v in k.tensors.items()},
                     {n: np.asarray(v) for n, v in case.inputs.items()}, outs)
        if device is not None:
            chk = compare_outputs(device.run(device.load(new.kernel()), new.inputs), outs)
            if chk.status != "pass":
                return e, None, {"error": f"C-simulation disagrees with the reference, not written: {chk.detail}"}
        try:
            old = load_golden(e.name, root)
        except GoldenError:
            old = None
        diff = diff_golden(old, new)
        if diff and not reason and all(k.startswith("outputs.") for k in diff):
            return e, None, {"refused": "the reference's outputs changed for the same kernel and inputs; "
                                        "rerun with a reason (--reason) if the new outputs are right", **diff}
        return e, new, diff

    changes: dict[str, dict[str, Any]] = {}
    to_write: list[Golden] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for e, new, diff in pool.map(one, sel):
            changes[e.name] = diff
            if new is not None and diff:
                to_write.append(new)
    removed: list[str] = []
    if prune:
        names = {e.name for e in sel}
        removed = [n for n in read_index(root) if n not in names]
        for n in removed:
            changes[n] = {"removed": True}
    if to_write or removed:
        write_golden(to_write, root, remove=removed)
    return changes


def describe_change(diff: Mapping[str, Any]) -> str:
    """One line for a :func:`regenerate` change."""
    if not diff:
        return "unchanged"
    if diff.get("new"):
        return "new"
    if diff.get("removed"):
        return "removed (no longer in the catalogue)"
    if "error" in diff:
        return f"ERROR: {diff['error']}"
    if "refused" in diff:
        counts = "; ".join(f"{k}: {v} values differ" for k, v in diff.items() if k != "refused")
        return f"REFUSED ({counts}): {diff['refused']}"
    parts = []
    for k, v in diff.items():
        parts.append(f"{k} {v}" if isinstance(v, str) else f"{k}: {v} values differ")
    return "; ".join(parts)

"""Parsers for Vivado HLS / Vitis HLS C-synthesis reports (``csynth.xml`` and ``csynth.rpt``).

Both formats carry the same summary: the top function's latency and initiation interval, the
resource estimate (BRAM_18K, DSP, FF, LUT, URAM) and the clock (target and estimated period).
Two text layouts exist: the classic per-module report (Vivado HLS, and Vitis HLS's
``<top>_csynth.rpt``) and the Vitis 2020.2+ *Synthesis Summary* (``csynth.rpt``), a single table
of modules and loops. Fields a format does not carry are ``None`` (the summary ``.rpt`` has no
clock periods), never guessed.

The classic report also breaks the top down per sub-function instance (its "Detail: Instance"
tables); :func:`parse_instances` reads those.

Example::

    from offload.hls.reports import parse_report, find_report
    rep = parse_report(find_report("prj/solution1", top="offload_embedding"))
    print(rep.latency_max, rep.interval_min, rep.resources["LUT"], rep.fmax_mhz)
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from offload.sim.errors import ReportError  # noqa: F401  (re-exported: defined once in the hierarchy)

__all__ = ["SynthReport", "InstanceReport", "ReportError", "RESOURCES", "parse_report", "parse_xml", "parse_rpt",
           "parse_instances", "find_report"]

# Canonical resource names; reports spell DSPs "DSP48E" (7-series) or "DSP" (UltraScale+, Vitis).
RESOURCES: tuple[str, ...] = ("BRAM_18K", "DSP", "FF", "LUT", "URAM")
_RESOURCE_ALIASES = {"BRAM_18K": "BRAM_18K", "BRAM": "BRAM_18K", "DSP48E": "DSP", "DSP": "DSP", "FF": "FF", "LUT": "LUT", "URAM": "URAM"}


@dataclass(frozen=True)
class SynthReport:
    """The summary of one C-synthesis run of a top function.

    Latencies and intervals are in clock cycles, clock periods in ns. ``resources`` maps the
    canonical names in :data:`RESOURCES` to used counts; ``available`` to the part's totals where
    the report states them.
    """

    top: str | None
    part: str | None
    tool_version: str | None
    target_clock_ns: float | None
    estimated_clock_ns: float | None
    latency_min: int | None
    latency_max: int | None
    interval_min: int | None
    interval_max: int | None
    resources: dict[str, int] = field(default_factory=dict)
    available: dict[str, int] = field(default_factory=dict)
    source: str = ""

    @property
    def fmax_mhz(self) -> float | None:
        """Clock achieved, from the estimated period (``None`` where the report has none)."""
        return None if not self.estimated_clock_ns else 1000.0 / self.estimated_clock_ns

    def metrics(self) -> dict[str, float]:
        """Flat numeric view used by baselines: latency/II in cycles, resources, estimated clock."""
        out: dict[str, float] = {}
        for k in ("latency_min", "latency_max", "interval_min", "interval_max", "estimated_clock_ns"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        for r in RESOURCES:
            if r in self.resources:
                out[r] = self.resources[r]
        return out

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class InstanceReport:
    """One sub-function instance of the top: its latency and interval in cycles (``None`` where the
    report prints ``?``) and its resources under the canonical names of :data:`RESOURCES`."""

    name: str
    module: str
    latency_min: int | None
    latency_max: int | None
    interval_min: int | None
    interval_max: int | None
    resources: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------- XML


def _text(root: ET.Element, path: str) -> str | None:
    el = root.find(path)
    if el is None or el.text is None:
        return None
    t = el.text.strip()
    return t or None


def _int(s: str | None) -> int | None:
    if s is None:
        return None
    s = s.strip()
    return int(s) if re.fullmatch(r"-?\d+", s) else None  # "undef" / "?" for unknown trip counts


def _float(s: str | None) -> float | None:
    if s is None:
        return None
    m = re.match(r"\s*(-?\d+(?:\.\d*)?)", s)
    return float(m.group(1)) if m else None


def _resources(el: ET.Element | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if el is None:
        return out
    for child in el:
        name = _RESOURCE_ALIASES.get(child.tag)
        v = _int(child.text)
        if name and v is not None:
            out[name] = v
    return out


def parse_xml(path: str | Path) -> SynthReport:
    """Parse a ``csynth.xml`` / ``<top>_csynth.xml`` report."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise ReportError(f"{path}: not well-formed XML ({e})") from None
    if root.tag != "profile" or root.find("PerformanceEstimates") is None:
        raise ReportError(f"{path}: no <profile>/<PerformanceEstimates>: not a C-synthesis report")
    lat = "PerformanceEstimates/SummaryOfOverallLatency/"
    return SynthReport(
        top=_text(root, "UserAssignments/TopModelName"),
        part=_text(root, "UserAssignments/Part"),
        tool_version=_text(root, "ReportVersion/Version"),
        target_clock_ns=_float(_text(root, "UserAssignments/TargetClockPeriod")),
        estimated_clock_ns=_float(_text(root, "PerformanceEstimates/SummaryOfTimingAnalysis/EstimatedClockPeriod")),
        latency_min=_int(_text(root, lat + "Best-caseLatency")),
        latency_max=_int(_text(root, lat + "Worst-caseLatency")),
        interval_min=_int(_text(root, lat + "Interval-min")),
        interval_max=_int(_text(root, lat + "Interval-max")),
        resources=_resources(root.find("AreaEstimates/Resources")),
        available=_resources(root.find("AreaEstimates/AvailableResources")),
        source=str(path),
    )


# ---------------------------------------------------------------- text (.rpt)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_rule(line: str) -> bool:
    s = line.strip()
    return s.startswith("+-") and set(s) <= set("+-")


def _tables(lines: list[str], start: int) -> tuple[list[list[str]], list[list[str]], int]:
    """The first ASCII table at or after ``start``: (header rows, body rows, index after it).

    Tables are rule / header rows / rule / body rows / rule [/ more rows / rule].
    """
    i = start
    while i < len(lines) and not _is_rule(lines[i]):
        i += 1
    sections: list[list[list[str]]] = [[]]
    i += 1
    while i < len(lines):
        ln = lines[i]
        if _is_rule(ln):
            sections.append([])
        elif ln.strip().startswith("|"):
            sections[-1].append(_cells(ln))
        else:
            break
        i += 1
    sections = [s for s in sections if s]
    if not sections:
        return [], [], i
    header = sections[0]
    body = [row for s in sections[1:] for row in s]
    return header, body, i


def _column_names(header: list[list[str]]) -> list[str]:
    width = max(len(r) for r in header)
    return [" ".join(r[c] for r in header if c < len(r) and r[c]).strip() for c in range(width)]


def _find(lines: list[str], pattern: str, start: int = 0) -> int:
    rx = re.compile(pattern)
    for i in range(start, len(lines)):
        if rx.search(lines[i]):
            return i
    return -1


def _field(lines: list[str], label: str) -> str | None:
    i = _find(lines, r"^\s*\*\s*" + re.escape(label) + r"\s*:")
    return lines[i].split(":", 1)[1].strip() if i >= 0 else None


def _cell_int(cell: str) -> int | None:
    # "3 (~0%)" -> 3, "-" -> 0 in resource columns (the tool prints "-" for none used).
    m = re.match(r"\s*(\d+)", cell)
    return int(m.group(1)) if m else None


def _latency_range(cell: str) -> tuple[int | None, int | None]:
    nums = [int(x) for x in re.findall(r"\d+", cell)]
    if not nums or "?" in cell:
        return None, None
    return nums[0], nums[-1]  # "a ~ b" for a variable latency, else one value


def _parse_summary_rpt(path: Path, lines: list[str], version: str | None) -> SynthReport:
    """Vitis HLS 2020.2+ 'Synthesis Summary Report': one table of modules (+) and loops (o)."""
    head = lines[_find(lines, r"Synthesis Summary Report of")]
    top = re.search(r"'([^']+)'", head)
    t = _find(lines, r"Performance & Resource Estimates")
    header, body, _ = _tables(lines, t)
    if not header or not body:
        raise ReportError(f"{path}: summary report without a Performance & Resource Estimates table")
    cols = _column_names(header)
    row = next((r for r in body if r and r[0].lstrip().startswith("+")), body[0])

    def col(*keys: str) -> str | None:
        for i, name in enumerate(cols):
            if all(k.lower() in name.lower() for k in keys) and i < len(row):
                return row[i]
        return None

    lat_cell = col("Latency", "cycles")
    lmin, lmax = _latency_range(lat_cell) if lat_cell is not None else (None, None)
    ii_cell = col("Interval")
    imin, imax = _latency_range(ii_cell) if ii_cell is not None else (None, None)
    resources: dict[str, int] = {}
    for i, name in enumerate(cols):
        canon = _RESOURCE_ALIASES.get(name.strip())
        if canon and i < len(row):
            v = row[i].strip()
            resources[canon] = 0 if v == "-" else (_cell_int(v) or 0)
    return SynthReport(
        top=top.group(1) if top else None,
        part=_field(lines, "Target device"),
        tool_version=version,
        target_clock_ns=None,
        estimated_clock_ns=None,
        latency_min=lmin,
        latency_max=lmax,
        interval_min=imin,
        interval_max=imax,
        resources=resources,
        available={},
        source=str(path),
    )


def _parse_classic_rpt(path: Path, lines: list[str], version: str | None) -> SynthReport:
    """Vivado HLS / Vitis HLS per-module report: Timing, Latency and Utilization sections."""
    head = lines[_find(lines, r"HLS Report for")]
    top = re.search(r"'([^']+)'", head)

    target = estimated = None
    t = _find(lines, r"^\s*\+\s*Timing")
    if t >= 0:
        header, body, _ = _tables(lines, t)
        cols = _column_names(header)
        if body:
            row = body[0]
            for i, name in enumerate(cols):
                if name.startswith("Target") and i < len(row):
                    target = _float(row[i])
                elif name.startswith("Estimated") and i < len(row):
                    estimated = _float(row[i])

    lat = [None, None, None, None]
    t = _find(lines, r"^\s*\+\s*Latency")
    if t >= 0:
        _, body, _ = _tables(lines, t)
        if body:
            # Integer cells, in order: latency min, max (cycles), interval min, max. Absolute
            # latencies carry units ("0.480 ms") and the pipeline type is a word, so they drop out.
            ints = [int(c) for c in body[0] if re.fullmatch(r"\d+", c)]
            if len(ints) >= 4:
                lat = ints[:4]
            elif len(ints) >= 2:
                lat[:2] = ints[:2]

    resources: dict[str, int] = {}
    available: dict[str, int] = {}
    u = _find(lines, r"== Utilization Estimates")
    if u >= 0:
        s = _find(lines, r"^\s*\*\s*Summary", u)
        header, body, _ = _tables(lines, s if s >= 0 else u)
        cols = _column_names(header)
        for row in body:
            target_map = {"Total": resources, "Available": available}.get(row[0].strip())
            if target_map is None:
                continue
            for i, name in enumerate(cols):
                canon = _RESOURCE_ALIASES.get(name.strip())
                if canon and i < len(row):
                    v = _cell_int(row[i])
                    if v is not None:
                        target_map[canon] = v
    return SynthReport(
        top=top.group(1) if top else None,
        part=_field(lines, "Target device"),
        tool_version=version,
        target_clock_ns=target,
        estimated_clock_ns=estimated,
        latency_min=lat[0],
        latency_max=lat[1],
        interval_min=lat[2],
        interval_max=lat[3],
        resources=resources,
        available=available,
        source=str(path),
    )


def parse_rpt(path: str | Path) -> SynthReport:
    """Parse a text report: the classic ``<top>_csynth.rpt`` or the Vitis summary ``csynth.rpt``."""
    path = Path(path)
    lines = path.read_text(errors="replace").splitlines()
    ver = _field(lines, "Version")
    version = ver.split()[0] if ver else None
    if _find(lines, r"Synthesis Summary Report of") >= 0:
        return _parse_summary_rpt(path, lines, version)
    if _find(lines, r"HLS Report for") >= 0:
        return _parse_classic_rpt(path, lines, version)
    raise ReportError(f"{path}: neither a Vitis 'Synthesis Summary Report' nor a '... HLS Report for' file")


def _instance_table(lines: list[str], start: int, end: int) -> tuple[list[str], list[list[str]]]:
    """Column names and rows of the "* Instance:" table between ``start`` and ``end`` (none: empty)."""
    i = _find(lines, r"^\s*\*\s*Instance:", start)
    if i < 0 or i >= end:
        return [], []
    header, body, _ = _tables(lines, i)
    return (_column_names(header) if header else []), [r for r in body if len(r) > 2 and r[0] != "Total"]


def parse_instances(path: str | Path) -> dict[str, InstanceReport]:
    """Per-instance latency, interval and resources of a classic ``<top>_csynth.rpt``, in the order
    of its latency table. Only the classic layout has these tables: anything else is a
    :class:`ReportError`."""
    path = Path(path)
    lines = path.read_text(errors="replace").splitlines() if path.suffix == ".rpt" else []
    if _find(lines, r"HLS Report for") < 0:
        raise ReportError(f"{path}: per-instance tables are read from a classic '<top>_csynth.rpt' ('... HLS Report for') only")
    perf = _find(lines, r"== Performance Estimates")
    util = _find(lines, r"== Utilization Estimates")
    end = _find(lines, r"^== ", util + 1) if util >= 0 else -1
    latency: dict[str, tuple[str, list[int | None]]] = {}
    if perf >= 0:
        # Fixed layout (Vivado HLS and Vitis HLS alike): instance, module, latency min/max (cycles),
        # latency min/max (absolute, with units), interval min/max, pipeline type.
        _, rows = _instance_table(lines, perf, util if util >= 0 else len(lines))
        for r in rows:
            if len(r) >= 8:
                latency[r[0]] = (r[1], [_int(r[k]) for k in (2, 3, 6, 7)])
    resources: dict[str, tuple[str, dict[str, int]]] = {}
    if util >= 0:
        cols, rows = _instance_table(lines, util, end if end >= 0 else len(lines))
        for r in rows:
            res = {}
            for i, name in enumerate(cols):
                canon = _RESOURCE_ALIASES.get(name.strip())
                if canon and i < len(r):
                    v = 0 if r[i].strip() == "-" else _cell_int(r[i])
                    if v is not None:
                        res[canon] = v
            resources[r[0]] = (r[1], res)
    out: dict[str, InstanceReport] = {}
    for name in [*latency, *(n for n in resources if n not in latency)]:
        module, lat = latency.get(name, (resources[name][0], [None] * 4))
        out[name] = InstanceReport(name, module, *lat, resources=resources.get(name, ("", {}))[1])
    return out


def parse_report(path: str | Path) -> SynthReport:
    """Parse a report by its suffix (``.xml`` or ``.rpt``)."""
    path = Path(path)
    if path.suffix == ".xml":
        return parse_xml(path)
    if path.suffix == ".rpt":
        return parse_rpt(path)
    raise ReportError(f"{path}: expected a .xml or .rpt C-synthesis report")


def find_report(solution_dir: str | Path, top: str | None = None) -> Path:
    """The synthesis report of a solution (``<solution>/syn/report``), XML preferred.

    Vitis HLS writes ``csynth.xml`` for the top; Vivado HLS ``<top>_csynth.xml``. Raises
    ``FileNotFoundError`` listing where it looked.
    """
    rep = Path(solution_dir) / "syn" / "report"
    names = ["csynth.xml"] + ([f"{top}_csynth.xml"] if top else []) + ["csynth.rpt"] + ([f"{top}_csynth.rpt"] if top else [])
    for n in names:
        if (rep / n).is_file():
            return rep / n
    raise FileNotFoundError(f"no C-synthesis report in {rep} (looked for {', '.join(names)})")

"""Committed synthesis baselines per target part (``kernels/baselines/<part>.json``) and the
tolerances within which a new C-synthesis measurement still passes against them.

Example::

    from offload.hls.regress.baselines import Tolerances, compare_baseline, read_baselines
    base = read_baselines("xcu55c-fsvh2892-2L-e")["entries"].get(name)
    check = compare_baseline(report.metrics(), base, Tolerances.parse("latency=0.02"))
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import offload.kernels
from offload.hls.regress.report import Check

__all__ = ["Tolerances", "compare_baseline", "baselines_dir", "read_baselines", "write_baselines"]


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

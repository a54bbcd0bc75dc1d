"""What a regression run found: one :class:`Check` per stage of an entry, the entry's result,
the run's report as JSON and markdown, and the bit-exact comparison every output stage uses.

Example::

    from offload.hls.regress.report import compare_outputs
    check = compare_outputs(device.run(handle, golden.inputs), golden.outputs)
    assert check.status == "pass", check.detail
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["FAILING", "Check", "EntryResult", "RegressReport", "compare_outputs"]

FAILING = ("fail", "error", "regression")
STAGES = ("golden", "sim", "csim", "rtl", "csynth", "cosim")


@dataclass
class Check:
    """Outcome of one stage of one entry: ``pass``, ``fail``, ``error``, ``skipped``,
    ``regression``, ``improvement`` or ``no-baseline``; ``detail`` says why, ``data`` carries numbers."""

    status: str
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class EntryResult:
    """Every stage's :class:`Check` for one catalogue entry, and the seconds they took."""

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
        stages = [s for s in STAGES if any(s in r.checks for r in self.results)]
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


"""Vitis projects for a bundle: write them, C-simulate their kernels, run v++ when it is there.

``write_project`` lays out a complete Vitis project for one card of :data:`offload.hls.cards.CARDS`
(its default platform, memory banks and SLRs come from there)::

    OUT/
      README.md            what this is and how to build it on a Vitis machine
      Makefile             sw_emu / hw_emu / hw: `v++ -c` per kernel, `v++ -l` into offload.xclbin
      connectivity.cfg     nk (compute units), sp (HBM/DDR bank per argument), slr placement
      src/<top>/...        each kernel's generated C++ (HlsKind.sources)
      include/...          offload's HLS headers and hls4ml's nnet_utils (Vitis brings its own ap_types)
      project.json         the same facts, machine-readable (tops, CUs, banks, commands)

``golden_check`` C-simulates every kernel: a few generated inputs (random and adversarial:
extreme indices, empty and full bags, weight extremes) go through the sim reference and through
the generated C++ compiled with g++; any differing element is a mismatch.

Launch modes (``launch=``): ``"per_call"`` writes each kernel's top function; ``"persistent"``
its persistent top ``<top>_ring`` (:mod:`offload.hls.persistent`, the per-call top inside a
``while`` loop over a ring of requests, started once by the host); ``"both"`` writes the two, so
the one xclbin serves ``open_device(..., launch="per_call")`` and ``launch="persistent"``. The
persistent top's ring port goes to ``HOST[0]`` where the platform reaches host memory, else into
card memory (:func:`offload.hls.connectivity.ring_placement`, :func:`offload.hls.cards.ring_memory`);
its resident ports share the per-call top's banks. The loop needs no v++ or HLS flag of its own:
it is an ordinary ``ap_ctrl_hs`` top started by one ``xrt::run`` (not an auto-restarting
``ap_ctrl_chain`` top, which would need ``config_interface -s_axilite_auto_restart_counter``),
so the Makefile compiles it as any other kernel; only the connectivity differs. A kind without a
ring capacity (:mod:`offload.kernels.ring`) gets no persistent top (``"both"``: noted in
``project.json``; ``"persistent"``: refused). ``golden_check(..., launch=...)`` C-simulates the
persistent tops through their ring too (:func:`offload.hls.persistent.run_csim`). ``run_vitis`` runs the
Makefile's commands step by step (:func:`offload.hls.vitis.run_tool`), reporting progress through
callbacks, keeping each tool's log, and raising :class:`BuildError` with the tool's own ``ERROR``
lines when a step fails.

Example::

    from offload.hls.build import write_project, golden_check, run_vitis
    from offload.hls.vitis import missing_tools
    proj = write_project(bundle, "u55c", "build/u55c")
    assert all(r.mismatches == 0 for r in golden_check(bundle))
    if not missing_tools():
        run_vitis(proj, "hw")
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from offload.hls import csim, persistent
from offload.hls.cards import CARDS, LAUNCH_MODES, Card
from offload.hls.connectivity import render, ring_placement, spread
from offload.hls.ctop import load_top
from offload.hls.registry import KernelPlacement, get_hls_kind
from offload.hls.reports import ReportError, parse_report
from offload.hls.vitis import run_tool
from offload.kernels.registry import get_kind
from offload.kernels.ring import RING_CAPACITY
from offload.sim.errors import BuildError  # noqa: F401  (re-exported: defined once in the hierarchy)
from offload.sim.errors import InputError, UnsupportedError

__all__ = [
    "Project",
    "Step",
    "GoldenResult",
    "BuildError",
    "write_project",
    "golden_check",
    "golden_inputs",
    "run_vitis",
    "collect_reports",
]


TARGETS = ("sw_emu", "hw_emu", "hw")
XCLBIN = "offload.xclbin"
LAUNCH = (*LAUNCH_MODES, "both")


@dataclass(frozen=True)
class Step:
    """One tool invocation of the build, run in the project directory."""

    name: str
    argv: tuple[str, ...]
    output: str
    inputs: tuple[str, ...] = ()  # files or folders whose change makes ``output`` stale

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def up_to_date(self, root: Path) -> bool:
        """``output`` exists and is newer than every input (as ``make`` decides)."""
        out = root / self.output
        if not out.is_file() or not self.inputs:
            return False
        newest = 0.0
        for rel in self.inputs:
            p = root / rel
            if not p.exists():
                return False
            files = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
            newest = max([newest, *(f.stat().st_mtime for f in files)])
        return out.stat().st_mtime >= newest


@dataclass
class ProjectKernel:
    top: str
    kind: str
    kernels: list[str]  # bundle kernels that run on this top function
    files: list[str]  # under src/<top>/
    compute_units: list[str] = field(default_factory=list)
    slr: dict[str, str] = field(default_factory=dict)  # CU -> SLRn
    banks: dict[str, dict[str, str]] = field(default_factory=dict)  # CU -> argument -> bank
    spec: dict = field(default_factory=dict)  # spec.to_json() of the kernel this top was generated from
    launch: str = "per_call"  # "persistent": the <top>_ring loop over a ring (offload.hls.persistent)
    ring: dict = field(default_factory=dict)  # persistent: rows, slots, bytes, memory ("host"/"card") and why


@dataclass
class Project:
    """A written Vitis project (see the module doc)."""

    root: Path
    card: Card
    platform: str
    kernels: list[ProjectKernel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was left out and why (a kind without a ring capacity)

    def steps(self, target: str = "hw") -> list[Step]:
        """The tool invocations ``make <target>`` performs, in order."""
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        out = f"build/{target}"
        common = ("-t", target, "--platform", self.platform, "--save-temps", "--temp_dir", f"{out}/_x")
        steps = []
        xos = []
        for pk in self.kernels:
            cpps = [f"src/{pk.top}/{f}" for f in pk.files if f.endswith((".cpp", ".cc", ".cxx"))]
            xo = f"{out}/{pk.top}.xo"
            xos.append(xo)
            argv = ("v++", "-c", *common, "-k", pk.top, "-I", "include", "-I", f"src/{pk.top}", "-o", xo, *cpps)
            steps.append(Step(f"compile {pk.top}", argv, xo, (f"src/{pk.top}", "include")))
        xclbin = f"{out}/{XCLBIN}"
        steps.append(Step("link", ("v++", "-l", *common, "--config", "connectivity.cfg", "-o", xclbin, *xos), xclbin, ("connectivity.cfg", *xos)))
        return steps

    @property
    def compute_units(self) -> dict[str, list[str]]:
        return {pk.top: list(pk.compute_units) for pk in self.kernels}


def _resolve_card(target: str, platform: str | None) -> tuple[Card, str]:
    card = CARDS.get(target.lower())
    if card is None:
        raise ValueError(f"target: unknown card {target!r}; known: {sorted(CARDS)}")
    return card, platform or card.platform


def _placement(card: Card, hk: Any, spec: Any, n_cus: int, given: KernelPlacement | None = None) -> KernelPlacement | None:
    """``given`` or else the kind's own placement, checked to cover every pointer argument of every CU; None when there is neither."""
    if given is None and hk.placement is None:
        return None
    kp = given if given is not None else hk.placement(spec, card, n_cus, None)
    names = {a.name for a in hk.top_args(spec) if a.role != "scalar"}
    for cu in kp.compute_units:
        if set(kp.banks.get(cu, {})) != names or cu not in kp.slr:
            raise BuildError(f"the {hk.name} kind's placement of {cu} gives banks for {sorted(kp.banks.get(cu, {}))} "
                             f"and SLR {kp.slr.get(cu)}; its top function's ports are {sorted(names)}")
    return kp


def _connectivity(project: Project) -> str:
    placements = {pk.top: KernelPlacement(tuple(pk.compute_units), pk.slr, pk.banks) for pk in project.kernels}
    return "\n".join(["# Generated by offload build: compute units, memory banks and SLR placement.", *render(placements)]) + "\n"


def _makefile(project: Project) -> str:
    tops = " ".join(pk.top for pk in project.kernels)
    rules = []
    for pk in project.kernels:
        cpps = " ".join(f"src/{pk.top}/{f}" for f in pk.files if f.endswith((".cpp", ".cc", ".cxx")))
        deps = " ".join(f"src/{pk.top}/{f}" for f in pk.files)
        rules.append(
            f"$(OUT)/{pk.top}.xo: {deps}\n"
            f"\t@mkdir -p $(OUT)\n"
            f"\t$(VPP) -c $(VPP_COMMON) -k {pk.top} -I include -I src/{pk.top} -o $@ {cpps}\n"
        )
    return f"""# Generated by offload build for {project.card.name} ({project.platform}).
# make hw | hw_emu | sw_emu      (PLATFORM=... to override the platform)
PLATFORM ?= {project.platform}
TARGET ?= hw
VPP ?= v++
OUT := build/$(TARGET)
VPP_COMMON = -t $(TARGET) --platform $(PLATFORM) --save-temps --temp_dir $(OUT)/_x
KERNELS := {tops}
XOS := $(addprefix $(OUT)/,$(addsuffix .xo,$(KERNELS)))

.PHONY: all hw hw_emu sw_emu emconfig clean
all: $(OUT)/{XCLBIN}

hw hw_emu sw_emu:
\t$(MAKE) TARGET=$@ all

{chr(10).join(rules)}
$(OUT)/{XCLBIN}: $(XOS) connectivity.cfg
\t$(VPP) -l $(VPP_COMMON) --config connectivity.cfg -o $@ $(XOS)

# Emulation runs need emconfig.json next to the host program and XCL_EMULATION_MODE=$(TARGET).
emconfig:
\temconfigutil --platform $(PLATFORM) --od .

clean:
\trm -rf build _x .Xil *.log
"""


def _readme(project: Project, bundle_name: str) -> str:
    rows = "\n".join(
        f"| `{pk.top}` | {pk.kind} | {', '.join(pk.kernels)} | {len(pk.compute_units)} | "
        + "; ".join(f"{cu}: {pk.slr[cu]}, {', '.join(sorted(set(pk.banks[cu].values())))}" for cu in pk.compute_units)
        + " |"
        for pk in project.kernels
    )
    steps = "\n".join(f"    {s.command}" for s in project.steps("hw"))
    return f"""# Vitis project for bundle `{bundle_name}` on {project.card.name}

Generated by `offload build`. Platform `{project.platform}`; {project.card.memory.kind} memory.

| top function | kind | bundle kernels | CUs | placement |
|---|---|---|---|---|
{rows}

## Build (on a machine with Vitis and the platform installed)

    source /tools/Xilinx/Vitis/<version>/settings64.sh
    make hw            # or hw_emu / sw_emu; PLATFORM=<name> to override

`make hw` runs:

{steps}

{_readme_persistent(project)}Vitis brings its own `ap_int.h`/`ap_fixed.h`; `include/` holds offload's HLS headers and
hls4ml's `nnet_utils`. The kernels were C-simulated against offload's bit-exact reference
before this project was written (`offload build` fails otherwise).

## Use the result

    offload build BUNDLE --target {project.card.name} --out DIR --vitis   # records the xclbin in the bundle
    # or by hand: offload.host.bundle.record_xclbin(BUNDLE, "build/hw/{XCLBIN}", target="{project.card.name}", platform="{project.platform}", compute_units=...)

then `open_device("xrt:0").load_bundle(offload.load(BUNDLE))`.
"""


def _readme_persistent(project: Project) -> str:
    rings = [pk for pk in project.kernels if pk.launch == "persistent"]
    notes = "".join(f"- {n}\n" for n in project.notes)
    if not rings:
        return f"## Left out\n\n{notes}\n" if notes else ""
    rows = "\n".join(f"- `{pk.top}`: {pk.ring['slots']} slots of {pk.ring['rows']} rows, ring in {pk.ring['memory']} memory: {pk.ring['why']}" for pk in rings)
    host = any(pk.ring["memory"] == "host" for pk in rings)
    setup = ("Before loading the xclbin, reserve host memory for the card (XRT's host memory access):\n\n"
             "    sudo xrt-smi configure --host-mem -d <bdf> --size 1G enable     # xbutil on older XRT\n\n") if host else ""
    return f"""## Persistent tops

Each `<top>_ring` is started once by `open_device("xrt:0", launch="persistent")` and serves
requests through its ring (offload/kernels/ring.py); it needs no compiler flag of its own.

{rows}

{setup}{notes}"""


def _put(path: Path, data: str | bytes) -> None:
    """Write ``path`` only when its content changes: unchanged files keep their mtimes, so a
    rerun on a built project finds the v++ outputs up to date instead of rebuilding for hours."""
    raw = data.encode() if isinstance(data, str) else data
    if path.is_file() and path.read_bytes() == raw:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)


def _copy_headers(dest: Path) -> None:
    for p in sorted(csim.offload_include().iterdir()):
        if p.suffix in (".h", ".hpp"):
            _put(dest / p.name, p.read_bytes())
    # hls4ml's Vitis backend: the Vivado nnet_utils with the Vitis overrides on top.
    vivado = csim.nnet_utils_include() / "nnet_utils"
    vitis = vivado.parent.parent / "vitis" / "nnet_utils"
    files = {f.relative_to(vivado): f for f in vivado.rglob("*") if f.is_file()}
    if vitis.is_dir():
        files.update({f.relative_to(vitis): f for f in vitis.rglob("*") if f.is_file()})
    for rel, f in sorted(files.items()):
        _put(dest / "nnet_utils" / rel, f.read_bytes())


def _launch_modes(launch: str) -> tuple[bool, bool]:
    if launch not in LAUNCH:
        raise InputError(f"launch: {launch!r} is not one of {list(LAUNCH)}")
    return launch in ("per_call", "both"), launch in ("persistent", "both")


def write_project(bundle: Any, target: str, out: str | os.PathLike, *, platform: str | None = None, compute_units: int | Mapping[str, int] = 1,
                  launch: str = "per_call", placements: Mapping[str, KernelPlacement] | None = None, notes: tuple[str, ...] = (),
                  ring_sizes: Mapping[str, tuple[int, int]] | None = None) -> Project:
    """Write the Vitis project for ``bundle`` (a :class:`offload.host.bundle.Bundle` or anything with
    ``kernels: dict[name, Kernel]``) and card ``target`` into ``out``.

    Kernels with the same top function (same spec) share its compute units; ``compute_units``
    is a count for all tops or a mapping top -> count (a persistent top takes its per-call top's
    count unless named). ``launch``: ``"per_call"``, ``"persistent"`` or ``"both"`` (see the
    module doc). ``placements`` (top -> placement) replaces a kind's own bank placement, as a
    plan's per-card projects do (:func:`offload.plan.project.write_card_projects`); ``notes`` go
    into the project's README and ``project.json``. ``ring_sizes`` (kernel name -> ``(slots, rows)``,
    a bundle's recorded rings) sizes each persistent top's ring; unnamed kernels get the defaults.

    Example::

        proj = write_project(bundle, "u55c", "build/u55c", launch="both")
        [pk.top for pk in proj.kernels]     # ["offload_mlp_...", "offload_mlp_..._ring"]
    """
    want_call, want_ring = _launch_modes(launch)
    card, plat = _resolve_card(target, platform)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    project = Project(root, card, plat, notes=list(notes))
    rings: list[tuple[ProjectKernel, ProjectKernel, Any, int]] = []  # (ring top, its per-call top, spec, CUs)
    by_top: dict[str, ProjectKernel] = {}
    sources_of: dict[str, dict[str, str]] = {}
    spread_out: list[tuple[ProjectKernel, Any, int]] = []
    for kname, k in bundle.kernels.items():
        hk = get_hls_kind(k.kind)
        top = hk.top_name(k.spec)
        if top in by_top:
            by_top[top].kernels.append(kname)
            continue
        srcs = hk.sources(k.spec)
        n = compute_units.get(top, 1) if isinstance(compute_units, Mapping) else int(compute_units)
        if n < 1:
            raise ValueError(f"compute_units: {top} needs at least 1, got {n}")
        kp = _placement(card, hk, k.spec, n, (placements or {}).get(top))
        pk = ProjectKernel(top, k.kind, [kname], sorted(srcs), spec=k.spec.to_json())
        if kp is None:
            spread_out.append((pk, hk.top_args(k.spec), n))
        else:
            pk.compute_units, pk.slr, pk.banks = list(kp.compute_units), dict(kp.slr), {cu: dict(b) for cu, b in kp.banks.items()}
        if want_call:
            by_top[top] = pk
            sources_of[top] = srcs
        if want_ring:
            if k.kind not in RING_CAPACITY:
                why = f"kernel {kname!r}: the {k.kind} kind has no ring capacity (offload.kernels.ring.register_capacity), so no persistent top"
                if not want_call:
                    raise UnsupportedError(f"{why}; build it with launch='per_call' or 'both'")
                project.notes.append(why)
                continue
            rt = persistent.top_name(k.spec)
            slots, rows = (ring_sizes or {}).get(kname, (persistent.DEFAULT_SLOTS, persistent.DEFAULT_ROWS))
            layout = persistent.ring_layout(k.spec, rows=rows, slots=slots)
            rsrcs = persistent.sources(k.spec, layout)
            rn = compute_units.get(rt, n) if isinstance(compute_units, Mapping) else n
            rpk = ProjectKernel(rt, k.kind, [kname], sorted(rsrcs), spec=k.spec.to_json(), launch="persistent",
                                ring={"rows": rows, "slots": layout.slots, "slot_bytes": layout.slot.size, "bytes": layout.nbytes})
            rings.append((rpk, pk, k.spec, rn))
            by_top[rt] = rpk
            sources_of[rt] = rsrcs
    # Kernels without a placement of their own take the banks after those the others use.
    used = [int(m) for pk in by_top.values() for b in pk.banks.values() for v in b.values() for m in re.findall(r"\d+", v)]
    next_bank = max(used) + 1 if used and card.memory.kind == "HBM" else 0
    for i, (pk, args, n) in enumerate(spread_out):
        kp, next_bank = spread(card, pk.top, args, n, index=i, first_bank=next_bank)
        pk.compute_units, pk.slr, pk.banks = list(kp.compute_units), dict(kp.slr), {cu: dict(b) for cu, b in kp.banks.items()}
    for i, (rpk, pk, spec, rn) in enumerate(rings):
        mirror = KernelPlacement(tuple(pk.compute_units), pk.slr, pk.banks) if pk.compute_units else None
        kp, where, next_bank = ring_placement(card, rpk.top, persistent.RING_ARG, persistent.resident_args(spec), rn, mirror=mirror,
                                              platform=plat, index=i, first_bank=next_bank)
        rpk.compute_units, rpk.slr, rpk.banks = list(kp.compute_units), dict(kp.slr), {cu: dict(b) for cu, b in kp.banks.items()}
        rpk.ring.update(memory="host" if where.host else "card", why=where.why)
    project.kernels = list(by_top.values())
    for top, srcs in sources_of.items():
        d = root / "src" / top
        d.mkdir(parents=True, exist_ok=True)
        for name, text in srcs.items():
            _put(d / name, text)
    _copy_headers(root / "include")
    _put(root / "connectivity.cfg", _connectivity(project))
    _put(root / "Makefile", _makefile(project))
    _put(root / "README.md", _readme(project, getattr(bundle, "name", "bundle")))
    _put(root / "project.json",
        json.dumps(
            {
                "card": card.name,
                "platform": plat,
                "kernels": [asdict(pk) for pk in project.kernels],
                "notes": project.notes,
                "steps": {t: [s.command for s in project.steps(t)] for t in TARGETS},
            },
            indent=2,
        )
        + "\n"
    )
    return project


# ------------------------------------------------------------------------------ golden C-simulation

def golden_inputs(spec: Any, rng: np.random.Generator, case: int) -> dict[str, np.ndarray]:
    """Inputs for golden case ``case`` of a kernel with ``spec``: its kind's ``golden_inputs``."""
    return get_kind(spec.kind).golden_inputs(spec, rng, case)


@dataclass(frozen=True)
class GoldenResult:
    """One kernel's C-simulation against the reference: cases run, elements compared, mismatches."""

    kernel: str
    top: str
    cases: int
    compared: int
    mismatches: int
    first: str | None = None  # where the first mismatch is, for the error message


def _run_top(kernel: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    hk = get_hls_kind(kernel.kind)
    top = load_top(kernel.spec)
    resident = hk.pack_resident(kernel.spec, kernel.tensors)
    packed = hk.pack_inputs(kernel.spec, inputs)
    values, outs = [], {}
    for a in top.args:
        if a.role == "resident":
            values.append(np.ascontiguousarray(resident[a.name], dtype=a.dtype))
        elif a.role == "scalar":
            values.append(packed[a.name])
        else:
            arr = np.array(packed[a.name], dtype=a.dtype, copy=True, order="C")
            values.append(arr)
            if a.role == "output":
                outs[a.name] = arr
    top(values)
    return hk.unpack_outputs(kernel.spec, inputs, outs)


def golden_check(bundle: Any, *, cases: int = 3, seed: int = 0, launch: str = "per_call") -> list[GoldenResult]:
    """C-simulate every kernel of ``bundle`` (generated C++, g++) against its sim reference; with
    ``launch`` ``"persistent"`` or ``"both"`` also each persistent top, all cases through one ring
    (one result per top, the persistent one named ``<top>_ring``)."""
    want_call, want_ring = _launch_modes(launch)
    results = []
    for ki, (kname, k) in enumerate(bundle.kernels.items()):
        rng = np.random.default_rng([seed, ki])
        inputs = [golden_inputs(k.spec, rng, c) for c in range(cases)]
        for i in inputs:
            get_kind(k.kind).validate(k.spec, k.tensors, i)
        if want_call:
            results.append(_compare(kname, get_hls_kind(k.kind).top_name(k.spec), k, inputs, [_run_top(k, i) for i in inputs]))
        if want_ring and k.kind in RING_CAPACITY:
            results.append(_compare(kname, persistent.top_name(k.spec), k, inputs, persistent.run_csim(k, inputs)))
    return results


def _compare(kname: str, top: str, k: Any, inputs: list, outputs: list) -> GoldenResult:
    kind = get_kind(k.kind)
    compared = mismatches = 0
    first = None
    for c, (inputs_c, got) in enumerate(zip(inputs, outputs)):
        want = kind.reference(k.spec, k.tensors, inputs_c)
        for name, w in want.items():
            g = got.get(name)
            w = np.asarray(w)
            if g is None or np.shape(g) != w.shape:
                mismatches += w.size
                first = first or f"case {c}: output {name!r} has shape {None if g is None else np.shape(g)}, expected {w.shape}"
                continue
            bad = np.asarray(g) != w
            compared += w.size
            if bad.any():
                mismatches += int(bad.sum())
                if first is None:
                    i = tuple(int(x) for x in np.argwhere(bad)[0])
                    first = f"case {c}: {name}{list(i)} = {np.asarray(g)[i]}, reference {w[i]}"
    return GoldenResult(kname, top, len(inputs), compared, mismatches, first)


# ------------------------------------------------------------------------------ running Vitis


def run_vitis(
    project: Project,
    target: str = "hw",
    *,
    on_step: Callable[[int, int, Step], None] | None = None,
    on_line: Callable[[Step, str], None] | None = None,
) -> Path:
    """Run the project's steps for ``target``; returns the xclbin. Logs go to ``logs/<target>/``."""
    steps = project.steps(target)
    logs = project.root / "logs" / target
    (project.root / "build" / target).mkdir(parents=True, exist_ok=True)
    for i, step in enumerate(steps):
        if on_step:
            on_step(i, len(steps), step)
        if step.up_to_date(project.root):  # e.g. `make hw` already ran on this machine
            if on_line:
                on_line(step, f"{step.output} is up to date")
            continue
        log = logs / (re.sub(r"[^A-Za-z0-9_.-]+", "_", step.name) + ".log")
        try:
            run = run_tool(step.argv, project.root, log, on_line=(lambda line, step=step: on_line(step, line)) if on_line else None)
        except FileNotFoundError as e:
            raise BuildError(f"{step.name}: {step.argv[0]} is not on PATH ({e})") from None
        if run.returncode != 0:
            shown = "\n".join(f"  {e}" for e in run.errors[:20]) or "  (the tool printed no ERROR line; see the log)"
            raise BuildError(f"{step.name} failed (exit {run.returncode}): {step.command}\n{shown}\nfull log: {log}")
        if not (project.root / step.output).exists():
            raise BuildError(f"{step.name}: {step.argv[0]} exited 0 but did not write {step.output}; see {log}")
    return project.root / steps[-1].output


def collect_reports(project: Project, target: str = "hw") -> dict[str, dict]:
    """Parsed C-synthesis summaries per top function found under the build's temp dir (may be empty)."""
    found: dict[str, dict] = {}
    base = project.root / "build" / target / "_x"
    for pk in project.kernels:
        for pat in ("csynth.xml", f"{pk.top}_csynth.xml", "csynth.rpt", f"{pk.top}_csynth.rpt"):
            hits = [p for p in base.rglob(pat) if pk.top in p.parts]
            if hits:
                try:
                    found[pk.top] = {"report": str(hits[0]), **parse_report(hits[0]).to_json()}
                except (ReportError, OSError) as e:
                    found[pk.top] = {"report": str(hits[0]), "error": str(e)}
                break
    return found

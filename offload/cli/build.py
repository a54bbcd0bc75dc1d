"""``offload build``, ``offload info`` and ``offload devices``: bundles to Vitis projects, what a
bundle holds, and which devices this host can open (and why not)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import click

from offload.hls.cards import CARDS
from offload.sim.errors import UnsupportedError

__all__ = ["build_cmd", "info_cmd", "devices_cmd"]

# rich, offload.hls.build and offload.host.bundle are imported inside the commands that use them:
# every `offload ...` start-up imports this module, and those three add 0.07-0.18 s to the
# 0.37-0.67 s that `import offload.cli` takes (measured: time.perf_counter around the imports,
# 7 runs, 2 shared cores), which `offload --help` or `offload devices --json` would pay for nothing.


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _printable(text: object) -> str:
    """``text`` with control and other unprintable characters escaped as Python writes them.

    Names in a bundle come from whoever wrote it: an ESC sequence printed raw could rewrite the
    terminal (hide a line, fake a status); printed escaped, it shows for what it is.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def load_bundle(path: str, **checks: Any):
    """``offload.host.bundle.load(path, **checks)`` for a command: a refusal is one line, escaped."""
    from offload.host.bundle import BundleError, load

    try:
        return load(path, **checks)
    except BundleError as e:
        raise click.ClickException(_printable(e)) from None


@click.command("build")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--target", type=click.Choice(tuple(CARDS)), help="Alveo card (required without --plan; with it, each card's type is the plan's).")
@click.option("--platform", default=None, help="Platform name (default: the card's usual platform).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Directory for the Vitis project.")
@click.option("--vitis", is_flag=True, help="Run v++ (compile, link) when it is on PATH; record the xclbin in the bundle.")
@click.option("--vitis-target", type=click.Choice(["sw_emu", "hw_emu", "hw"]), default="hw", show_default=True)
@click.option("--cus", type=click.IntRange(1, 16), default=1, show_default=True, help="Compute units per kernel.")
@click.option("--cases", type=click.IntRange(1, 100), default=3, show_default=True, help="Golden C-simulation cases per kernel.")
@click.option("--launch", type=click.Choice(["per_call", "persistent", "both"]), default="both", show_default=True,
              help="Tops in the xclbin: per-call, the persistent <top>_ring loops (open_device(..., launch='persistent')), or both.")
@click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False),
              help="A placement plan (offload.plan, Plan.to_json) for BUNDLE's embedding tables: one project per card, "
                   "OUT/h<host>c<card>, each with the card's shards of BUNDLE's tables (a plan holds no weights) "
                   "and the plan's banks in its connectivity; other kernels go to card (0, 0). Per-call tops only; no --vitis.")
def build_cmd(bundle: str, target: str | None, platform: str | None, out: str, vitis: bool, vitis_target: str, cus: int, cases: int, launch: str,
              plan_path: str | None) -> None:
    """Write a Vitis project for BUNDLE, C-simulate its kernels, optionally run v++.

    \b
    offload build model.offload --target u55c --out build/u55c
    offload build model.offload --target u55c --out build/u55c --vitis
    offload build model.offload --target u55c --out build/u55c --launch per_call
    offload build model.offload --plan plan.json --out build/plan      # one project per card
    """
    from rich.markup import escape
    from rich.table import Table

    from offload.hls import build as hb
    from offload.hls.vitis import missing_tools

    con = _console()
    b = load_bundle(bundle)
    if plan_path is not None:
        ctx = click.get_current_context()
        given = [f"--{n.replace('_', '-')}" for n in ("target", "platform", "cus", "launch", "vitis_target")
                 if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT]
        if given:  # the plan names each card's type; its projects hold per-call tops, one unit each
            raise click.UsageError(f"--plan: {', '.join(given)} cannot be used with it (each card's type and units come from the plan)")
        _build_plan(con, b, plan_path, out, cases, vitis)
        return
    if target is None:
        raise click.UsageError("--target is required (or --plan, whose cards name their type)")
    try:
        project = hb.write_project(b, target, out, platform=platform, compute_units=cus, launch=launch,
                                   ring_sizes={k: (r.slots, r.rows) for k, r in b.rings.items()})
    except UnsupportedError as e:
        raise click.ClickException(_printable(e)) from None
    con.print(f"[bold]Vitis project[/] for [cyan]{escape(_printable(b.name))}[/] on {project.card.name} ({project.platform}): {escape(str(project.root))}", soft_wrap=True)
    for pk in project.kernels:
        if pk.launch == "persistent":
            con.print(_printable(f"persistent top {pk.top}: ring in {pk.ring['memory']} memory ({pk.ring['why']})"), markup=False, soft_wrap=True)
    for note in project.notes:
        con.print(_printable(f"left out: {note}"), markup=False, soft_wrap=True)

    with con.status("C-simulating kernels against the reference (g++)..."):
        try:
            results = hb.golden_check(b, cases=cases, launch=launch)
        except Exception as e:  # a build error of the generated C++ is the answer here
            raise click.ClickException(f"C-simulation failed: {e}") from None
    t = Table(title="C-simulation vs reference")
    for col in ("kernel", "top function", "cases", "elements", "mismatches"):
        t.add_column(col, overflow="fold")
    for r in results:
        t.add_row(r.kernel, r.top, str(r.cases), str(r.compared), ("[green]0" if r.mismatches == 0 else f"[red]{r.mismatches}"))
    con.print(t)
    bad = [r for r in results if r.mismatches]
    if bad:
        raise click.ClickException("C-simulation mismatches: " + "; ".join(f"{r.kernel}: {r.mismatches} ({r.first})" for r in bad))

    steps = project.steps(vitis_target)
    if not vitis:
        _print_left(con, project, steps, vitis_target, "Not run (no --vitis).")
        return
    missing = missing_tools()
    if missing:
        _print_left(con, project, steps, vitis_target, f"{', '.join(missing)} not found on PATH: the Vitis steps cannot run on this machine.")
        raise click.ClickException(f"--vitis: {', '.join(missing)} not on PATH (source Vitis' settings64.sh); the project is written, the steps above are left")

    xclbin = _run_steps(con, hb, project, vitis_target)
    reports = hb.collect_reports(project, vitis_target)
    (project.root / f"reports_{vitis_target}.json").write_text(json.dumps(reports, indent=2) + "\n")
    if reports:
        rt = Table(title="C-synthesis estimates")
        for col in ("top function", "latency (cycles)", "II", "LUT", "FF", "DSP", "BRAM_18K", "URAM"):
            rt.add_column(col, overflow="fold")
        for top, r in reports.items():
            res = r.get("resources", {}) or {}
            rt.add_row(top, str(r.get("latency_max", "")), str(r.get("interval_min", "")), *(str(res.get(k, "")) for k in ("LUT", "FF", "DSP", "BRAM_18K", "URAM")))
        con.print(rt)
    con.print(f"[green]xclbin[/] {escape(str(xclbin))}", soft_wrap=True)
    if vitis_target == "hw":
        from offload.host.bundle import record_xclbin

        from offload.hls import persistent

        # The rings the persistent tops were compiled for, so a host opens each at that size.
        built = {pk.top: {"slots": pk.ring["slots"], "rows": pk.ring["rows"]} for pk in project.kernels if pk.launch == "persistent"}
        rings = {kname: built[persistent.top_name(k.spec)] for kname, k in b.kernels.items() if persistent.top_name(k.spec) in built}
        nb = record_xclbin(bundle, xclbin, target=project.card.name, platform=project.platform, compute_units=project.compute_units, rings=rings)
        con.print(f"recorded in bundle {bundle}: UUID {nb.xclbin_uuid}", markup=False, soft_wrap=True)
    else:
        con.print(f"{vitis_target} xclbin: run with XCL_EMULATION_MODE={vitis_target} after `make emconfig` (not recorded in the bundle)", markup=False, soft_wrap=True)


def _build_plan(con, b, plan_path: str, out: str, cases: int, vitis: bool) -> None:
    """``--plan``: one project per card of the plan, each C-simulated."""
    from offload.hls import build as hb
    from offload.plan.plan import Plan
    from offload.plan.project import write_card_projects
    from offload.sim.errors import OffloadError

    if vitis:
        raise click.UsageError("--plan writes one project per card; run `make hw` in each (no --vitis)")
    try:
        projects = write_card_projects(b, Plan.from_json(plan_path), out)
    except OffloadError as e:
        raise click.ClickException(_printable(e)) from None
    bad = []
    for card, cp in projects.items():
        project = cp.project
        con.print(_printable(f"card h{card[0]}c{card[1]} ({project.card.name}): {project.root}"), markup=False, soft_wrap=True)
        for pk in project.kernels:
            banks = sorted({v for cu in pk.compute_units for v in pk.banks[cu].values()})
            con.print(_printable(f"  {pk.top}: {', '.join(pk.kernels)} in {', '.join(banks)}"), markup=False, soft_wrap=True)
        for note in project.notes:
            con.print(_printable(f"  left out: {note}"), markup=False, soft_wrap=True)
        try:
            results = hb.golden_check(cp, cases=cases)
        except Exception as e:  # a build error of the generated C++ is the answer here
            raise click.ClickException(f"C-simulation of card h{card[0]}c{card[1]} failed: {e}") from None
        mism = sum(r.mismatches for r in results)
        con.print(f"  C-simulation: {len(results)} kernel(s), {sum(r.compared for r in results)} elements, {mism} mismatches",
                  markup=False, soft_wrap=True)
        bad += [f"h{card[0]}c{card[1]} {r.kernel}: {r.mismatches} ({r.first})" for r in results if r.mismatches]
    if bad:
        raise click.ClickException("C-simulation mismatches: " + "; ".join(bad))


def _print_left(con, project, steps, vitis_target: str, why: str) -> None:
    # soft_wrap: commands are printed whole, to be copied as they are.
    con.print(f"\n[yellow]{why}[/] Steps left, to run on a machine with Vitis and the platform installed:", soft_wrap=True)
    con.print(f"  cd {project.root} && make {vitis_target}", markup=False, soft_wrap=True)
    con.print("which runs:")
    for s in steps:
        con.print(f"  {s.command}", markup=False, soft_wrap=True)
    con.print(f"then record the xclbin: offload build BUNDLE --target {project.card.name} --out {project.root} --vitis", markup=False, soft_wrap=True)


def _run_steps(con, hb, project, vitis_target: str) -> Path:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=con) as prog:
        task = prog.add_task("v++", total=len(project.steps(vitis_target)))

        def on_step(i: int, n: int, step) -> None:
            prog.update(task, completed=i, description=step.name)

        def on_line(step, line: str) -> None:
            if line.strip():
                prog.update(task, description=f"{step.name}: {line.strip()[:70]}")

        try:
            xclbin = hb.run_vitis(project, vitis_target, on_step=on_step, on_line=on_line)
        except hb.BuildError as e:
            prog.stop()
            raise click.ClickException(str(e)) from None
        prog.update(task, completed=len(project.steps(vitis_target)), description="done")
    return xclbin


# ------------------------------------------------------------------------------------------ info

_FORMAT = re.compile(r"ap_u?fixed<[^>]*>|ap_u?int<\d+>|int8_rowwise|float32|float16|bfloat16")


def _formats(spec_json: Any) -> list[str]:
    seen: list[str] = []
    for m in _FORMAT.findall(json.dumps(spec_json)):
        if m not in seen:
            seen.append(m)
    return seen


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@click.command("info")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of tables.")
@click.option("--require-sealed", is_flag=True, help="Refuse a bundle without a manifest digest (format version 1).")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Require a signature by this Ed25519 public key (PEM); repeat for several.")
def info_cmd(bundle: str, as_json: bool, require_sealed: bool, trusted_keys: tuple[str, ...]) -> None:
    """What BUNDLE holds: kernels (kind, formats, tensors, sizes), xclbin, target card, signature.

    The bundle is loaded by the same function, with the same checks, as ``offload serve`` and a
    device load use (schema, spec schemas, sizes, checksums, the manifest's digest, the
    signature, each kind's tensor checks), so a bundle that passes here is one a device accepts.
    """
    from rich.table import Table

    from offload.host.bundle import UnsealedBundleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsealedBundleWarning)  # info says "not sealed" itself, below
        b = load_bundle(bundle, require_sealed=require_sealed, trusted_keys=list(trusted_keys) or None)
    rows = []
    for name, k in b.kernels.items():
        spec = k.spec.to_json()
        nbytes = int(sum(v.nbytes for v in k.tensors.values()))
        rows.append(
            {
                "kernel": name,
                "kind": k.kind,
                "formats": _formats(spec),
                "tensors": {t: {"shape": list(v.shape), "dtype": str(v.dtype)} for t, v in k.tensors.items()},
                "bytes": nbytes,
            }
        )
    summary = {
        "name": b.name,
        "path": str(b.path),
        "manifest_sha256": b.manifest_sha256,
        "signature": None if b.signature_key is None else {"key_sha256": b.signature_key, "verified": b.signature_verified},
        "meta": b.meta,
        "kernels": rows,
        "xclbin": None if b.xclbin is None else {"file": str(b.xclbin), "uuid": b.xclbin_uuid, "target": b.target, "platform": b.platform, "compute_units": b.compute_units},
        "launch": _bundle_launch(b),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    from rich.markup import escape

    con = _console()
    con.print(f"[bold]{escape(_printable(b.name))}[/]  {escape(_printable(b.path))}")
    if b.manifest_sha256:
        con.print(f"manifest: intact (sha256 {b.manifest_sha256})", markup=False, soft_wrap=True)
    else:
        con.print("manifest: not sealed (format version 1, written before manifest digests); re-save it to add one", markup=False, soft_wrap=True)
    if b.signature_key is None:
        con.print("signature: none (sign it with `offload sign BUNDLE --key KEY.pem`)", markup=False, soft_wrap=True)
    elif b.signature_verified:
        con.print(f"signature: verified, ed25519 key sha256 {b.signature_key}", markup=False, soft_wrap=True)
    else:
        con.print(f"signature: by ed25519 key sha256 {b.signature_key}, not verified (give --trusted-key)", markup=False, soft_wrap=True)
    if b.meta:
        con.print(_printable("meta: " + ", ".join(f"{k}={v}" for k, v in b.meta.items())), markup=False)
    t = Table(title="kernels")
    for col in ("kernel", "kind", "formats", "tensors", "size", "target"):
        t.add_column(col, overflow="fold")
    for r in rows:
        tens = ", ".join(f"{n} {tuple(d['shape'])} {d['dtype']}" for n, d in r["tensors"].items())
        cells = (r["kernel"], r["kind"], ", ".join(r["formats"]) or "-", tens, _size(r["bytes"]), b.target or "- (no xclbin)")
        t.add_row(*(escape(_printable(c)) for c in cells))
    con.print(t)
    if b.xclbin is not None:
        cus = "; ".join(f"{top}: {len(v)} CU" for top, v in b.compute_units.items()) or "-"
        con.print(_printable(f"xclbin {b.xclbin}  UUID {b.xclbin_uuid}  target {b.target} ({b.platform})  {cus}"), markup=False, soft_wrap=True)
    else:
        con.print("no xclbin: runs on sim and emu; build one with `offload build BUNDLE --target CARD --out DIR --vitis`", markup=False, soft_wrap=True)
    for where, lm in summary["launch"].items():
        con.print(_printable(f"launch modes on {where}: {', '.join(lm['modes']) or 'none'} ({lm['why']})"), markup=False, soft_wrap=True)


def _backend_modes(name: str) -> tuple[str, ...]:
    from offload.host.device import launch_modes

    return launch_modes(name)


def _bundle_launch(b) -> dict[str, dict]:
    """Which launch modes this bundle offers where: on the card, from the tops its xclbin holds
    (per call: every kernel's top; persistent: every kernel's ``<top>_ring``); on the C++
    emulation and the simulator, from what those backends take."""
    out: dict[str, dict] = {}
    if b.xclbin is not None:
        missing_call, missing_ring = b.xclbin_lacks("per_call"), b.xclbin_lacks("persistent")
        if missing_call is None:  # the bundle does not record what its xclbin holds
            out[f"card ({b.target})"] = {"modes": ["per_call", "persistent"],
                                         "why": "the bundle records no compute units: the card tells which tops its xclbin holds"}
        else:
            modes = [m for m, missing in (("per_call", missing_call), ("persistent", missing_ring)) if not missing]
            why = ["per_call: the xclbin holds every kernel's top" if not missing_call else f"no per_call: the xclbin lacks {', '.join(missing_call)}",
                   "persistent: the xclbin holds every <top>_ring loop" if not missing_ring
                   else f"no persistent: the xclbin lacks {', '.join(missing_ring)} (rebuild with `offload build --launch both`)"]
            out[f"card ({b.target})"] = {"modes": modes, "why": "; ".join(why)}
    for backend in ("emu", "sim"):
        try:
            modes = list(_backend_modes(backend))
        except KeyError:
            continue
        out[backend] = {"modes": modes, "why": f"what the {backend} backend takes"}
    return out


# --------------------------------------------------------------------------------------- devices

@click.command("devices")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def devices_cmd(as_json: bool) -> None:
    """Which devices this host can open, and why the others are not available (each backend's probe)."""
    from rich.table import Table

    from offload.host.device import probe_devices

    # launch_modes: what each backend takes (open_device(spec, launch=...)); whether this host can
    # use them is in "why" (xrt: what its pyxrt binds).
    found = [{**p.to_json(), "launch_modes": list(_backend_modes(p.backend))} for p in probe_devices()]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    from rich.markup import escape

    t = Table(title="offload devices")
    for col in ("backend", "status", "devices", "launch modes", "details"):
        t.add_column(col, overflow="fold")
    for f in found:
        t.add_row(f["backend"], "[green]available" if f["available"] else "[red]unavailable", escape("\n".join(f["devices"]) or "-"),
                  ", ".join(f["launch_modes"]), escape(f["why"]))
    _console().print(t)

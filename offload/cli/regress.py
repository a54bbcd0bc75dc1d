"""``offload regress``: the HLS kernel regression suite (golden vectors, C-simulation, synthesis baselines).

The work is done by :mod:`offload.hls.regress`; this module is the command line around it:
selection, the rich progress display, the summary table, JSON/markdown reports and the exit status.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from offload.hls import regress as R


def _report_paths(path: str) -> tuple[Path, Path]:
    p = Path(path)
    if p.is_dir() or path.endswith(("/", "\\")):
        return p / "regress.json", p / "regress.md"
    if p.suffix in (".json", ".md"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".json"), p.with_name(p.name + ".md")


def _style(status: str) -> str:
    return {"pass": "green", "improvement": "cyan", "skipped": "yellow", "no-baseline": "yellow"}.get(status, "bold red")


@click.command("regress")
@click.option("--kernel", "-k", "patterns", multiple=True, metavar="PATTERN",
              help="Catalogue entries to run: a glob (emb/sum/*) or a name prefix (mlp/); repeatable. Default: all.")
@click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(min=1), help="Entries checked in parallel.")
@click.option("--csynth", is_flag=True, help="Also run Vitis HLS C-synthesis and compare with the part's baselines.")
@click.option("--cosim", is_flag=True, help="Also run C/RTL co-simulation with the golden vectors (needs vitis-run or vitis_hls).")
@click.option("--rtl", is_flag=True, help="Also build each MLP entry to Verilog (da4ml) and check it bit for bit under Verilator (cached).")
@click.option("--part", default=R.DEFAULT_PART, show_default=True, help="Target part for --csynth/--cosim and its baselines.")
@click.option("--clock", "clock_ns", default=R.DEFAULT_CLOCK_NS, show_default=True, type=float, help="Clock period in ns.")
@click.option("--tolerance", default="", metavar="K=V,...",
              help="Allowed growth over the baseline, relative: latency=0.05,resources=0.10,clock=0.05 (the defaults).")
@click.option("--report", "report", default=None, metavar="PATH", help="Write PATH.json and PATH.md (or regress.json/.md in a directory).")
@click.option("--regenerate", is_flag=True, help="Rewrite the golden vectors from the catalogue's fixed seeds and print what changed.")
@click.option("--reason", default=None, metavar="TEXT", help="With --regenerate: why changed reference outputs are right (without it they are refused).")
@click.option("--update-baselines", is_flag=True, help="With --csynth: record the measured metrics as the part's baselines.")
@click.option("--device", default="emu", show_default=True, help="Device that runs the C-simulation ('none' to skip it).")
@click.option("--golden-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Golden vectors to use (default: the packaged kernels/golden, or $OFFLOAD_GOLDEN_DIR).")
@click.option("--baselines-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Baselines to use (default: kernels/baselines).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("build/regress"), show_default=True,
              help="Where Vitis HLS projects are written.")
@click.option("--list", "list_only", is_flag=True, help="List the selected entries and exit.")
def regress(patterns, jobs, csynth, cosim, rtl, part, clock_ns, tolerance, report, regenerate, reason, update_baselines, device,
            golden_dir, baselines_dir, workdir, list_only) -> None:
    """Check every kernel configuration of the catalogue against its golden vectors.

    Each entry's HLS C++ is C-simulated (g++, cached builds) and must reproduce the golden raw
    outputs bit for bit, as must the NumPy reference. Exit status 1 on any mismatch, error or
    synthesis regression.

    \b
    Examples:
      offload regress -j 2
      offload regress --kernel 'emb/mean/*' --report out/regress
      offload regress --csynth --part xcu55c-fsvh2892-2L-e --tolerance latency=0.02
      offload regress --regenerate --kernel mlp/
      offload regress --rtl --kernel mlp/
    """
    from rich.console import Console

    from offload.kernels.catalogue import entries

    console = Console(stderr=False, highlight=False)
    try:
        tol = R.Tolerances.parse(tolerance)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--tolerance") from None
    sel = entries(list(patterns) or None)
    if not sel:
        raise click.BadParameter(f"no catalogue entry matches {list(patterns)} (see `offload regress --list`)", param_hint="--kernel")
    if list_only:
        for e in sel:
            click.echo(f"{e.name}\t{e.kind}\tseed={e.seed}")
        return
    if update_baselines and not csynth:
        raise click.UsageError("--update-baselines needs --csynth")

    dev = None
    if device != "none":
        from offload.host import open_device

        dev = open_device(device)
    try:
        if regenerate:
            _regenerate(console, sel, dev, golden_dir, jobs, prune=not patterns, reason=reason)
            return
        if (csynth or cosim) and R.vitis_hls() is None:
            console.print("[yellow]neither vitis-run nor vitis_hls is on PATH: --csynth/--cosim stages are skipped "
                          "(source Vitis's settings64.sh or set VITIS_HLS).[/yellow]")
        rep = _run(console, sel, dev, jobs=jobs, golden_root=golden_dir, csynth=csynth, cosim=cosim, part=part, clock_ns=clock_ns,
                   baselines_root=baselines_dir, tolerances=tol, update_baselines=update_baselines, workdir=workdir, rtl=rtl)
    finally:
        if dev is not None:
            dev.close()
    rep.settings["kernel"] = list(patterns)
    _summary(console, rep)
    if report:
        jpath, mpath = _report_paths(report)
        jpath.parent.mkdir(parents=True, exist_ok=True)
        jpath.write_text(json.dumps(rep.to_json(), indent=1) + "\n")
        mpath.write_text(rep.to_markdown())
        console.print(f"reports: {jpath} {mpath}")
    if not rep.ok:
        sys.exit(1)


def _run(console, sel, dev, **kw) -> "R.RegressReport":
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]regress"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True) as prog:
        task = prog.add_task("", total=len(sel))

        def done(r: R.EntryResult) -> None:
            prog.advance(task)
            prog.update(task, description=r.name)
            if not r.ok:
                prog.console.print(f"[bold red]{r.status.upper()}[/] {r.name}: " + "; ".join(r.problems()))

        return R.run_regression(sel, device=dev, on_result=done, **kw)


def _summary(console, rep: "R.RegressReport") -> None:
    from rich.table import Table

    stages = [s for s in ("golden", "sim", "csim", "rtl", "csynth", "cosim") if any(s in r.checks for r in rep.results)]
    t = Table(title="offload regress", show_lines=False)
    t.add_column("entry", overflow="fold")
    t.add_column("kind")
    for s in stages:
        t.add_column(s)
    t.add_column("s", justify="right")
    for r in rep.results:
        cells = []
        for s in stages:
            c = r.checks.get(s)
            cells.append("" if c is None else f"[{_style(c.status)}]{c.status}[/]")
        t.add_row(r.name, r.kind, *cells, f"{r.seconds:.2f}")
    console.print(t)
    for r in rep.results:
        c = r.checks.get("csynth")
        if c is not None and c.status in ("regression", "improvement"):
            console.print(f"[{_style(c.status)}]{c.status}[/] {r.name}: {c.detail}")
    counts = ", ".join(f"{n} {k}" for k, n in sorted(rep.counts().items()))
    verdict = "[bold green]PASS[/]" if rep.ok else "[bold red]FAIL[/]"
    console.print(f"{verdict}: {len(rep.results)} entries ({counts}) in {rep.seconds:.1f} s")
    for r in rep.results:
        if not r.ok:
            console.print(f"  [red]{r.name}[/]: " + "; ".join(r.problems()))


def _regenerate(console, sel, dev, root, jobs, *, prune: bool, reason: str | None) -> None:
    from offload.kernels.catalogue import golden_dir

    root = root or golden_dir()
    with console.status(f"regenerating {len(sel)} golden vector sets in {root} ..."):
        changes = R.regenerate(sel, device=dev, root=root, jobs=jobs, prune=prune, reason=reason)
    changed = {k: v for k, v in changes.items() if v and "refused" not in v and "error" not in v}
    for name, diff in changes.items():
        if diff:
            console.print(f"{name}: {R.describe_change(diff)}")
    console.print(f"{len(changed)} of {len(changes)} entries changed; {len(changes) - len(changed)} unchanged")
    if any("error" in v or "refused" in v for v in changes.values()):
        sys.exit(1)

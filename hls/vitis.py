"""The Vitis tools offload runs, found and started in one place: ``v++`` for a project's kernels
and link (:mod:`offload.hls.build`), Vitis HLS for a kernel's C-synthesis and co-simulation
(:mod:`offload.hls.regress`).

:func:`run_tool` starts one tool in a project directory, streams its output (stdout and stderr
together) into a log file line by line and keeps the lines that report an error, which is what
both callers show when a step fails. :func:`hls_tool` picks the HLS front end the installed
Vitis has, and :func:`synthesis_tcl` writes the script it runs.

Example::

    from offload.hls.vitis import hls_tool, run_tool, synthesis_tcl
    tool = hls_tool()                       # None without Vitis
    (work / "run.tcl").write_text(synthesis_tcl("top", ["k.cpp"], part="xcu55c-fsvh2892-2L-e", clock_ns=3.333))
    run = run_tool(tool.command("run.tcl"), work, work / "vitis_hls.out", timeout=3600)
    print(run.returncode, run.errors[-3:])
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["ToolRun", "run_tool", "missing_tools", "HlsTool", "hls_tool", "vitis_hls", "synthesis_tcl"]

# What Vitis prints when a step fails: "ERROR: [HLS 207-...]", "FATAL ...", and a compiler's "file:line: error:".
_ERROR_LINE = re.compile(r"^\s*(ERROR|FATAL)\b|\berror:", re.IGNORECASE)


@dataclass(frozen=True)
class ToolRun:
    """One finished tool run: its exit status, its error lines in order, and the log holding all its output."""

    returncode: int
    errors: tuple[str, ...]
    log: Path


def run_tool(argv: Sequence[str], cwd: str | os.PathLike, log: str | os.PathLike, *, timeout: float | None = None,
             on_line: Callable[[str], None] | None = None) -> ToolRun:
    """Run ``argv`` in ``cwd``, its output streamed into ``log`` (and to ``on_line``, one line at a time).

    ``FileNotFoundError`` when the tool is not there. Past ``timeout`` seconds the tool and every
    process it started (its own session) are killed and ``subprocess.TimeoutExpired`` is raised:
    Vitis HLS runs its compilers and simulators as children, which would keep the output open.
    """
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    expired = threading.Event()
    with open(log, "w") as lf:
        proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                start_new_session=True)

        def kill() -> None:
            expired.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill) if timeout is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lf.write(line)
                line = line.rstrip("\n")
                if _ERROR_LINE.search(line):
                    errors.append(line.strip())
                if on_line:
                    on_line(line)
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
    if expired.is_set():
        raise subprocess.TimeoutExpired(list(argv), timeout or 0.0)
    return ToolRun(rc, tuple(errors), log)


def missing_tools(tools: Sequence[str] = ("v++",)) -> list[str]:
    """The Vitis tools (of ``tools``) not on PATH; the build steps call ``v++``, which runs Vitis HLS itself."""
    return [t for t in tools if shutil.which(t) is None]


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

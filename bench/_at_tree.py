"""Runs ``offload``'s CLI from another checkout of this repository (a git worktree of an older
revision: ``bench_serve.py --base``, ``bench_serve_instr.py --base``) with this environment's
dependencies; and makes and removes such worktrees.

The editable install maps the ``offload`` packages to this checkout's folders; a meta path finder
put ahead of it maps them to the other tree's instead, as that tree's pyproject ``package-dir``
says (``offload.sim`` is ``sim/``, ...). Subpackages are then found under their parents' paths,
as usual.

    python bench/_at_tree.py TREE serve BUNDLE --port 8000
"""

from __future__ import annotations

import importlib.util
import runpy
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class TreeFinder:
    """Maps the ``offload`` packages to the folders of checkout ``tree`` (put it first on ``sys.meta_path``)."""

    def __init__(self, tree: Path) -> None:
        conf = tomllib.loads((tree / "pyproject.toml").read_text())
        self.dirs = {name: tree / d for name, d in conf["tool"]["setuptools"]["package-dir"].items()}

    def find_spec(self, name, path=None, target=None):
        d = self.dirs.get(name)
        if d is None:
            return None  # a subpackage or module: found under its parent's (mapped) path
        return importlib.util.spec_from_file_location(name, d / "__init__.py", submodule_search_locations=[str(d)])


def add_worktree(rev: str, where: Path) -> Path:
    """A detached git worktree of this repository at revision ``rev``, made in ``where``
    (returned); :func:`remove_worktree` takes it away.

    From here on, SIGTERM unwinds the process as ``SystemExit`` would, so the caller's ``finally``
    blocks and ``atexit`` hooks run. Python's default for SIGTERM (the signal ``timeout`` sends)
    ends the process without either: the worktree stayed registered, and its servers ran on.
    """
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True, capture_output=True)
    return where


def _exit_on_sigterm(signum, frame) -> None:
    sys.exit(128 + signum)


def remove_worktree(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)


def main() -> None:
    tree = Path(sys.argv[1]).resolve()
    sys.meta_path.insert(0, TreeFinder(tree))
    sys.argv = ["offload", *sys.argv[2:]]
    runpy.run_module("offload.cli", run_name="__main__")


if __name__ == "__main__":
    main()

"""``offload.nn``'s modules import each other without a cycle (issue 43, item 3): imports inside
functions count too, since deferring an import is how a cycle hides."""

from __future__ import annotations

import ast
from pathlib import Path

import offload.nn

NN = Path(offload.nn.__file__).parent


def _imports(path: Path) -> set[str]:
    """The ``offload.nn`` modules ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("offload.nn"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # from offload.nn import fbgemm
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("offload.nn"))
    return found


def test_the_nn_modules_import_each_other_without_a_cycle():
    modules = {f"offload.nn.{p.stem}": p for p in NN.glob("*.py") if p.stem != "__init__"}
    graph = {m: sorted(_imports(p) & modules.keys()) for m, p in modules.items()}
    assert "offload.nn.fbgemm" in graph["offload.nn.embedding"]  # the search sees the edges it must see
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join(path[path.index(m):] + (m,))}"
        if m in done:
            return
        for n in graph[m]:
            visit(n, path + (m,))
        done.add(m)

    for m in graph:
        visit(m, ())

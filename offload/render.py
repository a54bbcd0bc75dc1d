"""One renderer for offload's reports (partition, compare, quantization, advisor).

A report lists what it shows as rich renderables (tables, note lines); :class:`RichReport` turns
that into plain text for ``str()`` and prints it to the caller's console, so a demo or a CLI can
send every report to the one console it owns.

Example::

    print(gm.offload_report)                  # plain text, no colour codes
    gm.offload_report.print(console)          # onto the caller's rich Console
"""

from __future__ import annotations

import io
from typing import ClassVar

from rich.console import Console, RenderableType

__all__ = ["RichReport", "to_text"]


def to_text(items: list[RenderableType], width: int) -> str:
    """``items`` rendered as plain text ``width`` columns wide (no colour, no terminal codes)."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, no_color=True, color_system=None, force_terminal=False)
    for item in items:
        con.print(item)
    return buf.getvalue()


class RichReport:
    """Mixin for report dataclasses: define ``renderables()``; get ``__str__`` and ``print``."""

    text_width: ClassVar[int] = 140

    def renderables(self) -> list[RenderableType]:
        raise NotImplementedError

    def __str__(self) -> str:
        return to_text(self.renderables(), self.text_width)

    def print(self, console: Console | None = None) -> None:
        """Print the report to ``console`` (a new one on stdout if omitted)."""
        con = console or Console()
        for item in self.renderables():
            con.print(item)

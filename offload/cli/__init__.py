"""The ``offload`` command line: ``main`` assembles the subcommands, one module each."""

from offload.cli.main import main

__all__ = ["main"]

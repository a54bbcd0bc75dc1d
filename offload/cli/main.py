"""The ``offload`` command line. Each subcommand lives in a module of its own; this file assembles
the group and turns offload's own errors into one line and exit status 1. Commands that need torch
import it inside the command (torch alone costs about a second), so ``offload --help`` stays fast."""

from __future__ import annotations

import click

from offload.cli.advise import advise_cmd
from offload.cli.bench import bench_cmd
from offload.cli.build import build_cmd, devices_cmd, info_cmd
from offload.cli.example import example_cmd
from offload.cli.regress import regress
from offload.cli.serve import serve_cmd
from offload.cli.sign import sign_cmd, verify_cmd
from offload.sim.errors import OffloadError


class _Group(click.Group):
    """A group whose commands report offload's typed errors, and the file-system and network
    errors a command meets at its edges (unwritable output, nothing listening), as one line."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (OffloadError, OSError) as e:
            raise click.ClickException(_one_line(e)) from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if isinstance(e, OffloadError) else f"{type(e).__name__}: {text}"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="offload")
def main() -> None:
    """offload: PyTorch operators on Alveo FPGA cards, with a bit-exact simulator for card-free work."""


@main.command()
def demo() -> None:
    """Run the main demo (what README.md's first command runs)."""
    from offload.demo import run_demo

    run_demo()


for _cmd in (build_cmd, info_cmd, devices_cmd, regress, advise_cmd, serve_cmd, sign_cmd, verify_cmd, bench_cmd, example_cmd):
    main.add_command(_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()

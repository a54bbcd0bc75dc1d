"""The ``offload`` command line. Each subcommand lives in the module that owns it; this file only
assembles the group. Those modules keep torch imports inside their commands, so ``offload --help``
stays fast."""

from __future__ import annotations

import click

from offload.cli.advise import advise_cmd
from offload.cli.build import build_cmd, devices_cmd, info_cmd
from offload.cli.regress import regress
from offload.cli.serve import bench_cmd, example_cmd, serve_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="offload")
def main() -> None:
    """offload: PyTorch operators on Alveo FPGA cards, with a bit-exact simulator for card-free work."""


@main.command()
def demo() -> None:
    """Run the main demo (what README.md's first command runs)."""
    from offload.demo import run_demo

    run_demo()


for _cmd in (build_cmd, info_cmd, devices_cmd, regress, advise_cmd, serve_cmd, bench_cmd, example_cmd):
    main.add_command(_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()

"""The ``offload`` command line. Subcommands live in the modules that own them and are added here."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="offload")
def main() -> None:
    """offload: PyTorch operators on Alveo FPGA cards, with a bit-exact simulator for card-free work."""


@main.command()
def demo() -> None:
    """Run the main demo (what README.md's first command runs)."""
    from offload.demo import run_demo

    run_demo()


from offload._cli_regress import regress as _regress  # noqa: E402

main.add_command(_regress)

from offload.serve._cli import bench_cmd as _bench_cmd, example_cmd as _example_cmd, serve_cmd as _serve_cmd  # noqa: E402

main.add_command(_serve_cmd)
main.add_command(_bench_cmd)
main.add_command(_example_cmd)


from offload._cli_build import build_cmd as _build_cmd, devices_cmd as _devices_cmd, info_cmd as _info_cmd  # noqa: E402

main.add_command(_build_cmd)
main.add_command(_info_cmd)
main.add_command(_devices_cmd)

from offload._cli_advise import advise_cmd as _advise_cmd  # noqa: E402

main.add_command(_advise_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()

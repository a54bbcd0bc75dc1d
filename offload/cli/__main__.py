"""``python -m offload.cli``: the same command line as the ``offload`` script."""

from offload.cli.main import main

main()

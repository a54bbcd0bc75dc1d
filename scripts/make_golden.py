#!/usr/bin/env python
"""Regenerate the HLS regression golden vectors (kernels/golden/) from the catalogue's fixed seeds.

Same as ``offload regress --regenerate``: expected outputs come from the reference model, each
entry is C-simulated (emu device) and must agree bit for bit before it is written, and every
changed entry is printed with how many values differ.

    .venv/bin/python scripts/make_golden.py                 # the whole catalogue (prunes removed entries)
    .venv/bin/python scripts/make_golden.py --kernel 'emb/sum/*' -j 2
"""

import sys

from offload.cli.regress import regress

if __name__ == "__main__":
    regress.main(["--regenerate", *sys.argv[1:]], prog_name="make_golden.py")

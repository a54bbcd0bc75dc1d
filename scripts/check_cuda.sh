#!/usr/bin/env bash
# The CUDA branches of the offload ops, on a GPU machine, in a few minutes: the cuda-marked tests,
# then scripts/check_cuda.py end to end. Exits 0 with a message where there is no CUDA device.
# Needs a CUDA build of torch (scripts/setup.sh pins the CPU wheel), e.g.
#   .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "check_cuda.sh: no CUDA device visible to torch ($("$PY" -c 'import torch; print(torch.__version__)')); skipping, nothing checked"
    exit 0
fi
# -m cuda: exactly the tests that need a device; they skip themselves elsewhere.
"$PY" -m pytest -m cuda -q -p no:cacheprovider tests
"$PY" scripts/check_cuda.py

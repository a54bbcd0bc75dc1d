#!/usr/bin/env bash
# Idempotent set-up: a .venv with offload and everything its demo and tests need.
# torch is pinned so pip takes the CPU wheel instead of pulling a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[dev,serve,ray]" 2>&1 | grep -v "^WARNING: Location" || true
# The torchrec extra, then torchrec with --no-deps (see pyproject.toml: its declared deps would pull the CUDA fbgemm-gpu).
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[torchrec]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps torchrec==1.8.0 2>&1 | grep -v "^WARNING: Location" || true
# pip's exit status is lost behind the filter above; check the install is really there.
.venv/bin/python -c "import offload, torch, hls4ml, da4ml, fbgemm_gpu, torchrec; print('offload set up: torch', torch.__version__, '| hls4ml', hls4ml.__version__)"
# da4ml's solver is numba code compiled on first use (minutes on 2 cores) and cached on disk: pay
# that here, once, rather than in the first test or build that writes distributed-arithmetic firmware.
.venv/bin/python scripts/warm_da4ml.py

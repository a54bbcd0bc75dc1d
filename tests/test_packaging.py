"""The one-namespace layout: top-level layer folders import as offload.*, C++ ships as data,
and a plain wheel install works outside the source tree."""

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER_OF = {"offload.sim": "sim", "offload.kernels": "kernels", "offload.hls": "hls", "offload.host": "host"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    cfg = _pyproject()["tool"]["setuptools"]
    listed = set(cfg["packages"])
    pkg_dir = cfg["package-dir"]
    for name, folder in pkg_dir.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            dotted = ".".join((name, *rel))
            assert dotted in listed, f"{init.parent} holds a package {dotted} not listed in pyproject packages"


def test_layers_import_as_one_namespace():
    import offload.hls
    import offload.host
    import offload.kernels
    import offload.sim

    for mod, folder in [(offload.sim, "sim"), (offload.kernels, "kernels"), (offload.hls, "hls"), (offload.host, "host")]:
        assert Path(mod.__file__).parent.name == folder


def test_lower_layers_do_not_import_torch():
    code = "import sys, offload.sim, offload.kernels, offload.hls.csim, offload.host; offload.host.open_device('sim'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "False"


def test_hls_sources_are_package_data():
    from offload.hls.csim import offload_include

    assert offload_include().is_dir()
    assert any(offload_include().glob("*.h")), "hls/src holds no headers"


@pytest.mark.slow
def test_wheel_install_in_scratch_venv(tmp_path):
    wheel_dir = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheel_dir), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheel_dir.glob("offload-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "offload/sim/__init__.py" in names and "offload/host/device.py" in names
    assert any(n.startswith("offload/hls/src/") and n.endswith(".h") for n in names)
    # Data the installed package reads at run time: the MLP kernel template, golden vectors, baselines.
    assert "offload/hls/templates/mlp/kernel.cpp.tmpl" in names
    assert "offload/kernels/golden/index.json" in names and any(n.startswith("offload/kernels/golden/") and n.endswith(".npz") for n in names)
    assert any(n.startswith("offload/kernels/baselines/") and n.endswith(".json") for n in names)
    # Install the wheel into a scratch target and import it from outside the source tree; the
    # dev venv supplies numpy and hls4ml, and PYTHONPATH puts the wheel ahead of the editable install.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True, capture_output=True)
    code = (
        "import offload.sim, offload.host, offload.hls.csim as c; "
        "assert offload.sim.__file__.startswith(%r), offload.sim.__file__; "
        "print(c.offload_include())"
    ) % str(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path), check=True, env=env)
    assert str(site / "offload" / "hls" / "src") in out.stdout

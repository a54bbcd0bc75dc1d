"""The HLS regression catalogue as tests (marker ``hls``): one test per catalogue entry.

Each test loads the entry's committed golden vectors and requires the NumPy reference and the
kernel's HLS C++ (g++ C-simulation through the emu device) to reproduce the expected raw outputs
with zero mismatches. ``pytest -m hls`` runs just these; ``offload regress`` is the same check with
reports and synthesis. Builds are cached by content hash; a session fixture compiles the distinct
kernels two at a time first (g++ is a subprocess, so threads overlap), then tests only run them.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from offload.hls import regress as R
from offload.kernels import catalogue as C
from offload.sim.fixed import FixedType

ENTRIES = C.catalogue()

pytestmark = pytest.mark.hls


@pytest.fixture(scope="module")
def emu():
    from offload.host import open_device

    dev = open_device("emu")
    # Warm the build cache: load (= generate + compile) every kernel, two compiles at a time.
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda e: _try_load(dev, e), ENTRIES))
    yield dev
    dev.close()


def _try_load(dev, entry):
    try:
        dev.load(C.load_golden(entry.name).kernel())
    except Exception:  # noqa: BLE001 - the entry's own test reports it with context
        pass


@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_catalogue_entry(name, emu):
    entry = next(e for e in ENTRIES if e.name == name)
    res = R.check_entry(entry, emu)
    assert set(res.checks) == {"golden", "sim", "csim"}
    assert res.ok, "\n".join(res.problems())
    assert res.checks["csim"].data["mismatches"] and not any(res.checks["csim"].data["mismatches"].values())


def test_golden_index_matches_catalogue():
    index = C.read_index()
    assert set(index) == {e.name for e in ENTRIES}, "run `offload regress --regenerate` after changing the catalogue"
    total = sum((C.golden_dir() / m["file"]).stat().st_size for m in index.values())
    total += (C.golden_dir() / C.INDEX).stat().st_size
    assert total < 4 * 2**20, f"golden vectors take {total} bytes; keep them to a few MB"
    for name, meta in index.items():
        assert meta["file"] == C.golden_path(name).name
        assert any(k.startswith("o.") for k in meta["arrays"]), name


def test_catalogue_covers_the_generators():
    emb = [e for e in ENTRIES if e.kind == "embedding"]
    mlp = [e for e in ENTRIES if e.kind == "mlp"]
    modes = {e.name.split("/")[1] for e in emb}
    assert {"sum", "mean", "max", "none", "wsum"} <= modes
    specs = [C.load_golden(e.name).spec for e in emb]
    accs = [FixedType.parse(s["acc_type"]) for s in specs]
    # Narrow accumulators (< 20 bits) in both overflow modes, next to the overflow-free defaults.
    assert {a.overflow for a in accs if a.width < 20} >= {"AP_WRAP", "AP_SAT"}
    assert any("int8_rowwise" in json.dumps(s) for s in specs) and any("ap_ufixed" in json.dumps(s) for s in specs)
    assert any(len(s["tables"]) > 1 for s in specs)
    assert 6 <= len(mlp) <= 10
    acts = {layer["op"] for e in mlp for layer in C.load_golden(e.name).spec["layers"]}
    assert {"relu", "sigmoid", "tanh", "leaky_relu"} <= acts
    assert len({C.load_golden(e.name).spec["reuse_factor"] for e in mlp}) >= 2
    # Both Dense strategies: hls4ml's latency datapath and da4ml's distributed arithmetic.
    assert {C.load_golden(e.name).spec.get("strategy", "latency") for e in mlp} == {"latency", "distributed_arithmetic"}

"""Bundles on disk: round trips, checksums, versions, and loading/running without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import offload
from _host_util import assert_same, sa
from offload.host import open_device
from offload.host.bundle import Bundle, BundleError, load, save, xclbin_uuid
from offload.kernels import Kernel


class _Model:
    """Stands in for a torch module: anything with offload_kernels() can be saved."""

    def __init__(self, kernels):
        self._k = kernels

    def offload_kernels(self):
        return self._k


def _kernels():
    return [sa.make_kernel("emb0", n=8, scale=3, seed=1), sa.make_kernel("risk", n=4, scale=11, seed=2)]


@pytest.mark.parametrize("make", [lambda ks: ks, lambda ks: ks[0], _Model, lambda ks: Bundle("m", {k.name: k for k in ks})], ids=["list", "kernel", "module", "bundle"])
def test_round_trip_keeps_specs_and_tensors(tmp_path, make):
    ks = _kernels()
    obj = make(ks)
    p = offload.save(obj, tmp_path / "m.offload", meta={"model": "ranker", "features": 12})
    b = offload.load(p)
    want = [ks[0]] if isinstance(obj, Kernel) else ks
    assert list(b.kernels) == [k.name for k in want]
    for k in want:
        got = b.kernels[k.name]
        assert got.spec == k.spec
        for t, arr in k.tensors.items():
            assert got.tensors[t].dtype == arr.dtype
            np.testing.assert_array_equal(got.tensors[t], arr)
    assert b.meta["model"] == "ranker" and b.meta["features"] == 12
    m = json.loads((p / "manifest.json").read_text())
    assert m["format"] == "offload-bundle" and m["version"] == 2 and b.manifest_sha256 == m["manifest_sha256"]
    entry = m["kernels"][0]["tensors"]["bias"]
    assert entry["dtype"] == "<i4" and entry["shape"] == [8] and len(entry["sha256"]) == 64


def test_saved_bundle_runs_on_emu_like_sim(tmp_path):
    b = load(save(_kernels(), tmp_path / "m"))
    emu, sim = open_device("emu"), open_device("sim")
    he, hs = emu.load_bundle(b), sim.load_bundle(b)
    for name, k in b.kernels.items():
        inp = sa.make_inputs(n=k.spec.n, batch=3)
        assert_same(emu.run(he[name], inp), sim.run(hs[name], inp))
    emu.close()


def _tensor_file(p: Path) -> Path:
    return p / json.loads((p / "manifest.json").read_text())["kernels"][0]["tensors"]["bias"]["file"]


def test_missing_truncated_or_altered_files_are_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    f = _tensor_file(p)
    data = f.read_bytes()

    f.write_bytes(data[:-4])
    with pytest.raises(BundleError, match=f"{f.name} has 28 bytes.*truncated"):
        load(p)
    f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(BundleError, match=f"{f.name} does not match its sha256"):
        load(p)
    f.unlink()
    with pytest.raises(BundleError, match=f"{f.name} is missing"):
        load(p)
    f.write_bytes(data)
    load(p)  # restored: loads again
    (p / "manifest.json").unlink()
    with pytest.raises(BundleError, match="manifest.json is missing"):
        load(p)
    assert issubclass(BundleError, ValueError)


def _write_sealed(p: Path, m: dict) -> None:
    """Write ``m`` as the manifest with a recomputed digest, as an editor who knows the format would."""
    from offload.host._manifest import digest

    (p / "manifest.json").write_text(json.dumps({**m, "manifest_sha256": digest(m)}))


def test_versions_and_malicious_manifests(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    m = json.loads((p / "manifest.json").read_text())
    for change, words in [
        ({"version": 3}, "format version 3 is not supported"),
        ({"format": "something-else"}, "is not an offload-bundle manifest"),
    ]:
        (p / "manifest.json").write_text(json.dumps({**m, **change}))
        with pytest.raises(BundleError, match=words):
            load(p)
    evil = json.loads(json.dumps(m))
    evil["kernels"][0]["tensors"]["bias"]["file"] = "../outside.bin"
    (p / "manifest.json").write_text(json.dumps(evil))
    with pytest.raises(BundleError, match=r"kernels\[0\].tensors.bias.file: '../outside.bin' does not match"):
        load(p)
    evil = json.loads(json.dumps(m))
    evil["kernels"][0]["kind"] = "no_such_kind"
    _write_sealed(p, evil)
    with pytest.raises(BundleError, match="'emb0' has unknown kind 'no_such_kind'"):
        load(p)
    evil = json.loads(json.dumps(m))
    evil["kernels"][0]["tensors"]["bias"]["dtype"] = "|O"
    _write_sealed(p, evil)
    with pytest.raises(BundleError, match=r"kernels\[0\].tensors.bias.dtype: '\|O' is not one of"):
        load(p)


def test_save_refuses_to_clobber_other_directories(tmp_path):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an offload bundle"):
        save(_kernels(), d)
    assert (d / "keep.txt").read_text() == "mine"
    p = save(_kernels(), tmp_path / "m")
    save([sa.make_kernel("only", n=4)], p)  # an existing bundle is replaced whole
    assert list(load(p).kernels) == ["only"]
    with pytest.raises(ValueError, match="two kernels are named"):
        save([sa.make_kernel("a"), sa.make_kernel("a")], tmp_path / "dup")
    with pytest.raises(TypeError, match="offload_kernels"):
        save(object(), tmp_path / "obj")
    with pytest.raises(TypeError, match="meta must be JSON-serialisable"):
        save(_kernels(), tmp_path / "meta", meta={"weights": np.zeros(3)})
    assert not (tmp_path / "meta").exists()


def test_xclbin_uuid_from_axlf_header(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # read the header, not through pyxrt
    import uuid

    u = uuid.uuid4()
    head = bytearray(b"\xff" * 448)
    head[:8] = b"xclbin2\0"
    head[416:432] = u.bytes  # axlf (304 bytes to the header) + 112 bytes into axlf_header
    (tmp_path / "a.xclbin").write_bytes(bytes(head))
    assert xclbin_uuid(tmp_path / "a.xclbin") == str(u)
    (tmp_path / "b.xclbin").write_bytes(b"not an xclbin")
    assert xclbin_uuid(tmp_path / "b.xclbin") is None


_NO_TORCH = r"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, _Block())
sys.path.insert(0, {tests!r})
import numpy as np
import _scale_add as sa
import offload
from offload.host import open_device
b = offload.load({path!r})
for spec in ("sim", "emu"):
    dev = open_device(spec)
    h = dev.load_bundle(b)
    out = dev.run(h["emb0"], sa.make_inputs(n=8, batch=2))
    print(spec, out["y"].tolist())
assert "torch" not in sys.modules
"""


def test_bundle_loads_and_runs_without_torch(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    code = _NO_TORCH.format(tests=str(Path(__file__).resolve().parents[1]), path=str(p))
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(ln.split(" ", 1) for ln in out.stdout.strip().splitlines())
    ref = open_device("sim")
    want = ref.run(ref.load(_kernels()[0]), sa.make_inputs(n=8, batch=2))["y"].tolist()
    assert json.loads(lines["sim"]) == want and json.loads(lines["emu"]) == want


def test_catalogue_kernels_round_trip(tmp_path):
    """Every kind in the catalogue survives save/load: same spec, tensors and sim outputs."""
    from offload.kernels.catalogue import entries

    seen, cases = set(), []
    for e in entries():
        if e.kind not in seen:
            seen.add(e.kind)
            cases.append(e.build())
    b = load(save([c.kernel for c in cases], tmp_path / "cat"))
    sim = open_device("sim")
    for c in cases:
        got = b.kernels[c.kernel.name]
        assert got.spec.to_json() == c.kernel.spec.to_json()
        assert_same(sim.run(sim.load(got), c.inputs), sim.run(sim.load(c.kernel), c.inputs))

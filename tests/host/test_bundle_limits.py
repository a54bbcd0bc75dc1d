"""Bundles that demand too much, lie in their specs, carry extra files or were downgraded (issue 45,
item 4). Each case failed on the code before the fix."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import offload
from _host_util import sa
from offload.cli import main
from offload.host import _manifest, open_device
from offload.host.bundle import MAX_BUNDLE_BYTES, UnsealedBundleWarning, load, save
from offload.kernels import get_kind
from offload.kernels.catalogue import entries
from offload.sim.errors import BundleError, OffloadError

EMB = "emb/sum/int8_rowwise/d16/bag20/t1"


def _embedding():
    return entries(EMB)[0].build().kernel


def _mlp():
    return next(e for e in entries() if e.kind == "mlp").build().kernel


def _manifest_of(p: Path) -> dict:
    return json.loads((p / "manifest.json").read_text())


def _seal(p: Path, m: dict) -> None:
    """Write ``m`` with its digest recomputed, as an editor who knows the format would."""
    (p / "manifest.json").write_text(json.dumps({**m, "manifest_sha256": _manifest.digest(m)}))


def _edit(m: dict, path: list, value) -> dict:
    m = json.loads(json.dumps(m))
    node = m
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return m


def _refused(p: Path, *words: str, **kw) -> str:
    with pytest.raises(BundleError) as e:
        load(p, **kw)
    assert isinstance(e.value, OffloadError)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


# ------------------------------------------------------------------------- the work a bundle demands


def _claim_16_gib(p: Path) -> dict:
    """The issue's bundle: spec, shapes and nbytes agree on a 16 GiB table; the files are sparse."""
    m = _manifest_of(p)
    ke = m["kernels"][0]
    dim = ke["spec"]["tables"][0]["dim"]
    rows = (16 << 30) // dim
    ke["spec"]["tables"][0]["num_rows"] = rows
    for name, te in ke["tensors"].items():
        te["shape"] = [rows, *te["shape"][1:]]
        te["nbytes"] = rows * int(np.prod(te["shape"][1:])) * np.dtype(te["dtype"]).itemsize
        os.truncate(p / te["file"], te["nbytes"])
    _seal(p, m)
    return m


def test_a_small_bundle_claiming_a_16_gib_sparse_tensor_is_refused_fast(tmp_path):
    p = save([_embedding()], tmp_path / "e")
    m = _claim_16_gib(p)
    table = p / m["kernels"][0]["tensors"]["table0"]["file"]
    fd = os.open(table, os.O_RDONLY)
    try:
        size, hole = os.fstat(fd).st_size, os.lseek(fd, 0, os.SEEK_HOLE)
    finally:
        os.close(fd)
    if hole >= size:
        pytest.skip("this file system does not report holes")
    assert sum(f.stat().st_blocks for f in p.rglob("*") if f.is_file()) * 512 < 1 << 20  # it is small on disk
    t0 = time.perf_counter()
    _refused(p, f"{table.name} has a hole at byte {hole} of its {size}: a sparse file")
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1 and f"has a hole at byte {hole} of its {size}" in r.output, r.output
    assert time.perf_counter() - t0 < 10  # before: 156 s of hashing zeros


def test_max_bundle_bytes_is_checked_before_any_tensor_file_is_opened(tmp_path, monkeypatch):
    p = save([_embedding()], tmp_path / "e")
    total = sum(te["nbytes"] for te in _manifest_of(p)["kernels"][0]["tensors"].values())
    assert load(p, max_bundle_bytes=total).kernels  # the limit is inclusive
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (opened.append(str(path)), real_open(path, *a, **k))[1])
    _refused(p, f"its files declare {total} bytes in all, over max_bundle_bytes={total - 1}", max_bundle_bytes=total - 1)
    assert not [o for o in opened if o.endswith(".bin")], opened
    # The default is documented and bounds the 16 GiB claim times four, no more.
    assert MAX_BUNDLE_BYTES == 64 << 30


def test_a_file_with_a_hole_in_the_middle_is_refused(tmp_path):
    k = sa.make_kernel("big", n=1 << 16)  # 256 KiB of int32
    p = save([k], tmp_path / "m")
    f = p / _manifest_of(p)["kernels"][0]["tensors"]["bias"]["file"]
    data = f.read_bytes()
    f.unlink()
    with open(f, "wb") as out:  # same bytes and size, the middle not written (zeros read back)
        out.write(data[:4096])
        out.seek(len(data) - 4096)
        out.write(data[-4096:])
    fd = os.open(f, os.O_RDONLY)
    hole = os.lseek(fd, 0, os.SEEK_HOLE)
    os.close(fd)
    if hole >= len(data):
        pytest.skip("this file system does not report holes")
    _refused(p, f"has a hole at byte {hole} of its {len(data)}")


# ------------------------------------------------------------------------- spec fields: typed, ranged

_SPEC_CASES = [
    ("embedding", ["tables", 0, "dim"], 16.0, "spec.tables[0].dim: 16.0 is not of type 'integer'"),
    ("embedding", ["max_bag_size"], 1e30, "spec.max_bag_size: 1e+30 is not of type 'integer'"),
    ("embedding", ["max_bag_size"], 1 << 31, "spec.max_bag_size: 2147483648 is greater than the maximum of 2147483647"),
    ("embedding", ["tables", 0, "num_rows"], True, "spec.tables[0].num_rows: True is not of type 'integer'"),
    ("embedding", ["tables", 0, "bundle"], "gmem0 = x\n#include", "spec.tables[0].bundle: 'gmem0 = x\\n#include' does not match"),
    ("embedding", ["tables", 0, "padding_idx"], 2.0, "spec.tables[0].padding_idx: 2.0 is not of type 'integer', 'null'"),
    ("embedding", ["kind"], "mlp", "spec.kind: 'embedding' was expected"),
    ("embedding", ["acc_type"], 41, "spec.acc_type: 41 is not of type 'string'"),
    ("embedding", ["feature_table_map"], [0.0], "spec.feature_table_map[0]: 0.0 is not of type 'integer'"),
    ("mlp", ["n_features"], 16.0, "spec.n_features: 16.0 is not of type 'integer'"),
    ("mlp", ["layers", 0, "n_out"], 8.0, "spec.layers[0].n_out: 8.0 is not of type 'integer'"),
    ("mlp", ["layers", 0, "use_bias"], 1, "spec.layers[0].use_bias: 1 is not of type 'boolean'"),
    ("mlp", ["layers", 0, "name"], "fc0;\nint x", "spec.layers[0].name: 'fc0;\\nint x' does not match"),
    ("mlp", ["constants", "fc0.bias", 0], 1.5, "spec.constants[\"fc0.bias\"][0]: 1.5 is not an int64 integer"),
    ("mlp", ["constants", "fc0.bias", 1], True, "spec.constants[\"fc0.bias\"][1]: True is not an int64 integer"),
    ("mlp", ["reuse_factor"], 1e30, "spec.reuse_factor: 1e+30 is not of type 'integer'"),
]


@pytest.mark.parametrize("kind,path,value,words", _SPEC_CASES, ids=[f"{c[0]}:{'.'.join(map(str, c[1]))}={c[2]!r}" for c in _SPEC_CASES])
def test_spec_fields_of_the_wrong_type_or_range_are_refused_at_schema_time(tmp_path, kind, path, value, words):
    p = save([_embedding() if kind == "embedding" else _mlp()], tmp_path / kind)
    _seal(p, _edit(_manifest_of(p), ["kernels", 0, "spec", *path], value))
    msg = _refused(p, f"manifest field kernels[0].{words}")
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1 and "Traceback" not in r.output and "manifest field kernels[0].spec" in r.output, r.output
    assert msg.split(": manifest field ")[1][:40] in " ".join(r.output.split())


def test_every_registered_kind_has_a_spec_schema_that_its_own_specs_pass():
    from jsonschema import Draft202012Validator

    for make in (_embedding, _mlp):
        k = make()
        schema = get_kind(k.kind).spec_schema
        assert schema is not None, k.kind
        Draft202012Validator.check_schema(schema)
        _manifest.check_spec(json.loads(json.dumps(k.spec.to_json())), schema, "test", 0)


def _spec_paths(node, path=()):
    yield path
    items = node.items() if isinstance(node, dict) else enumerate(node[:2]) if isinstance(node, list) else ()
    for key, value in items:
        yield from _spec_paths(value, (*path, key))


@pytest.mark.parametrize("kind", ["embedding", "mlp"])
def test_what_load_and_info_accept_a_device_loads_and_runs(tmp_path, kind):
    """Every spec field given hostile values: the bundle is refused by load and by ``offload info``
    alike (a BundleError, exit 1), or it loads, ``info`` prints it, and the sim device loads it and
    runs its golden inputs. Before: ``dim = 16.0`` loaded and failed at device load with a TypeError."""
    k = _embedding() if kind == "embedding" else _mlp()
    p = save([k], tmp_path / kind)
    m = _manifest_of(p)
    dev = open_device("sim")
    refused = accepted = 0
    paths = list(_spec_paths(m["kernels"][0]["spec"]))[1:]
    for i, path in enumerate(paths):
        for value in (None, -1, 16.0, 1 << 31, 1e30, "x", [], True):
            _seal(p, _edit(m, ["kernels", 0, "spec", *path], value))
            try:
                b = load(p)
            except BundleError as e:
                refused += 1
                if (i + refused) % 7 == 0:  # info on a sample: each invocation costs a CLI start
                    r = CliRunner().invoke(main, ["info", str(p)])
                    assert r.exit_code == 1 and str(e).split(": ", 1)[1][:30] in " ".join(r.output.split()), (path, value, r.output)
                continue
            accepted += 1
            handles = dev.load_bundle(b)
            kern = b.kernels[k.name]
            inputs = get_kind(kern.kind).golden_inputs(kern.spec, np.random.default_rng(0), 0)
            dev.run(handles[k.name], inputs)
            r = CliRunner().invoke(main, ["info", str(p)])
            assert r.exit_code == 0, (path, value, r.output)
    assert refused > 5 * len(paths)
    assert accepted >= 1  # the equal value of some field (say True for use_bias) still loads


# ------------------------------------------------------------------------- extra files


@pytest.mark.parametrize("extra", ["notes.txt", "tensors/extra.bin", "manifest.json.tmp", "folder/", "tensors/sub/", ".hidden"])
def test_files_the_manifest_does_not_name_are_refused(tmp_path, extra):
    p = save(sa_kernels(), tmp_path / "m")
    target = p / extra.rstrip("/")
    if extra.endswith("/"):
        target.mkdir()
    else:
        target.write_bytes(b"not part of it")
    shown = extra.rstrip("/")
    _refused(p, f"{shown}: not part of the bundle (its manifest does not name it)")
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1 and "not part of the bundle" in r.output, r.output


def test_a_link_beside_the_manifest_is_refused_too(tmp_path):
    p = save(sa_kernels(), tmp_path / "m")
    (p / "elsewhere").symlink_to(tmp_path)
    _refused(p, "elsewhere: not part of the bundle")


def sa_kernels():
    return [sa.make_kernel("emb0", n=8, scale=3, seed=1), sa.make_kernel("risk", n=4, scale=11, seed=2)]


# ------------------------------------------------------------------------- sealed bundles


def _downgrade(p: Path) -> None:
    """The issue's attack: drop the digest and claim format version 1."""
    m = _manifest_of(p)
    del m["manifest_sha256"]
    m["version"] = 1
    (p / "manifest.json").write_text(json.dumps(m))


def test_a_downgraded_bundle_warns_and_require_sealed_refuses_it(tmp_path):
    p = save(sa_kernels(), tmp_path / "m")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load(p, require_sealed=True).manifest_sha256  # a sealed bundle: no warning, loads
    _downgrade(p)
    with pytest.warns(UnsealedBundleWarning, match="not sealed"):
        assert load(p).manifest_sha256 is None
    _refused(p, "manifest_sha256: the bundle is not sealed", "a sealed bundle is required", require_sealed=True)
    with pytest.raises(BundleError, match="not sealed"):
        offload.load(p, require_sealed=True)  # the API twin


def test_serve_require_sealed_refuses_an_unsealed_bundle_before_serving(tmp_path, monkeypatch):
    p = save(sa_kernels(), tmp_path / "m")
    _downgrade(p)
    import offload.serve.server as server

    served = []
    monkeypatch.setattr(server, "serve", lambda bundle, *a, **k: served.append(bundle))
    r = CliRunner().invoke(main, ["serve", str(p), "--require-sealed"])
    assert r.exit_code == 1 and "not sealed" in r.output and not served, r.output
    with pytest.warns(UnsealedBundleWarning):
        save(load(p), p)  # re-saving seals it
    r = CliRunner().invoke(main, ["serve", str(p), "--require-sealed"])
    assert r.exit_code == 0 and len(served) == 1 and served[0].manifest_sha256, r.output

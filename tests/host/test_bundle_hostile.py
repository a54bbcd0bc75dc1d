"""Bundles as hostile input (issue 15, items 1-5): links, sizes, malformed and edited manifests,
and what ``offload info`` checks and prints. Each case failed on the code before the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import offload
from _host_util import bundle_with_xclbin, fakes, sa  # noqa: F401  (fakes is a fixture)
from offload.cli import main
from offload.host import _manifest, open_device
from offload.host import bundle as bundle_mod
from offload.host.bundle import load, save
from offload.kernels import Kernel
from offload.sim.errors import BundleError, OffloadError


def _kernels():
    return [sa.make_kernel("emb0", n=8, scale=3, seed=1), sa.make_kernel("risk", n=4, scale=11, seed=2)]


def _embedding():
    from offload.kernels.catalogue import entries

    return entries("emb/sum/int8_rowwise/d16/bag20/t1")[0].build().kernel


def _manifest_of(p: Path) -> dict:
    return json.loads((p / "manifest.json").read_text())


def _write(p: Path, m: dict, *, seal: bool = True) -> None:
    """Write ``m`` as the manifest; ``seal`` recomputes its digest, as an editor who knows the format would."""
    if seal:
        m = {**m, "manifest_sha256": _manifest.digest(m)}
    (p / "manifest.json").write_text(json.dumps(m))


def _refused(p: Path, *words: str) -> str:
    with pytest.raises(BundleError) as e:
        load(p)
    assert isinstance(e.value, OffloadError)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


# ---------------------------------------------------------------------------- 1. links


def test_a_tensor_file_linked_outside_the_bundle_is_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    f = p / _manifest_of(p)["kernels"][0]["tensors"]["bias"]["file"]
    outside = tmp_path / "secret.bin"
    outside.write_bytes(f.read_bytes())  # same bytes: size and sha256 both match
    f.unlink()
    f.symlink_to(outside)
    _refused(p, f"tensors/{f.name} is a symbolic link")


def test_a_linked_tensors_folder_is_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    (p / "tensors").rename(tmp_path / "elsewhere")
    (p / "tensors").symlink_to(tmp_path / "elsewhere")
    _refused(p, "tensors is a symbolic link")


def test_a_linked_manifest_is_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    (p / "manifest.json").rename(tmp_path / "manifest.json")
    (p / "manifest.json").symlink_to(tmp_path / "manifest.json")
    _refused(p, "manifest.json is a symbolic link")


def test_a_fifo_or_folder_in_place_of_a_tensor_is_refused_without_waiting(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    f = p / _manifest_of(p)["kernels"][0]["tensors"]["bias"]["file"]
    f.unlink()
    os.mkfifo(f)  # opening it for reading would wait for a writer forever
    _refused(p, f"{f.name} is not a regular file")
    f.unlink()
    f.mkdir()
    _refused(p, f"{f.name} is not a regular file")


def test_the_bundle_folder_itself_may_be_reached_through_a_link(tmp_path):
    p = save(_kernels(), tmp_path / "v1.offload")
    (tmp_path / "current").symlink_to(p)  # how deployments switch bundles atomically
    assert list(load(tmp_path / "current").kernels) == ["emb0", "risk"]


# ---------------------------------------------------------------------------- 2. sizes


def _bytes_read() -> int:
    """Bytes this process has read through read() calls so far (Linux: /proc/self/io rchar);
    a sparse file's holes count too, so reading the manifest shows whatever its disk usage."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts reads through /proc/self/io (Linux)")
@pytest.mark.parametrize("over", [0, 1])
def test_a_manifest_over_the_size_limit_is_refused_unread(tmp_path, over):
    """At the limit the manifest is read (and refused as JSON); one byte over, refused by its size
    before any of it is read."""
    p = save(_kernels(), tmp_path / "m")
    size = _manifest.MAX_MANIFEST_BYTES + over
    os.truncate(p / "manifest.json", size)  # sparse: costs no disk
    before = _bytes_read()
    with pytest.raises(BundleError) as e:
        load(p)
    read = _bytes_read() - before
    if over:
        assert f"manifest.json is {size} bytes, over the limit of {_manifest.MAX_MANIFEST_BYTES}" in str(e.value)
        assert read < 1 << 20, f"{read} bytes read while refusing a manifest by its size"
    else:
        assert "over the limit" not in str(e.value)
        assert read >= size  # the counter sees a whole read of the file (so it would see one above)


@pytest.mark.parametrize("depth", [5000, _manifest.MAX_JSON_DEPTH + 1])
def test_json_nested_too_deep_is_refused(tmp_path, depth):
    p = save(_kernels(), tmp_path / "m")
    m = _manifest_of(p)
    text = json.dumps(m).replace('"meta": {}', '"meta": {"x": ' + "[" * (depth - 2) + "]" * (depth - 2) + "}")
    (p / "manifest.json").write_text(text)
    _refused(p, f"nests {depth} levels deep, over the limit of {_manifest.MAX_JSON_DEPTH}")


def test_brackets_inside_strings_do_not_count_as_depth(tmp_path):
    deep = '\\"[{' * 3000
    p = save(_kernels(), tmp_path / "m", meta={"note": json.loads(f'"{deep}"')})
    assert load(p).meta["note"] == json.loads(f'"{deep}"')


def test_a_sparse_16_gib_tensor_contradicting_the_spec_is_refused_before_reading(tmp_path, monkeypatch):
    p = save([_embedding()], tmp_path / "e")
    m = _manifest_of(p)
    te = m["kernels"][0]["tensors"]["table0"]
    rows, dim = te["shape"]
    n = 16 << 30
    te["shape"], te["nbytes"] = [n // dim, dim], n
    os.truncate(p / te["file"], n)
    _write(p, m)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (opened.append(str(path)), real_open(path, *a, **k))[1])
    _refused(p, f"kernels[0].tensors.table0.shape: {[n // dim, dim]} contradicts", f"needs {[rows, dim]}")
    assert not [o for o in opened if o.endswith(".bin")], opened  # no tensor file was even opened


def test_nbytes_must_equal_shape_times_dtype_before_reading(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    m = _manifest_of(p)
    m["kernels"][0]["tensors"]["bias"]["shape"] = [4]  # 4 x <i4 is 16 bytes; the file holds 32
    _write(p, m)
    _refused(p, "kernels[0].tensors.bias.nbytes: shape [4] x <i4 is 16 bytes, the manifest records 32")


def test_large_tensors_are_memory_mapped_read_only(tmp_path, monkeypatch):
    k = _embedding()
    p = save([k], tmp_path / "e")
    monkeypatch.setattr(bundle_mod, "MMAP_MIN_BYTES", k.tensors["table0"].nbytes)
    b = load(p)
    table, params = b.kernels[k.name].tensors["table0"], b.kernels[k.name].tensors["params0"]
    assert isinstance(table, np.memmap) and not isinstance(params, np.memmap)
    assert not table.flags.writeable and not params.flags.writeable
    np.testing.assert_array_equal(table, k.tensors["table0"])
    sim = open_device("sim")
    from offload.kernels.catalogue import entries

    case = entries("emb/sum/int8_rowwise/d16/bag20/t1")[0].build()
    np.testing.assert_array_equal(sim.run(sim.load(b.kernels[k.name]), case.inputs)["out"], sim.run(sim.load(k), case.inputs)["out"])


# ---------------------------------------------------------------------------- 3. malformed manifests


def _edit(m: dict, path: list, value) -> dict:
    m = json.loads(json.dumps(m))
    node = m
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return m


_MALFORMED = [
    (["kernels"], "emb0", "manifest field kernels: 'emb0' is not of type 'array'"),
    (["kernels"], {"emb0": 1}, "manifest field kernels: {'emb0': 1} is not of type 'array'"),
    (["kernels"], 5, "manifest field kernels: 5 is not of type 'array'"),
    (["kernels", 0, "tensors"], [1, 2], "manifest field kernels[0].tensors: [1, 2] is not of type 'object'"),
    (["meta"], [1, 2], "manifest field meta: [1, 2] is not of type 'object'"),
    (["kernels", 0, "kind"], ["embedding"], "manifest field kernels[0].kind: ['embedding'] is not of type 'string'"),
    (["kernels", 0, "tensors", "bias", "shape"], [-1, -8], "kernels[0].tensors.bias.shape[1]: -8 is less than the minimum of 0"),
    (["kernels", 0, "tensors", "bias", "shape"], [8.0], "kernels[0].tensors.bias.shape[0]: 8.0 is not of type 'integer'"),
    (["kernels", 0, "tensors", "bias", "shape"], [True, 8], "kernels[0].tensors.bias.shape[0]: True is not of type 'integer'"),
    (["kernels", 0, "tensors", "bias", "shape"], [1e30], "kernels[0].tensors.bias.shape[0]: 1e+30 is not of type 'integer'"),
    (["kernels", 0, "tensors", "bias", "shape"], [10**30], "kernels[0].tensors.bias.shape[0]: 1000000000000000000000000000000 is greater than the maximum"),
    (["kernels", 0, "tensors", "bias", "nbytes"], 32.0, "kernels[0].tensors.bias.nbytes: 32.0 is not of type 'integer'"),
    (["kernels", 0, "tensors", "bias", "dtype"], ">i4", "kernels[0].tensors.bias.dtype: '>i4' is not one of"),
    (["kernels", 0, "tensors", "bias", "dtype"], "<c16", "kernels[0].tensors.bias.dtype: '<c16' is not one of"),
    (["version"], True, "version: format version True is not supported"),
    (["version"], 1.0, "version: format version 1.0 is not supported"),
    (["xclbin"], "offload.xclbin", "manifest field xclbin: 'offload.xclbin' is not valid under any of the given schemas"),
    (["xclbin"], [1], "manifest field xclbin: [1] is not valid under any of the given schemas"),
    (["kernels", 0, "name"], 7, "manifest field kernels[0].name: 7 is not of type 'string'"),
]


@pytest.mark.parametrize("path,value,words", _MALFORMED, ids=[f"{'.'.join(map(str, c[0]))}={c[1]!r}" for c in _MALFORMED])
def test_malformed_manifests_are_refused_naming_the_field(tmp_path, path, value, words):
    p = save(_kernels(), tmp_path / "m")
    _write(p, _edit(_manifest_of(p), path, value))
    _refused(p, words)
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1 and words in r.output and "Traceback" not in r.output, r.output


def test_malformed_xclbin_entries_are_refused(fakes, tmp_path):
    b = bundle_with_xclbin(tmp_path, _kernels(), cus=2)
    m = _manifest_of(b.path)
    for field, value, words in [
        ("compute_units", ["cu_1"], "xclbin.compute_units: ['cu_1'] is not of type 'object'"),
        ("compute_units", {"top": "cu_1"}, "xclbin.compute_units.top: 'cu_1' is not of type 'array'"),
        ("file", "../offload.xclbin", "xclbin.file: '../offload.xclbin' does not match"),
        ("nbytes", -1, "xclbin.nbytes: -1 is less than the minimum of 1"),
        ("uuid", 5, "xclbin.uuid: 5 is not of type 'string', 'null'"),
    ]:
        _write(b.path, _edit(m, ["xclbin", field], value))
        _refused(b.path, words)


@pytest.mark.parametrize(
    "spec",
    [{}, {"tables": "abc"}, {"tables": [1]}, {"tables": [{"num_rows": "x"}]}, {"tables": [], "mode": 5, "max_bag_size": [], "acc_type": {}, "out_type": None}],
    ids=["empty", "tables-str", "tables-int", "table-bad-field", "wrong-types"],
)
def test_malformed_specs_are_bundle_errors(tmp_path, spec):
    p = save([_embedding()], tmp_path / "e")
    _write(p, _edit(_manifest_of(p), ["kernels", 0, "spec"], spec))
    _refused(p, "manifest field kernels[0].spec")


def _spec_paths(node, path=()):
    yield path
    items = node.items() if isinstance(node, dict) else enumerate(node[:2]) if isinstance(node, list) else ()
    for key, value in items:
        yield from _spec_paths(value, (*path, key))


@pytest.mark.parametrize("kind", ["embedding", "mlp"])
def test_every_field_of_a_spec_given_a_wrong_value_is_a_bundle_error(tmp_path, kind):
    """Each kind's spec_from_json meets hostile values; what escapes it must become a BundleError."""
    from offload.kernels.catalogue import entries

    entry = next(e for e in entries() if e.kind == kind)
    p = save([entry.build().kernel], tmp_path / kind)
    m = _manifest_of(p)
    refused = 0
    for path in list(_spec_paths(m["kernels"][0]["spec"]))[1:]:
        for value in (None, -1, 10**30, "x", [], {"a": 1}, True):
            _write(p, _edit(m, ["kernels", 0, "spec", *path], value))
            try:
                load(p)
            except BundleError:
                refused += 1
    assert refused > 50  # most of these are refused; the rest load (a value the spec allows) or fail the test


# ---------------------------------------------------------------------------- 4. keys, names, digest


def test_duplicate_json_keys_are_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    text = (p / "manifest.json").read_text()
    # A second "dtype" after the first: json.loads would silently keep the last one.
    text = text.replace('"dtype": "<i4",', '"dtype": "<i4", "dtype": "<u4",', 1)
    (p / "manifest.json").write_text(text)
    _refused(p, "key 'dtype' appears twice in one object")


def test_duplicate_kernel_names_are_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    m = _manifest_of(p)
    m["kernels"][1]["name"] = "emb0"
    _write(p, m)
    _refused(p, "kernels[1].name: two kernels are named 'emb0'")


def test_non_finite_numbers_are_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    text = (p / "manifest.json").read_text()
    assert '"meta": {}' in text
    for meta, words in [('{"x": NaN}', "NaN is not JSON"), ('{"x": 1e400}', "number 1e400 is outside the range of a float")]:
        (p / "manifest.json").write_text(text.replace('"meta": {}', f'"meta": {meta}'))
        _refused(p, words)


def test_an_edited_manifest_is_refused_and_info_says_so(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    r = CliRunner().invoke(main, ["info", str(p)])
    digest = _manifest_of(p)["manifest_sha256"]
    assert r.exit_code == 0 and f"manifest: intact (sha256 {digest})" in r.output, r.output
    # The attack: a byte-order flip keeps every tensor's sha256 and changes every value.
    text = (p / "manifest.json").read_text()
    (p / "manifest.json").write_text(text.replace('"<i4"', '">i4"'))
    _refused(p, "dtype: '>i4' is not one of")
    # An edit the schema allows is caught by the digest.
    m = json.loads(text)
    m["kernels"][0]["tensors"]["bias"]["dtype"] = "<u4"
    (p / "manifest.json").write_text(json.dumps(m))
    _refused(p, "manifest_sha256: manifest.json was edited after it was saved")
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1 and "edited after it was saved" in r.output


def test_reindenting_keeps_the_digest_and_a_missing_digest_is_refused(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    m = _manifest_of(p)
    (p / "manifest.json").write_text(json.dumps(m, indent=7, sort_keys=True))
    assert load(p).manifest_sha256 == m["manifest_sha256"]
    del m["manifest_sha256"]
    (p / "manifest.json").write_text(json.dumps(m))
    _refused(p, "manifest_sha256: missing; a version 2 manifest records its digest")


def test_version_1_bundles_still_load_unsealed(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    m = _manifest_of(p)
    del m["manifest_sha256"]
    m["version"] = 1  # what offload wrote before manifests carried a digest
    (p / "manifest.json").write_text(json.dumps(m, indent=2))
    with pytest.warns(bundle_mod.UnsealedBundleWarning, match="not sealed"):
        b = load(p)
    assert b.manifest_sha256 is None and list(b.kernels) == ["emb0", "risk"]
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 0 and "manifest: not sealed (format version 1" in r.output, r.output
    r = CliRunner().invoke(main, ["info", str(p), "--require-sealed"])
    assert r.exit_code == 1 and "not sealed" in r.output, r.output
    save(b, p)  # re-saving seals it
    assert load(p).manifest_sha256 == _manifest_of(p)["manifest_sha256"]


def test_tensor_names_that_sanitise_alike_get_their_own_files(tmp_path):
    spec = sa.make_kernel("k", n=4).spec
    k = Kernel("k" * 200, spec, {"bias": np.arange(4, dtype=np.int32), "a.b": np.ones(2, np.int8), "a_b": np.zeros(2, np.int8)})
    files = [te["file"] for te in _manifest_of(save([k], tmp_path / "m"))["kernels"][0]["tensors"].values()]
    assert len(set(files)) == 3 and all(len(Path(f).name) <= 255 for f in files)
    got = load(tmp_path / "m").kernels["k" * 200].tensors
    assert got["a.b"].tolist() == [1, 1] and got["a_b"].tolist() == [0, 0]


def test_save_writes_only_the_allowed_dtypes(tmp_path):
    k = sa.make_kernel("c", n=4)
    for bad in (np.complex64, np.longdouble):
        with pytest.raises(TypeError, match="a bundle stores only"):
            save([Kernel("c", k.spec, {"bias": np.zeros(4, dtype=bad)})], tmp_path / "c")
    big_endian = k.tensors["bias"].astype(">i4")
    b = load(save([Kernel("c", k.spec, {"bias": big_endian})], tmp_path / "c"))
    assert _manifest_of(tmp_path / "c")["kernels"][0]["tensors"]["bias"]["dtype"] == "<i4"
    np.testing.assert_array_equal(b.kernels["c"].tensors["bias"], big_endian)


def test_the_schema_is_valid_json_schema():
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(_manifest.SCHEMA)


# ---------------------------------------------------------------------------- 5. info, save


def test_info_refuses_what_the_device_refuses(tmp_path):
    k = _embedding()
    bad = dict(k.tensors)
    bad["params0"] = bad["params0"].copy()
    bad["params0"][:, 0] = 0  # a row-wise scale below 1: check_tensors refuses it at device load
    p = save([Kernel(k.name, k.spec, bad)], tmp_path / "e")
    with pytest.raises(ValueError, match="scale >= 1"):
        open_device("sim").load(Kernel(k.name, k.spec, bad))
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 1 and "kernels[0].tensors" in r.output and "scale >= 1" in r.output, r.output
    _refused(p, "params0", "scale >= 1")


def test_info_escapes_control_characters(tmp_path):
    k = sa.make_kernel("k\x1b]0;owned\x07", n=4)
    p = save([k], tmp_path / "m", name="evil\x1b[2J\x1b[31mname", meta={"who\r": "x\x1b[8m"})
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output and "\r" not in r.output
    for shown in ("evil\\x1b[2J\\x1b[31mname", "k\\x1b]0;owned", "\\x07", "who\\r=x\\x1b[8m"):  # the table folds the kernel name
        assert shown in r.output, (shown, r.output)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o755), (0o002, 0o775), (0o077, 0o700)])
def test_save_honours_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        p = save(_kernels(), tmp_path / "m")
    finally:
        os.umask(old)
    assert (p.stat().st_mode & 0o777, (p / "tensors").stat().st_mode & 0o777) == (mode, mode)
    assert (p / "manifest.json").stat().st_mode & 0o777 == mode & 0o666
    assert offload.load(p).manifest_sha256

"""Signed bundles (issue 45, item 5): ``offload sign``, ``offload verify``, ``load(trusted_keys=...)``
and ``offload serve --trusted-key``. The manifest digest alone is recomputed by anyone who edits a
bundle; a signature by a trusted key is not, so a consistent forged edit is refused."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import offload
from _host_util import bundle_with_xclbin, fakes, fake_xclbin, sa  # noqa: F401  (fakes is a fixture)
from offload.cli import main
from offload.host import _manifest
from offload.host.bundle import SIGNATURE_FILE, UnsealedBundleWarning, load, record_xclbin, save, sign
from offload.host.signing import MESSAGE_PREFIX, generate_key, load_public_key
from offload.sim.errors import BundleError, InputError


def _kernels():
    return [sa.make_kernel("emb0", n=8, scale=3, seed=1), sa.make_kernel("risk", n=4, scale=11, seed=2)]


def _manifest_of(p: Path) -> dict:
    return json.loads((p / "manifest.json").read_text())


def _raw_sha256(pub_pem: Path) -> str:
    """The key's name as the document defines it, computed here from the PEM's raw 32 bytes."""
    key = load_public_key(pub_pem)
    return hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


@pytest.fixture
def signed(tmp_path):
    """A saved bundle signed with a fresh key: (bundle, private key path, public key path)."""
    priv, pub = generate_key(tmp_path / "release.pem")
    p = save(_kernels(), tmp_path / "m")
    sign(p, priv)
    return p, priv, pub


def _refused(p: Path, *words: str, **kw) -> str:
    with pytest.raises(BundleError) as e:
        load(p, **kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


def test_a_signed_bundle_verifies_with_its_key_and_the_signature_is_what_the_docs_say(signed):
    p, _, pub = signed
    b = load(p, trusted_keys=[pub])
    assert b.signature_verified and b.signature_key == _raw_sha256(pub)
    # What is signed, checked with the library directly: the prefix and the manifest digest.
    doc = json.loads((p / SIGNATURE_FILE).read_text())
    digest = _manifest_of(p)["manifest_sha256"]
    assert doc["manifest_sha256"] == digest == b.manifest_sha256
    load_public_key(pub).verify(base64.b64decode(doc["signature"]), MESSAGE_PREFIX + digest.encode())
    # Without keys it loads, signed but not verified.
    b = load(p)
    assert b.signature_key == _raw_sha256(pub) and not b.signature_verified


def test_a_consistent_forged_edit_is_refused(signed):
    p, _, pub = signed
    m = _manifest_of(p)
    m["kernels"][0]["tensors"]["bias"]["dtype"] = "<u4"  # an edit the schema allows
    m["manifest_sha256"] = _manifest.digest(m)  # recomputed, as a forger would
    (p / "manifest.json").write_text(json.dumps(m))
    # The digest check passes (consistent); the signature was made for the old digest.
    _refused(p, "signature.json: it signs manifest digest", "the manifest was changed after signing", trusted_keys=[pub])
    # The forger also rewrites the digest the signature document names: the signature itself fails.
    doc = json.loads((p / SIGNATURE_FILE).read_text())
    doc["manifest_sha256"] = m["manifest_sha256"]
    (p / SIGNATURE_FILE).write_text(json.dumps(doc))
    _refused(p, "the signature does not verify with trusted key sha256", "forged", trusted_keys=[pub])
    assert not load(p).signature_verified  # without a key nothing is claimed
    r = CliRunner().invoke(main, ["verify", str(p), "--trusted-key", str(pub)])
    assert r.exit_code == 1 and "does not verify" in r.output, r.output


def test_unsigned_other_key_and_downgraded_bundles_are_refused_where_a_key_is_required(signed, tmp_path):
    p, _, pub = signed
    _, other = generate_key(tmp_path / "other.pem")
    _refused(p, "which is not among the 1 trusted key(s)", trusted_keys=[other])
    assert load(p, trusted_keys=[other, pub]).signature_verified  # any trusted key will do
    unsigned = save(_kernels(), tmp_path / "u")
    _refused(unsigned, "not signed (no signature.json), and a trusted key is required", trusted_keys=[pub])
    # Downgraded to version 1 (digest dropped): refused as unsealed before its signature is looked at.
    m = _manifest_of(p)
    del m["manifest_sha256"]
    m["version"] = 1
    (p / "manifest.json").write_text(json.dumps(m))
    _refused(p, "not sealed", trusted_keys=[pub])
    with pytest.warns(UnsealedBundleWarning):
        _refused(p, "signature.json: the manifest has no digest to sign (format version 1)")  # without keys too


def test_malformed_or_misplaced_signature_documents_are_refused(signed):
    p, _, pub = signed
    good = json.loads((p / SIGNATURE_FILE).read_text())
    for field, value, words in [
        ("algorithm", "rsa", "signature.json field algorithm: 'ed25519' was expected"),
        ("signature", "AAAA", "signature.json field signature: 'AAAA' does not match"),
        ("public_key_sha256", 5, "signature.json field public_key_sha256: 5 is not of type 'string'"),
    ]:
        (p / SIGNATURE_FILE).write_text(json.dumps({**good, field: value}))
        _refused(p, words)
    (p / SIGNATURE_FILE).write_text(json.dumps({**good, "extra": 1}))
    _refused(p, "Additional properties are not allowed")
    (p / SIGNATURE_FILE).write_bytes(b" " * 5000)
    _refused(p, "signature.json is 5000 bytes, over the limit of 4096")
    (p / SIGNATURE_FILE).unlink()
    (p / SIGNATURE_FILE).symlink_to(p / "manifest.json")
    _refused(p, "signature.json is a symbolic link")


def test_cli_generate_sign_verify_info(tmp_path):
    key = tmp_path / "k.pem"
    r = CliRunner().invoke(main, ["sign", "--generate-key", str(key)])
    assert r.exit_code == 0 and key.exists() and Path(f"{key}.pub").exists(), r.output
    assert key.stat().st_mode & 0o777 == 0o600
    r = CliRunner().invoke(main, ["sign", "--generate-key", str(key)])  # never overwrites a key
    assert r.exit_code == 1 and "FileExistsError" in r.output, r.output
    p = save(_kernels(), tmp_path / "m")
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 0 and "signature: none" in r.output, r.output
    r = CliRunner().invoke(main, ["sign", str(p), "--key", str(key)])
    kid = _raw_sha256(Path(f"{key}.pub"))
    assert r.exit_code == 0 and f"key sha256 {kid}" in r.output, r.output
    r = CliRunner().invoke(main, ["verify", str(p), "--trusted-key", f"{key}.pub"])
    assert r.exit_code == 0 and f"signed by key sha256 {kid}" in r.output, r.output
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 0 and f"signature: by ed25519 key sha256 {kid}, not verified" in r.output, r.output
    r = CliRunner().invoke(main, ["info", str(p), "--trusted-key", f"{key}.pub", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["signature"] == {"key_sha256": kid, "verified": True}, r.output


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not on PATH")
def test_keys_made_with_the_documented_openssl_commands_work(tmp_path):
    key, pub = tmp_path / "key.pem", tmp_path / "key.pem.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    p = save(_kernels(), tmp_path / "m")
    sign(p, key)
    assert load(p, trusted_keys=[pub]).signature_verified


def test_wrong_keys_are_typed_errors(tmp_path):
    p = save(_kernels(), tmp_path / "m")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    with pytest.raises(InputError, match="not an unencrypted PKCS#8 PEM private key"):
        sign(p, junk)
    with pytest.raises(InputError, match="not a PEM public key"):
        load(p, trusted_keys=[junk])
    with pytest.raises(InputError, match="trusted_keys: empty"):
        load(p, trusted_keys=[])
    m = _manifest_of(p)
    del m["manifest_sha256"]
    m["version"] = 1
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="not sealed"):
        sign(p, Ed25519PrivateKey.generate())  # only sealed bundles are signed


def test_recording_an_xclbin_drops_the_signature_it_invalidates(fakes, tmp_path):
    priv, pub = generate_key(tmp_path / "k.pem")
    b = bundle_with_xclbin(tmp_path, _kernels(), cus=1)
    sign(b.path, priv)
    assert load(b.path, trusted_keys=[pub]).signature_verified
    xb = tmp_path / "again.xclbin"
    fake_xclbin(xb, _kernels(), cus=1)
    record_xclbin(b.path, xb, target="u55c", platform=b.platform, compute_units=b.compute_units)
    assert not (b.path / SIGNATURE_FILE).exists()
    _refused(b.path, "not signed", trusted_keys=[pub])


def test_serve_trusted_key_serves_only_a_bundle_signed_by_it(signed, tmp_path, monkeypatch):
    p, _, pub = signed
    import offload.serve.server as server

    served = []
    monkeypatch.setattr(server, "serve", lambda bundle, *a, **k: served.append(bundle))
    unsigned = save(_kernels(), tmp_path / "u")
    r = CliRunner().invoke(main, ["serve", str(unsigned), "--trusted-key", str(pub)])
    assert r.exit_code == 1 and "not signed" in r.output and not served, r.output
    r = CliRunner().invoke(main, ["serve", str(p), "--trusted-key", str(pub)])
    assert r.exit_code == 0 and served and served[0].signature_verified, r.output
    assert offload.load(p, trusted_keys=[pub]).signature_verified  # the API twin

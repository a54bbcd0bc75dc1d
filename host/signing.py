"""Ed25519 signatures of bundles, through pyca/cryptography: keys, the signed message, the
detached signature document and its verification.

What is signed: the ASCII bytes of :data:`MESSAGE_PREFIX` followed by the manifest's
``manifest_sha256`` (64 lowercase hex digits). That digest covers every field of ``manifest.json``
(``offload.host._manifest``), and the manifest records every other file's size and sha256, so one
signature covers the whole bundle. The prefix keeps a bundle signature from being valid for any
other use of the same key.

The signature travels in the bundle as ``signature.json``::

    {"format": "offload-bundle-signature", "version": 1, "algorithm": "ed25519",
     "manifest_sha256": "<hex>", "public_key_sha256": "<sha256 of the raw 32-byte public key>",
     "signature": "<base64 of the 64-byte signature>"}

Keys are PEM files: the private key PKCS#8 and unencrypted (``openssl genpkey -algorithm ed25519
-out key.pem``), the public key SubjectPublicKeyInfo (``openssl pkey -in key.pem -pubout -out
key.pem.pub``), or :func:`generate_key`.

Example::

    private, public = generate_key("release.pem")      # release.pem (0600) and release.pem.pub
    doc = signature_document(digest, load_private_key(private))
    verify(doc, digest, [load_public_key(public)], "bundle m.offload")   # the key's sha256, or BundleError
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from offload.sim.errors import BundleError, InputError

__all__ = [
    "SIGNATURE_FORMAT",
    "MESSAGE_PREFIX",
    "message",
    "generate_key",
    "load_private_key",
    "load_public_key",
    "key_sha256",
    "signature_document",
    "verify",
]

SIGNATURE_FORMAT = "offload-bundle-signature"
MESSAGE_PREFIX = b"offload-bundle-signature-v1:"
_MAX_KEY_FILE = 16 << 10  # a PEM key is a few hundred bytes


def message(manifest_sha256: str) -> bytes:
    """The bytes a bundle signature signs (see the module docstring)."""
    return MESSAGE_PREFIX + manifest_sha256.encode("ascii")


def _read_key_file(path: str | os.PathLike, what: str) -> bytes:
    p = Path(path)
    if p.stat().st_size > _MAX_KEY_FILE:
        raise InputError(f"{what} {p}: {p.stat().st_size} bytes, over {_MAX_KEY_FILE} for a PEM key file")
    return p.read_bytes()


def generate_key(path: str | os.PathLike) -> tuple[Path, Path]:
    """A new Ed25519 key pair: the private key at ``path`` (PKCS#8 PEM, mode 0600) and the public
    key at ``path + ".pub"``; neither file may exist already. Returns both paths."""
    priv, pub = Path(path), Path(f"{path}.pub")
    key = Ed25519PrivateKey.generate()
    # O_EXCL: an existing file is never replaced; the private key is 0600 from the start, not
    # chmod-ed after it was written.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    fd = os.open(priv, flags, 0o600)
    try:
        pfd = os.open(pub, flags, 0o644)
    except BaseException:
        os.close(fd)
        priv.unlink()
        raise
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    with os.fdopen(pfd, "wb") as f:
        f.write(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def load_private_key(key: str | os.PathLike | Ed25519PrivateKey) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (PKCS#8, unencrypted), or the key itself."""
    if isinstance(key, Ed25519PrivateKey):
        return key
    try:
        k = load_pem_private_key(_read_key_file(key, "private key"), password=None)
    except (ValueError, TypeError) as e:  # not PEM, encrypted, or a key type cryptography cannot read
        raise InputError(f"private key {key}: not an unencrypted PKCS#8 PEM private key ({e})") from None
    if not isinstance(k, Ed25519PrivateKey):
        raise InputError(f"private key {key}: a {type(k).__name__}; bundles are signed with Ed25519 keys")
    return k


def load_public_key(key: str | os.PathLike | Ed25519PublicKey) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (SubjectPublicKeyInfo), or the key itself."""
    if isinstance(key, Ed25519PublicKey):
        return key
    try:
        k = load_pem_public_key(_read_key_file(key, "public key"))
    except (ValueError, TypeError) as e:
        raise InputError(f"public key {key}: not a PEM public key ({e})") from None
    if not isinstance(k, Ed25519PublicKey):
        raise InputError(f"public key {key}: a {type(k).__name__}; bundles are signed with Ed25519 keys")
    return k


def key_sha256(key: Ed25519PublicKey) -> str:
    """The key's name in a signature document: sha256 of its raw 32 bytes, hex."""
    return hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def signature_document(manifest_sha256: str, key: Ed25519PrivateKey) -> dict[str, Any]:
    """The ``signature.json`` contents signing ``manifest_sha256`` with ``key``."""
    return {
        "format": SIGNATURE_FORMAT,
        "version": 1,
        "algorithm": "ed25519",
        "manifest_sha256": manifest_sha256,
        "public_key_sha256": key_sha256(key.public_key()),
        "signature": base64.b64encode(key.sign(message(manifest_sha256))).decode("ascii"),
    }


def verify(doc: Mapping[str, Any] | None, manifest_sha256: str, keys: Iterable[Ed25519PublicKey], where: str) -> str:
    """Check that ``doc`` (a schema-checked signature document, or ``None`` for an unsigned
    bundle) signs ``manifest_sha256`` with one of ``keys``; returns that key's sha256.

    The signature is verified over the manifest's own digest, so a document naming another
    digest cannot pass. Every refusal is a :class:`BundleError`.
    """
    trusted = {key_sha256(k): k for k in keys}
    if doc is None:
        raise BundleError(f"{where}: not signed (no signature.json), and a trusted key is required")
    kid = doc["public_key_sha256"]
    key = trusted.get(kid)
    if key is None:
        raise BundleError(f"{where}: signature.json: signed by key sha256 {kid}, which is not among the {len(trusted)} trusted key(s)")
    try:
        sig = base64.b64decode(doc["signature"], validate=True)
        key.verify(sig, message(manifest_sha256))
    except (InvalidSignature, binascii.Error, ValueError):
        raise BundleError(f"{where}: signature.json: the signature does not verify with trusted key sha256 {kid} "
                          "(the bundle was changed after it was signed, or the signature is forged)") from None
    return kid

"""A bundle's ``manifest.json``: strict parsing, its schema, its limits and its digest.

A manifest comes from whoever copied the bundle, so it is parsed as hostile input: its size and
nesting depth are capped before the JSON parser sees it, duplicate keys and non-finite numbers are
refused, and the parsed document must match :data:`SCHEMA` (validated by ``jsonschema``) before
anything else reads it. Every refusal is a :class:`BundleError` naming the field.

The digest (``manifest_sha256``, format version 2 on) is the sha256 of the canonical JSON of every
other field (sorted keys, no spaces, ASCII escapes), so re-indenting the file keeps it and changing
any value (a dtype's byte order, a shape, a spec) breaks it. It tells an intact bundle from an
edited one; it is no signature: whoever can edit the manifest can recompute it (see SECURITY.md).

Each kernel's ``spec`` is then checked against its kind's own schema (``KernelKind.spec_schema``,
:func:`check_spec`), and a bundle's ``signature.json`` against :data:`SIGNATURE_SCHEMA`
(:func:`check_signature`; what it signs: ``offload.host.signing``).

Example::

    m = parse(data, "bundle m.offload")     # dict, or BundleError
    check(m, "bundle m.offload")            # format, version, schema, digest
    check_spec(m["kernels"][0]["spec"], get_kind("embedding").spec_schema, "bundle m.offload", 0)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from functools import cache
from typing import Any, Mapping

import numpy as np

from offload.sim.errors import BundleError

__all__ = [
    "FORMAT",
    "VERSION",
    "DIGEST_FIELD",
    "DTYPES",
    "MAX_MANIFEST_BYTES",
    "MAX_JSON_DEPTH",
    "SCHEMA",
    "SIGNATURE_FILE",
    "MAX_SIGNATURE_BYTES",
    "SIGNATURE_SCHEMA",
    "parse",
    "check",
    "check_spec",
    "check_signature",
    "digest",
    "seal",
]

FORMAT = "offload-bundle"
# 2: the manifest carries ``manifest_sha256``. Version 1 bundles (no digest) still load; they are
# reported as unsealed (``Bundle.manifest_sha256 is None``).
VERSION = 2
DIGEST_FIELD = "manifest_sha256"

# As safetensors does: a fixed set of little-endian dtypes, spelled as NumPy's ``dtype.str``. A
# byte-order flip (``<i2`` -> ``>i2``) would keep every tensor's sha256 and change every value.
DTYPES = ("|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8")

# An MLP's weights travel in its spec (hls4ml compiles them in), so manifests of wide models reach
# tens of MiB; 64 MiB leaves room while bounding the parser's memory (about 6x the text).
MAX_MANIFEST_BYTES = 64 << 20
# A real manifest nests about 6 deep (manifest > kernels > kernel > spec > tables > table) plus
# whatever ``meta`` holds; CPython's parser fails near 1,000 with a RecursionError.
MAX_JSON_DEPTH = 64
MAX_NAME = 256
MAX_KERNELS = 1024
MAX_TENSORS = 1024
MAX_NDIM = 32
MAX_TENSOR_BYTES = 1 << 44  # 16 TiB: beyond any card's memory, far below int64 overflow
MAX_COMPUTE_UNITS = 64
MAX_RING_SLOTS = 1 << 16  # offload.kernels.ring.RingLayout's bound
MAX_RING_ROWS = 1 << 20

_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME}
_OPT_NAME = {"type": ["string", "null"], "maxLength": MAX_NAME}
_SHA256 = {"type": "string", "pattern": r"^[0-9a-f]{64}\Z"}
_NBYTES = {"type": "integer", "minimum": 0, "maximum": MAX_TENSOR_BYTES}
# File names are plain: no folder other than tensors/, no "..", nothing that needs quoting. ``\Z``,
# not ``$``: Python's ``$`` also matches before a trailing newline.
_TENSOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["file", "shape", "dtype", "nbytes", "sha256"],
    "properties": {
        "file": {"type": "string", "pattern": r"^tensors/[A-Za-z0-9_.-]{1,200}\.bin\Z"},
        "shape": {"type": "array", "maxItems": MAX_NDIM, "items": _NBYTES},
        "dtype": {"enum": list(DTYPES)},
        "nbytes": _NBYTES,
        "sha256": _SHA256,
    },
}
_KERNEL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "kind", "spec", "tensors"],
    "properties": {
        "name": _NAME,
        "kind": {"type": "string", "minLength": 1, "maxLength": 64},
        "spec": {"type": "object"},  # each kind's spec_from_json checks the inside
        "tensors": {
            "type": "object",
            "maxProperties": MAX_TENSORS,
            "propertyNames": _NAME,
            "additionalProperties": _TENSOR,
        },
        # The ring the kernel's persistent top was built for (offload.hls.persistent.ring_layout);
        # absent: built for the defaults (bundles written before the field, or never built so).
        "ring": {
            "type": "object",
            "additionalProperties": False,
            "required": ["slots", "rows"],
            "properties": {
                "slots": {"type": "integer", "minimum": 1, "maximum": MAX_RING_SLOTS},
                "rows": {"type": "integer", "minimum": 1, "maximum": MAX_RING_ROWS},
            },
        },
    },
}
_XCLBIN = {
    "type": "object",
    "additionalProperties": False,
    "required": ["file", "uuid", "target", "platform", "compute_units", "nbytes", "sha256"],
    "properties": {
        "file": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,200}\.xclbin\Z"},
        "uuid": {"type": ["string", "null"], "pattern": r"^[0-9A-Fa-f-]{32,36}\Z"},
        "target": _OPT_NAME,
        "platform": _OPT_NAME,
        "compute_units": {
            "type": "object",
            "maxProperties": MAX_KERNELS,
            "propertyNames": _NAME,
            "additionalProperties": {"type": "array", "maxItems": MAX_COMPUTE_UNITS, "items": _NAME},
        },
        "nbytes": {"type": "integer", "minimum": 1, "maximum": MAX_TENSOR_BYTES},
        "sha256": _SHA256,
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["format", "version", "name", "kernels", "meta", "xclbin"],
    "properties": {
        "format": {"const": FORMAT},
        "version": {"type": "integer", "minimum": 1, "maximum": VERSION},
        "name": {"type": "string", "maxLength": MAX_NAME},
        "kernels": {"type": "array", "minItems": 1, "maxItems": MAX_KERNELS, "items": _KERNEL},
        "meta": {"type": "object"},
        "xclbin": {"oneOf": [{"type": "null"}, _XCLBIN]},
        DIGEST_FIELD: _SHA256,
    },
}

# The detached signature (offload.host.signing) is the one file besides the manifest, the tensors
# and the xclbin that a bundle may hold. It is a few hundred bytes.
SIGNATURE_FILE = "signature.json"
MAX_SIGNATURE_BYTES = 4096
SIGNATURE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["format", "version", "algorithm", "manifest_sha256", "public_key_sha256", "signature"],
    "properties": {
        "format": {"const": "offload-bundle-signature"},
        "version": {"const": 1},
        "algorithm": {"const": "ed25519"},
        "manifest_sha256": _SHA256,
        "public_key_sha256": _SHA256,
        # base64 of Ed25519's 64 bytes: 88 characters, the last two "=" padding.
        "signature": {"type": "string", "pattern": r"^[A-Za-z0-9+/]{86}==\Z"},
    },
}

_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # unrolled: linear, no backtracking blow-up
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def _depth(data: bytes) -> int:
    """Deepest bracket nesting outside strings, without building anything."""
    steps = _STEP[np.frombuffer(_STRINGS.sub(b"", data).translate(None, _NOT_BRACKETS), dtype=np.uint8)]
    depth = deepest = 0
    for i in range(0, steps.size, 1 << 20):  # chunks keep the running sum's memory small
        run = np.cumsum(steps[i:i + (1 << 20)], dtype=np.int64) + depth
        deepest, depth = max(deepest, int(run.max())), int(run[-1])
    return deepest


def parse(data: bytes, where: str) -> Any:
    """The manifest's JSON, parsed strictly: size and depth capped, no duplicate keys, finite numbers."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: manifest.json is {len(data)} bytes, over the limit of {MAX_MANIFEST_BYTES}")
    depth = _depth(data)
    if depth > MAX_JSON_DEPTH:
        raise BundleError(f"{where}: manifest.json nests {depth} levels deep, over the limit of {MAX_JSON_DEPTH}")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        d = dict(items)
        if len(d) != len(items):
            seen: set[str] = set()
            dup = next(k for k, _ in items if k in seen or seen.add(k))
            raise BundleError(f"{where}: manifest.json: key {dup!r} appears twice in one object (readers would disagree on which counts)")
        return d

    def number(text: str) -> float:
        f = float(text)
        if not math.isfinite(f):
            raise BundleError(f"{where}: manifest.json: number {text[:40]} is outside the range of a float")
        return f

    def constant(text: str) -> float:
        raise BundleError(f"{where}: manifest.json: {text} is not JSON")

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_float=number, parse_constant=constant)
    except BundleError:
        raise
    except UnicodeDecodeError as e:
        raise BundleError(f"{where}: manifest.json is not UTF-8: {e}") from None
    except ValueError as e:  # JSONDecodeError, and an integer over Python's digit limit
        raise BundleError(f"{where}: manifest.json is not valid JSON: {e}") from None


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int64_items(validator, value, instance, schema):
    """``"int64Items": true``: every item a JSON integer within int64, in one pass (an MLP's
    constants run to millions of items; jsonschema's per-item ``items`` costs ~16 us each)."""
    from jsonschema.exceptions import ValidationError

    if value and validator.is_type(instance, "array"):
        lo, hi = _INT64
        for i, x in enumerate(instance):
            if type(x) is not int or not lo <= x <= hi:
                yield ValidationError(f"{_short(repr(x), 40)} is not an int64 integer", path=(i,))
                return


@cache
def _strict_validator_class():
    from jsonschema import Draft202012Validator, validators

    # JSON Schema's "integer" admits 2.0 and 1e30; a shape, nbytes or version must be a JSON integer.
    strict = Draft202012Validator.TYPE_CHECKER.redefine("integer", lambda _c, x: isinstance(x, int) and not isinstance(x, bool))
    return validators.extend(Draft202012Validator, {"int64Items": _int64_items}, type_checker=strict)


_VALIDATORS: dict[int, tuple[Mapping[str, Any], Any]] = {}


def _validator(schema: Mapping[str, Any] = SCHEMA):
    """The strict validator of ``schema``, built once per schema object (kinds' schemas are module constants)."""
    hit = _VALIDATORS.get(id(schema))
    if hit is None or hit[0] is not schema:
        hit = _VALIDATORS[id(schema)] = (schema, _strict_validator_class()(schema))
    return hit[1]


def _refuse_invalid(doc: Any, schema: Mapping[str, Any], where: str, label: str, prefix: list) -> None:
    from jsonschema.exceptions import best_match

    err = best_match(_validator(schema).iter_errors(doc))
    if err is not None:
        raise BundleError(f"{where}: {label} {field_path([*prefix, *err.absolute_path])}: {_short(err.message)}")


def field_path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if p.isidentifier() else f"[{json.dumps(p)}]")
    return out.lstrip(".") or "(top level)"


def _short(text: str, n: int = 240) -> str:
    return text if len(text) <= n else text[:n] + "..."


def check(m: Any, where: str) -> str | None:
    """Refuse a manifest that is not this format, version and schema, or whose digest is wrong.

    Returns the digest (``None`` for a version 1 manifest, which has none).
    """
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise BundleError(f"{where}: manifest.json is not an {FORMAT} manifest")
    ver = m.get("version")
    if type(ver) is not int or not 1 <= ver <= VERSION:
        raise BundleError(f"{where}: version: format version {ver!r} is not supported (this offload reads versions 1..{VERSION}; upgrade offload)")
    _refuse_invalid(m, SCHEMA, where, "manifest field", [])
    recorded = m.get(DIGEST_FIELD)
    if recorded is None:
        if ver >= 2:
            raise BundleError(f"{where}: {DIGEST_FIELD}: missing; a version {ver} manifest records its digest")
        return None
    actual = digest(m)
    if actual != recorded:
        raise BundleError(f"{where}: {DIGEST_FIELD}: manifest.json was edited after it was saved (its digest is {actual}, it records {recorded})")
    return actual


def check_spec(spec: Any, schema: Mapping[str, Any], where: str, ki: int) -> None:
    """Refuse kernel ``ki``'s spec unless it matches its kind's ``schema``, naming the field
    (``kernels[0].spec.tables[0].dim``)."""
    _refuse_invalid(spec, schema, where, "manifest field", ["kernels", ki, "spec"])


def check_signature(doc: Any, where: str) -> None:
    """Refuse a ``signature.json`` document off :data:`SIGNATURE_SCHEMA`, naming the field."""
    _refuse_invalid(doc, SIGNATURE_SCHEMA, where, f"{SIGNATURE_FILE} field", [])


def digest(m: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of every field but the digest itself."""
    body = {k: v for k, v in m.items() if k != DIGEST_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def seal(m: Mapping[str, Any]) -> bytes:
    """The manifest's file contents at the current version, with its digest, checked as a reader will.

    The digest is taken over the JSON read back, so it is what a reader computes (tuples became
    lists, keys strings); then the text is checked like a load, so save never writes a manifest
    that load would refuse.
    """
    body = {k: v for k, v in m.items() if k != DIGEST_FIELD}
    body["version"] = VERSION
    back = json.loads(json.dumps(body, allow_nan=False))
    data = (json.dumps({**back, DIGEST_FIELD: digest(back)}, indent=2) + "\n").encode("utf-8")
    check(parse(data, "save"), "save")
    return data

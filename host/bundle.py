"""Bundles: kernels, their resident tensors and (optionally) an xclbin, in one checked directory.

Layout of a bundle directory::

    manifest.json          format + version, kernels (kind, spec.to_json()), tensors (file, shape,
                           dtype, nbytes, sha256), optional xclbin (file, uuid, target, platform,
                           compute units, sha256) and a free ``meta`` dict
    tensors/*.bin          raw little-endian array bytes, C order (no pickle, no code)
    offload.xclbin         optional, recorded by ``offload build --vitis``

Loading checks the format version and every file's size and sha256; a missing, truncated or
altered file is refused with a :class:`BundleError` naming it. Torch is never imported: a bundle
loads and runs on a machine without it.

Example::

    import offload
    offload.save([kernel_a, kernel_b], "model.offload", meta={"model": "ranker-v3"})
    b = offload.load("model.offload")
    handles = open_device("emu").load_bundle(b)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid as _uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from offload.kernels.registry import Kernel, get_kind
from offload.sim.errors import BundleError  # noqa: F401  (re-exported: defined once in the hierarchy)

__all__ = ["Bundle", "BundleError", "save", "load", "record_xclbin", "xclbin_uuid", "FORMAT", "VERSION"]

FORMAT = "offload-bundle"
VERSION = 1
MANIFEST = "manifest.json"
_XCLBIN_NAME = "offload.xclbin"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class Bundle:
    """Kernels plus what is needed to run them on a card.

    ``compute_units`` maps a kernel's top function to its CU instance names in the xclbin
    (``{"offload_embedding_d64": ["offload_embedding_d64_1", "offload_embedding_d64_2"]}``).
    """

    name: str
    kernels: dict[str, Kernel]
    meta: dict[str, Any] = field(default_factory=dict)
    xclbin: Path | None = None
    xclbin_uuid: str | None = None
    target: str | None = None
    platform: str | None = None
    compute_units: dict[str, list[str]] = field(default_factory=dict)
    path: Path | None = None

    def offload_kernels(self) -> list[Kernel]:
        return list(self.kernels.values())


def _as_bundle(obj: Any, name: str | None, meta: Mapping[str, Any] | None) -> Bundle:
    if isinstance(obj, Bundle):
        b = Bundle(obj.name, dict(obj.kernels), dict(obj.meta), obj.xclbin, obj.xclbin_uuid, obj.target, obj.platform, dict(obj.compute_units))
    else:
        if isinstance(obj, Kernel):
            kernels: Iterable[Kernel] = [obj]
        elif hasattr(obj, "offload_kernels"):
            kernels = obj.offload_kernels()
        elif isinstance(obj, (list, tuple)):
            kernels = obj
        else:
            raise TypeError(f"save: expected a Bundle, a Kernel, a list of Kernels or an object with offload_kernels(), got {type(obj).__name__}")
        kmap: dict[str, Kernel] = {}
        for k in kernels:
            if not isinstance(k, Kernel):
                raise TypeError(f"save: {k!r} is not an offload.kernels.Kernel")
            if k.name in kmap:
                raise ValueError(f"save: two kernels are named {k.name!r}; kernel names must be unique in a bundle")
            kmap[k.name] = k
        b = Bundle(name or type(obj).__name__, kmap)
    if name:
        b.name = name
    if meta:
        b.meta.update(meta)
    if not b.kernels:
        raise ValueError("save: no kernels to save")
    try:
        json.dumps(b.meta)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save: meta must be JSON-serialisable (str, numbers, lists, dicts): {e}") from None
    return b


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tensor_entry(root: Path, rel: str, arr: np.ndarray) -> dict[str, Any]:
    a = np.asarray(arr)
    if a.dtype.kind not in "biufc" or a.dtype.hasobject:
        raise TypeError(f"save: tensor {rel} has dtype {a.dtype}; only numeric arrays are stored")
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    data = a.tobytes(order="C")
    (root / rel).write_bytes(data)
    return {"file": rel, "shape": list(a.shape), "dtype": a.dtype.str, "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def save(obj: Any, path: str | os.PathLike, *, name: str | None = None, meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``obj`` (Bundle, Kernel, list of Kernels, or anything with ``offload_kernels()``) to ``path``.

    The directory is written next to its destination and renamed into place, so a reader never
    sees half a bundle. An existing bundle at ``path`` is replaced; any other non-empty directory
    is refused.
    """
    dest = Path(path)
    b = _as_bundle(obj, name or (None if hasattr(obj, "offload_kernels") else dest.stem), meta)
    if dest.exists() and not (dest / MANIFEST).is_file() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"save: {dest} exists and is not an offload bundle; refusing to overwrite it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        (stage / "tensors").mkdir()
        kernels = []
        for ki, (kname, k) in enumerate(b.kernels.items()):
            tensors = {}
            for tname, arr in k.tensors.items():
                rel = f"tensors/{ki:03d}_{_SAFE.sub('_', kname)}.{_SAFE.sub('_', tname)}.bin"
                tensors[tname] = _tensor_entry(stage, rel, arr)
            kernels.append({"name": kname, "kind": k.kind, "spec": k.spec.to_json(), "tensors": tensors})
        manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION, "name": b.name, "kernels": kernels, "meta": b.meta, "xclbin": None}
        if b.xclbin is not None:
            src = Path(b.xclbin)
            shutil.copyfile(src, stage / _XCLBIN_NAME)
            manifest["xclbin"] = _xclbin_entry(stage / _XCLBIN_NAME, b.xclbin_uuid, b.target, b.platform, b.compute_units)
        _write_manifest(stage, manifest)
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
            os.replace(dest, old / "b")
            os.replace(stage, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return dest


def _write_manifest(root: Path, manifest: Mapping[str, Any]) -> None:
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, root / MANIFEST)


def _xclbin_entry(file: Path, uuid: str | None, target: str | None, platform: str | None, cus: Mapping[str, list[str]]) -> dict[str, Any]:
    found = xclbin_uuid(file)
    if uuid and found and uuid.lower() != found.lower():
        raise BundleError(f"xclbin {file}: its UUID is {found}, the bundle expected {uuid}")
    return {
        "file": file.name,
        "uuid": (uuid or found),
        "target": target,
        "platform": platform,
        "compute_units": {k: list(v) for k, v in cus.items()},
        "nbytes": file.stat().st_size,
        "sha256": _sha256(file),
    }


def xclbin_uuid(path: str | os.PathLike) -> str | None:
    """The UUID of an xclbin, as ``pyxrt.xclbin(path).get_uuid().to_string()`` prints it.

    pyxrt is asked when it is installed; otherwise the axlf header is read directly (magic
    ``xclbin2\\0``; the header starts at byte 304 and its ``uuid`` field lies 112 bytes in, per
    XRT's ``xclbin.h``). ``None`` when neither can tell.
    """
    p = Path(path)
    try:
        import pyxrt  # type: ignore[import-not-found]

        return pyxrt.xclbin(str(p)).get_uuid().to_string()
    except ImportError:
        pass
    except Exception:  # pyxrt cannot parse it: fall back to the header, which reports why not
        pass
    with open(p, "rb") as f:
        head = f.read(448)
    if len(head) >= 432 and head[:8] == b"xclbin2\0":
        return str(_uuid.UUID(bytes=head[416:432]))
    return None


def record_xclbin(
    bundle_path: str | os.PathLike,
    xclbin: str | os.PathLike,
    *,
    target: str | None,
    platform: str | None,
    compute_units: Mapping[str, list[str]] | None = None,
    uuid: str | None = None,
) -> Bundle:
    """Copy a built xclbin into the bundle and record its UUID, target card and compute units."""
    root = Path(bundle_path)
    b = load(root)  # verifies the rest first
    shutil.copyfile(xclbin, root / (_XCLBIN_NAME + ".tmp"))
    os.replace(root / (_XCLBIN_NAME + ".tmp"), root / _XCLBIN_NAME)
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["xclbin"] = _xclbin_entry(root / _XCLBIN_NAME, uuid, target, platform, compute_units or {})
    _write_manifest(root, manifest)
    return load(root)


def _checked_file(root: Path, entry: Mapping[str, Any], what: str) -> Path:
    rel = entry.get("file")
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise BundleError(f"bundle {root}: {what} names an invalid file {rel!r}")
    p = root / rel
    if not p.is_file():
        raise BundleError(f"bundle {root}: {what} file {rel} is missing")
    size = p.stat().st_size
    if size != entry.get("nbytes"):
        raise BundleError(f"bundle {root}: {what} file {rel} has {size} bytes, the manifest records {entry.get('nbytes')} (truncated or replaced)")
    if _sha256(p) != entry.get("sha256"):
        raise BundleError(f"bundle {root}: {what} file {rel} does not match its sha256 (altered or corrupt)")
    return p


def _load_tensor(root: Path, entry: Mapping[str, Any], what: str) -> np.ndarray:
    try:
        dtype = np.dtype(entry["dtype"])
        shape = tuple(int(s) for s in entry["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"bundle {root}: {what} has a malformed shape/dtype entry: {e}") from None
    if dtype.kind not in "biufc" or dtype.hasobject:
        raise BundleError(f"bundle {root}: {what} has non-numeric dtype {dtype}")
    p = _checked_file(root, entry, what)
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != entry["nbytes"]:
        raise BundleError(f"bundle {root}: {what} shape {shape} x {dtype} does not match {entry['nbytes']} bytes")
    arr = np.fromfile(p, dtype=dtype).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def load(path: str | os.PathLike) -> Bundle:
    """Read and verify a bundle directory written by :func:`save`."""
    root = Path(path)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{root} is not an offload bundle: {MANIFEST} is missing")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"bundle {root}: {MANIFEST} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"bundle {root}: {MANIFEST} is not an {FORMAT} manifest")
    ver = manifest.get("version")
    if not isinstance(ver, int) or ver > VERSION or ver < 1:
        raise BundleError(f"bundle {root}: format version {ver!r} is not supported (this offload reads versions 1..{VERSION}; upgrade offload)")
    kernels: dict[str, Kernel] = {}
    for ke in manifest.get("kernels") or []:
        kname, kind_name = ke.get("name"), ke.get("kind")
        try:
            kind = get_kind(kind_name)
        except KeyError as e:
            raise BundleError(f"bundle {root}: kernel {kname!r} has unknown kind {kind_name!r} ({e.args[0]})") from None
        try:
            spec = kind.spec_from_json(ke["spec"])
        except Exception as e:
            raise BundleError(f"bundle {root}: kernel {kname!r}: invalid {kind_name} spec: {e}") from e
        tensors = {t: _load_tensor(root, te, f"tensor {kname}.{t}") for t, te in (ke.get("tensors") or {}).items()}
        kernels[kname] = Kernel(kname, spec, tensors)
    if not kernels:
        raise BundleError(f"bundle {root}: holds no kernels")
    b = Bundle(str(manifest.get("name") or root.name), kernels, dict(manifest.get("meta") or {}), path=root)
    xe = manifest.get("xclbin")
    if xe:
        b.xclbin = _checked_file(root, xe, "xclbin")
        b.xclbin_uuid = xe.get("uuid")
        b.target = xe.get("target")
        b.platform = xe.get("platform")
        b.compute_units = {k: list(v) for k, v in (xe.get("compute_units") or {}).items()}
    return b

"""Bundles: kernels, their resident tensors and (optionally) an xclbin, in one checked directory.

Layout of a bundle directory::

    manifest.json          format + version, kernels (kind, spec.to_json(), the ring its persistent
                           top was built for when recorded), tensors (file, shape,
                           dtype, nbytes, sha256), optional xclbin (file, uuid, target, platform,
                           compute units, sha256), a free ``meta`` dict, and ``manifest_sha256``:
                           the digest of everything else (see ``offload.host._manifest``)
    tensors/*.bin          raw little-endian array bytes, C order (no pickle, no code)
    offload.xclbin         optional, recorded by ``offload build --vitis``
    signature.json         optional, an Ed25519 signature of the manifest digest (:func:`sign`,
                           ``offload.host.signing``)

A bundle is hostile input until checked. Loading refuses, with a :class:`BundleError` naming the
field or file: a manifest over its size or depth limit or off its schema; a kernel spec off its
kind's schema (``KernelKind.spec_schema``: every field typed and ranged); an edited manifest (its
digest); a signature that is malformed or made for another manifest; a symbolic link or anything
but a regular file inside the folder, and any file the manifest does not name; files declaring
more than ``max_bundle_bytes`` in all; a tensor whose declared shape x dtype is not its nbytes, its
file size or the shape its kernel's spec needs (all before a byte of it is read); a file with holes
(sparse: its claimed bytes are not on disk); a missing, truncated or altered file (sha256); and
tensors the kernel's kind refuses (``check_tensors``, the check a device runs at load). Tensors of
16 MiB or more are memory-mapped read-only rather than read whole. Version 1 bundles (written
before the digest) still load, with ``manifest_sha256 = None`` and an
:class:`UnsealedBundleWarning`, unless ``require_sealed`` or ``trusted_keys`` is given. With
``trusted_keys`` the bundle must carry a signature by one of them. Torch is never imported: a
bundle loads and runs on a machine without it.

Launch. A kernel's persistent top (``offload.hls.persistent``) is compiled for one ring: ``slots``
requests in flight, ``rows`` rows a request. ``save(..., rings=)`` and ``record_xclbin(...,
rings=)`` (what ``offload build`` calls) record it per kernel (``Bundle.rings``). The emu and xrt
devices' ``load_bundle`` open each kernel's ring at that size, and refuse a device opened for
another with a :class:`BundleError` naming both. A kernel without the field (an older bundle, or an
xclbin built outside ``offload build``) opens at the device's ``ring_slots``/``ring_rows`` where
given, else at :data:`DEFAULT_RING`: the size its loop was compiled for is then the caller's word. ``load(..., launch=)`` checks the bundle can run that way
(persistent: every kernel's kind has a ring, and a recorded xclbin holds every ``<top>_ring``);
:meth:`Bundle.open` opens a device in that mode and loads the bundle onto it.

Example::

    import offload
    offload.save([kernel_a, kernel_b], "model.offload", meta={"model": "ranker-v3"})
    offload.host.bundle.sign("model.offload", "release.pem")
    b = offload.load("model.offload", trusted_keys=["release.pem.pub"])
    handles = open_device("emu").load_bundle(b)
    dev, handles = offload.load("model.offload", launch="persistent").open("emu")
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import uuid as _uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

import numpy as np

from offload.hls import persistent
from offload.hls.cards import LAUNCH_CHOICES
from offload.hls.registry import get_hls_kind
from offload.host import _manifest, signing
from offload.host._manifest import DTYPES, FORMAT, MAX_RING_ROWS, MAX_RING_SLOTS, SIGNATURE_FILE, VERSION
from offload.kernels.registry import Kernel, get_kind
from offload.kernels.ring import RING_CAPACITY
from offload.sim.errors import BundleError, InputError, UnsupportedError  # noqa: F401  (BundleError re-exported: defined once in the hierarchy)

__all__ = [
    "Bundle",
    "BundleError",
    "RingSize",
    "DEFAULT_RING",
    "UnsealedBundleWarning",
    "KernelSource",
    "save",
    "load",
    "sign",
    "record_xclbin",
    "xclbin_uuid",
    "FORMAT",
    "VERSION",
    "DTYPES",
    "MMAP_MIN_BYTES",
    "MAX_BUNDLE_BYTES",
    "SIGNATURE_FILE",
]

MANIFEST = "manifest.json"
# Tensors this large are memory-mapped (read-only) instead of copied into memory at load.
MMAP_MIN_BYTES = 16 << 20
# load()'s default bound on the bytes a bundle's files may declare (tensors and xclbin together),
# checked before any is opened: the largest card offload targets holds 64 GiB (the U250's DDR), and
# hashing that much takes about a minute. Pass a larger max_bundle_bytes for bigger host-only models.
MAX_BUNDLE_BYTES = 64 << 30


class UnsealedBundleWarning(UserWarning):
    """A version 1 bundle was loaded: its manifest has no digest, so an edit to it goes unnoticed."""


@dataclass(frozen=True)
class RingSize:
    """The ring a kernel's persistent top was built for: ``slots`` requests in flight, ``rows``
    rows (bags per table, samples) a request (``offload.hls.persistent.ring_layout``).

    Example::

        RingSize(slots=4, rows=64)
    """

    slots: int
    rows: int

    def __post_init__(self) -> None:
        for name, v, hi in (("slots", self.slots, MAX_RING_SLOTS), ("rows", self.rows, MAX_RING_ROWS)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise InputError(f"ring {name}: {v!r} is not an integer in [1, {hi}]")

    def to_json(self) -> dict[str, int]:
        return {"slots": self.slots, "rows": self.rows}


DEFAULT_RING = RingSize(persistent.DEFAULT_SLOTS, persistent.DEFAULT_ROWS)
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
    manifest_sha256: str | None = None  # the verified digest of a loaded manifest; None: version 1
    # The sha256 of the Ed25519 key that signature.json names (None: unsigned), and whether load
    # verified the signature with it (only when that key was among its trusted_keys).
    signature_key: str | None = None
    signature_verified: bool = False
    # kernel name -> the ring its persistent top was built for, where recorded (else DEFAULT_RING)
    rings: dict[str, RingSize] = field(default_factory=dict)
    # load(launch=): the launch mode asked for (None: not asked), and why not persistent where
    # "auto" cannot be (the bundle's side; the device's is asked at open)
    launch: str | None = None
    launch_why: str = ""

    def offload_kernels(self) -> list[Kernel]:
        return list(self.kernels.values())

    def ring(self, kernel: str) -> RingSize:
        """The ring ``kernel``'s persistent top was built for (:data:`DEFAULT_RING` when unrecorded)."""
        if kernel not in self.kernels:
            raise InputError(f"bundle {self.name!r} has no kernel {kernel!r}; it has {sorted(self.kernels)}")
        return self.rings.get(kernel, DEFAULT_RING)

    def xclbin_lacks(self, launch: str) -> list[str] | None:
        """The top functions ``launch`` (``"per_call"``: each kernel's kind's top; ``"persistent"``:
        each ``<top>_ring`` loop) needs that this bundle's xclbin does not hold, sorted; None when
        there is no xclbin, or it records no compute units (then only the card can tell).

        Example::

            if b.xclbin_lacks("persistent"):
                print("rebuild with `offload build BUNDLE --launch both --vitis`")
        """
        if self.xclbin is None or not self.compute_units:
            return None
        top = persistent.top_name if launch == "persistent" else (lambda spec: get_hls_kind(spec.kind).top_name(spec))
        return sorted({top(k.spec) for k in self.kernels.values()} - set(self.compute_units))

    def ring_sizes_for(self, device: str, ring_slots: int | None, ring_rows: int | None) -> dict[str, tuple[int, int]]:
        """``kernel -> (slots, rows)`` of every recorded ring, for ``device`` opened with
        ``ring_slots``/``ring_rows`` (None: not given). A size given that differs from the one a
        persistent top was built for is a :class:`BundleError` naming both, raised before anything loads."""
        sizes = {}
        for name, r in self.rings.items():
            for what, mine, built in (("ring_slots", ring_slots, r.slots), ("ring_rows", ring_rows, r.rows)):
                if mine is not None and mine != built:
                    raise BundleError(f"bundle {self.name!r}: kernel {name!r}: its persistent top was built for a ring of {r.slots} slots of "
                                      f"{r.rows} rows, and device {device!r} was opened with {what}={mine}; open it without {what} "
                                      "to use the bundle's")
            sizes[name] = (r.slots, r.rows)
        return sizes

    def open(self, device: str | None = None, launch: str | None = None) -> tuple[Any, dict[str, Any]]:
        """Open ``device`` (a spec, default ``$OFFLOAD_DEVICE`` or sim) in ``launch`` mode (default
        the one ``load(launch=)`` checked, else per call; ``"auto"``: persistent where both the
        bundle and the device can) and load every kernel; ``(device, kernel name -> handle)``.
        A device that cannot load the bundle is closed before the error reaches the caller.

        Example::

            dev, h = offload.load("model.offload", launch="persistent").open("emu")
            dev.run(h["emb0"], inputs)
        """
        from offload.host.device import launch_modes, open_device

        mode = launch or self.launch or "per_call"
        if mode not in LAUNCH_CHOICES:
            raise InputError(f"launch: {mode!r} is not one of {list(LAUNCH_CHOICES)}")
        if mode != "per_call":
            why = _persistence_problem(self)
            if why and mode == "persistent":
                raise UnsupportedError(f"bundle {self.name!r}: launch='persistent' is not possible: {why}")
            if mode == "auto":
                mode = "persistent" if not why and "persistent" in launch_modes(device) else "per_call"
        dev = open_device(device, launch=mode)
        try:
            return dev, dev.load_bundle(self)
        except BaseException:
            dev.close()
            raise


@runtime_checkable
class KernelSource(Protocol):
    """What ``save`` accepts besides kernels and bundles: an object that lists its kernels (the
    ``offload.nn`` modules and a partitioned model do). A protocol, so this torch-free layer needs
    no import of the torch modules that implement it."""

    def offload_kernels(self) -> list[Kernel]: ...


def _as_bundle(obj: Any, name: str | None, meta: Mapping[str, Any] | None) -> Bundle:
    if isinstance(obj, Bundle):
        b = Bundle(obj.name, dict(obj.kernels), dict(obj.meta), obj.xclbin, obj.xclbin_uuid, obj.target, obj.platform, dict(obj.compute_units),
                   rings=dict(obj.rings))
    else:
        if isinstance(obj, Kernel):
            kernels: Iterable[Kernel] = [obj]
        elif isinstance(obj, KernelSource):
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
        json.dumps(b.meta, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save: meta must be JSON-serialisable (str, finite numbers, lists, dicts): {e}") from None
    return b


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tensor_entry(root: Path, rel: str, arr: np.ndarray) -> dict[str, Any]:
    a = np.asarray(arr)
    if a.dtype.newbyteorder("<").str not in DTYPES:
        raise TypeError(f"save: tensor {rel} has dtype {a.dtype}; a bundle stores only {', '.join(DTYPES)}")
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    data = a.tobytes(order="C")
    (root / rel).write_bytes(data)
    return {"file": rel, "shape": list(a.shape), "dtype": a.dtype.str, "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _ring_sizes(rings: Mapping[str, Any], kernels: Iterable[str], where: str) -> dict[str, RingSize]:
    """``rings`` (kernel name -> RingSize or ``{"slots", "rows"}``) checked against the kernels' names."""
    names = set(kernels)
    out = {}
    for k, r in rings.items():
        if k not in names:
            raise InputError(f"{where}: rings: no kernel {k!r} in the bundle (it has {sorted(names)})")
        if isinstance(r, Mapping) and set(r) == {"slots", "rows"}:
            r = RingSize(r["slots"], r["rows"])
        if not isinstance(r, RingSize):
            raise InputError(f"{where}: rings[{k!r}]: expected a RingSize or {{'slots': int, 'rows': int}}, got {r!r}")
        out[k] = r
    return out


def save(obj: Any, path: str | os.PathLike, *, name: str | None = None, meta: Mapping[str, Any] | None = None,
         rings: Mapping[str, Any] | None = None) -> Path:
    """Write ``obj`` (Bundle, Kernel, list of Kernels, or anything with ``offload_kernels()``) to ``path``.

    ``rings``: kernel name -> the ring its persistent top is built for (:class:`RingSize` or
    ``{"slots", "rows"}``), recorded in the manifest (a Bundle's own ``rings`` are kept).
    The directory is written next to its destination and renamed into place, so a reader never
    sees half a bundle. An existing bundle at ``path`` is replaced; any other non-empty directory
    is refused.
    """
    dest = Path(path)
    b = _as_bundle(obj, name or (None if isinstance(obj, KernelSource) else dest.stem), meta)
    b.rings.update(_ring_sizes(rings or {}, b.kernels, "save"))
    if dest.exists() and not (dest / MANIFEST).is_file() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"save: {dest} exists and is not an offload bundle; refusing to overwrite it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp: mkdtemp makes 0700 whatever the umask, and the stage becomes the bundle.
    stage = dest.parent / f".{dest.name}.{secrets.token_hex(8)}"
    stage.mkdir()
    try:
        (stage / "tensors").mkdir()
        kernels = []
        for ki, (kname, k) in enumerate(b.kernels.items()):
            tensors = {}
            for ti, (tname, arr) in enumerate(k.tensors.items()):
                # The indices keep names unique after sanitising ("a.b" and "a_b"); the cut keeps
                # them under the file system's 255 bytes.
                rel = f"tensors/{ki:03d}_{ti:03d}_{_SAFE.sub('_', kname)[:64]}.{_SAFE.sub('_', tname)[:64]}.bin"
                tensors[tname] = _tensor_entry(stage, rel, arr)
            kernels.append({"name": kname, "kind": k.kind, "spec": k.spec.to_json(), "tensors": tensors,
                            **({"ring": b.rings[kname].to_json()} if kname in b.rings else {})})
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
    # One file holds the manifest and its digest, so one rename replaces both at once.
    tmp = root / (MANIFEST + ".tmp")
    tmp.unlink(missing_ok=True)  # never write through a planted link
    tmp.write_bytes(_manifest.seal(manifest))
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
    rings: Mapping[str, Any] | None = None,
) -> Bundle:
    """Copy a built xclbin into the bundle and record its UUID, target card and compute units;
    ``rings`` (kernel name -> :class:`RingSize` or ``{"slots", "rows"}``): the rings its persistent
    tops were built for, recorded on those kernels."""
    root = Path(bundle_path)
    before = load(root)  # verifies the rest first
    sizes = _ring_sizes(rings or {}, before.kernels, f"bundle {root}")
    (root / (_XCLBIN_NAME + ".tmp")).unlink(missing_ok=True)  # never write through a planted link
    shutil.copyfile(xclbin, root / (_XCLBIN_NAME + ".tmp"))
    os.replace(root / (_XCLBIN_NAME + ".tmp"), root / _XCLBIN_NAME)
    manifest = _manifest.parse((root / MANIFEST).read_bytes(), f"bundle {root}")
    manifest["xclbin"] = _xclbin_entry(root / _XCLBIN_NAME, uuid, target, platform, compute_units or {})
    for ke in manifest["kernels"]:
        if ke["name"] in sizes:
            ke["ring"] = sizes[ke["name"]].to_json()
    _write_manifest(root, manifest)
    # The manifest changed, so a signature of the old one no longer holds: sign the bundle again.
    (root / SIGNATURE_FILE).unlink(missing_ok=True)
    return load(root)


def sign(bundle_path: str | os.PathLike, key: str | os.PathLike | Any) -> Path:
    """Sign the bundle's manifest digest with an Ed25519 private key (a PEM file or the key) and
    write the detached ``signature.json`` into the bundle, replacing any earlier one. The bundle is
    loaded and verified first and must be sealed (format version 2). Returns the signature's path.

    Example::

        sign("model.offload", "release.pem")
        offload.load("model.offload", trusted_keys=["release.pem.pub"])
    """
    root = Path(bundle_path)
    private = signing.load_private_key(key)
    digest = load(root, require_sealed=True).manifest_sha256
    assert digest is not None  # require_sealed
    data = (json.dumps(signing.signature_document(digest, private), indent=2) + "\n").encode("ascii")
    tmp = root / (SIGNATURE_FILE + ".tmp")
    tmp.unlink(missing_ok=True)  # never write through a planted link
    tmp.write_bytes(data)
    os.replace(tmp, root / SIGNATURE_FILE)
    return root / SIGNATURE_FILE


# ------------------------------------------------------------------------------------------ load

_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in a bundle must not wait for a writer (fstat refuses it next).
_FILE_FLAGS = _NOFOLLOW | os.O_NONBLOCK


def _open_step(dfd: int, part: str, flags: int, here: str, rel: str, where: str, what: str) -> int:
    try:
        return os.open(part, flags, dir_fd=dfd)
    except FileNotFoundError:
        raise BundleError(f"{where}: {what} file {rel} is missing") from None
    except OSError as e:
        # A link fails as ELOOP (a file) or ENOTDIR (O_DIRECTORY on Linux): ask what it is.
        try:
            link = stat.S_ISLNK(os.stat(part, dir_fd=dfd, follow_symlinks=False).st_mode)
        except OSError:  # gone meanwhile: report the open's error
            link = False
        if link:
            raise BundleError(f"{where}: {what}: {here} is a symbolic link; a bundle may hold only its own regular files") from None
        if e.errno == errno.ENOTDIR:
            raise BundleError(f"{where}: {what}: {here} is not a folder") from None
        raise BundleError(f"{where}: {what} file {rel} cannot be opened: {e.strerror}") from None


def _open_inside(root_fd: int, rel: str, where: str, what: str) -> tuple[Any, int]:
    """Open ``rel`` below the bundle folder: every component a real folder or regular file, none a link.

    Each step is opened relative to the one before (``dir_fd``) with ``O_NOFOLLOW``, so a link
    swapped in between a check and the open is still refused. Returns ``(binary file, size)``.
    """
    *folders, name = rel.split("/")
    opened: list[int] = []
    try:
        dfd = root_fd
        for i, part in enumerate(folders):
            dfd = _open_step(dfd, part, _NOFOLLOW | os.O_DIRECTORY, "/".join(folders[:i + 1]), rel, where, what)
            opened.append(dfd)
        fd = _open_step(dfd, name, _FILE_FLAGS, rel, rel, where, what)
    finally:
        for d in opened:
            os.close(d)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BundleError(f"{where}: {what}: {rel} is not a regular file")
    return os.fdopen(fd, "rb"), st.st_size


def _first_hole(fd: int, size: int) -> int:
    """Where the file's first hole starts (``size``: none), from ``lseek(SEEK_HOLE)``: one call,
    before any byte is read. File systems without hole reporting answer ``size``."""
    if size == 0 or not hasattr(os, "SEEK_HOLE"):
        return size
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:  # EINVAL: this file system cannot tell
        return size
    finally:
        os.lseek(fd, 0, os.SEEK_SET)


def _hash_and_read(f: Any, nbytes: int, keep: bool) -> tuple[str, bytes | None]:
    h = hashlib.sha256()
    if keep:
        data = f.read(nbytes)
        h.update(data)
        return h.hexdigest(), data
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while n := f.readinto(buf):
        h.update(view[:n])
    return h.hexdigest(), None


def _checked_file(root_fd: int, entry: Mapping[str, Any], where: str, what: str, keep: bool) -> tuple[Any, bytes | None]:
    """Open the file, compare its size to ``nbytes`` (before reading), then its sha256."""
    rel, nbytes = entry["file"], entry["nbytes"]
    f, size = _open_inside(root_fd, rel, where, what)
    try:
        if size != nbytes:
            raise BundleError(f"{where}: {what} file {rel} has {size} bytes, the manifest records {nbytes} (truncated or replaced)")
        hole = _first_hole(f.fileno(), size)
        if hole < size:
            raise BundleError(f"{where}: {what} file {rel} has a hole at byte {hole} of its {size}: a sparse file claims "
                              "bytes that are not on disk; a bundle's files are written whole")
        digest, data = _hash_and_read(f, nbytes, keep)
        if digest != entry["sha256"] or (data is not None and len(data) != nbytes):
            raise BundleError(f"{where}: {what} file {rel} does not match its sha256 (altered or corrupt)")
    except BaseException:
        f.close()
        raise
    return f, data


def _read_tensor(root_fd: int, entry: Mapping[str, Any], where: str, what: str) -> np.ndarray:
    dtype, shape, nbytes = np.dtype(entry["dtype"]), tuple(entry["shape"]), entry["nbytes"]
    big = nbytes >= MMAP_MIN_BYTES
    f, data = _checked_file(root_fd, entry, where, what, keep=not big)
    with f:
        # Read-only either way: a loaded bundle is what was verified; np.memmap keeps its own mapping.
        arr = np.memmap(f, dtype=dtype, mode="r", shape=shape) if big else np.frombuffer(data, dtype=dtype).reshape(shape)
    if not arr.dtype.isnative:  # a big-endian host: one converted copy
        arr = arr.astype(arr.dtype.newbyteorder("="))
        arr.setflags(write=False)
    return arr


def _declared(where: str, ki: int, kname: str, kind: Any, spec: Any, tensors: Mapping[str, Any]) -> None:
    """Shapes, dtypes and sizes as the manifest declares them, against each other and the spec."""
    for t, te in tensors.items():
        field = _manifest.field_path(["kernels", ki, "tensors", t])
        count = 1
        for s in te["shape"]:
            count *= s
        if count * np.dtype(te["dtype"]).itemsize != te["nbytes"]:
            raise BundleError(f"{where}: {field}.nbytes: shape {te['shape']} x {te['dtype']} is {count * np.dtype(te['dtype']).itemsize} bytes, the manifest records {te['nbytes']}")
    if kind.tensor_shapes is None:
        return
    want = {n: list(s) for n, s in kind.tensor_shapes(spec).items()}
    if set(want) != set(tensors):
        raise BundleError(f"{where}: kernels[{ki}].tensors: kernel {kname!r} ({kind.name}) needs tensors {sorted(want)}, the manifest lists {sorted(tensors)}")
    for t, te in tensors.items():
        if te["shape"] != want[t]:
            raise BundleError(f"{where}: {_manifest.field_path(['kernels', ki, 'tensors', t, 'shape'])}: {te['shape']} contradicts kernel {kname!r}'s spec, which needs {want[t]}")


def _read_small(root_fd: int, rel: str, limit: int, where: str, what: str) -> bytes:
    f, size = _open_inside(root_fd, rel, where, what)
    with f:
        if size > limit:  # refused before reading it
            raise BundleError(f"{where}: {rel} is {size} bytes, over the limit of {limit}")
        return f.read(limit + 1)


def _exists(root_fd: int, rel: str) -> bool:
    try:
        os.stat(rel, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _read_manifest(root_fd: int, where: str) -> Any:
    if not _exists(root_fd, MANIFEST):
        raise BundleError(f"{where} is not an offload bundle: {MANIFEST} is missing")
    return _manifest.parse(_read_small(root_fd, MANIFEST, _manifest.MAX_MANIFEST_BYTES, where, "manifest"), where)


def _read_signature(root_fd: int, where: str, digest: str | None) -> dict[str, Any] | None:
    """The bundle's signature document (``None``: unsigned), checked for form and for being made
    for this manifest; whether it verifies is ``signing.verify``'s question, asked with keys."""
    if not _exists(root_fd, SIGNATURE_FILE):
        return None
    doc = _manifest.parse(_read_small(root_fd, SIGNATURE_FILE, _manifest.MAX_SIGNATURE_BYTES, where, "signature"), where)
    _manifest.check_signature(doc, where)
    if digest is None:
        raise BundleError(f"{where}: {SIGNATURE_FILE}: the manifest has no digest to sign (format version 1): "
                          "a signed bundle was downgraded, or the signature does not belong here")
    if doc["manifest_sha256"] != digest:
        raise BundleError(f"{where}: {SIGNATURE_FILE}: it signs manifest digest {doc['manifest_sha256']}, this manifest's is {digest} "
                          "(the manifest was changed after signing, or the bundle was re-saved: sign it again)")
    return doc


def _only_named_files(root_fd: int, where: str, named: set[str]) -> None:
    """Refuse any entry of the bundle folder, or of its ``tensors/``, that is not in ``named``."""
    top = {n for n in named if "/" not in n} | {"tensors"}
    tensors = {n[len("tensors/"):] for n in named if n.startswith("tensors/")}
    with os.scandir(root_fd) as it:
        extra = next((e.name for e in it if e.name not in top), None)
    if extra is None and _exists(root_fd, "tensors"):
        tfd = _open_step(root_fd, "tensors", _NOFOLLOW | os.O_DIRECTORY, "tensors", "tensors", where, "tensors")
        try:
            with os.scandir(tfd) as it:
                extra = next(("tensors/" + e.name for e in it if e.name not in tensors), None)
        finally:
            os.close(tfd)
    if extra is not None:
        raise BundleError(f"{where}: {extra}: not part of the bundle (its manifest does not name it); "
                          "a bundle holds only the files its manifest lists")


def _persistence_problem(b: Bundle) -> str:
    """Why ``b``'s kernels cannot run persistent ("" when they can, as far as the bundle tells)."""
    for kname, k in b.kernels.items():
        if k.kind not in RING_CAPACITY:
            return f"kernel {kname!r}: the {k.kind} kind has no ring (no ring capacity registered), so no persistent top"
    missing = b.xclbin_lacks("persistent")
    if missing:
        return (f"its xclbin lacks the persistent top(s) {', '.join(missing)}: rebuild it with "
                "`offload build BUNDLE --launch both --vitis`")
    return ""


def load(path: str | os.PathLike, *, require_sealed: bool = False, trusted_keys: Iterable[Any] | None = None,
         max_bundle_bytes: int = MAX_BUNDLE_BYTES, launch: str | None = None) -> Bundle:
    """Read and verify a bundle directory written by :func:`save` (see the module's docstring).

    ``require_sealed``: refuse a version 1 bundle (no manifest digest) instead of warning.
    ``trusted_keys``: Ed25519 public keys (PEM file paths or key objects); the bundle must be sealed
    and carry a signature (``signature.json``, see :func:`sign`) by one of them.
    ``max_bundle_bytes``: the most bytes its tensor and xclbin files may declare in all
    (:data:`MAX_BUNDLE_BYTES` by default), checked before any of them is opened.
    ``launch``: ``"per_call"``, ``"persistent"`` (refused with :class:`UnsupportedError` naming the
    reason when a kernel's kind has no ring or the recorded xclbin lacks a persistent top) or
    ``"auto"`` (``Bundle.launch_why`` says why not persistent where it cannot be); kept as
    ``Bundle.launch``, the mode :meth:`Bundle.open` opens a device in.

    Example::

        b = load("model.offload", trusted_keys=["release.pem.pub"])
        b.signature_verified, b.signature_key        # True, the signing key's sha256
        dev, handles = load("model.offload", launch="persistent").open("emu")
    """
    if launch is not None and launch not in LAUNCH_CHOICES:
        raise InputError(f"launch: {launch!r} is not one of {list(LAUNCH_CHOICES)}")
    keys = None if trusted_keys is None else [signing.load_public_key(k) for k in trusted_keys]
    if keys is not None and not keys:
        raise InputError("trusted_keys: empty; pass None to load without a signature check")
    root, where = Path(path), f"bundle {path}"
    try:
        # The folder itself may be reached through a link (deployments swap one to switch
        # bundles); it is opened once, and everything inside is opened relative to it.
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BundleError(f"{root} is not an offload bundle: no such folder") from None
    except NotADirectoryError:
        raise BundleError(f"{root} is not an offload bundle: not a folder") from None
    except OSError as e:
        raise BundleError(f"{root}: cannot open the bundle folder: {e.strerror}") from None
    try:
        b = _load(root, root_fd, where, require_sealed or keys is not None, keys, max_bundle_bytes)
    finally:
        os.close(root_fd)
    if launch is not None:
        b.launch, b.launch_why = launch, _persistence_problem(b) if launch != "per_call" else ""
        if b.launch_why and launch == "persistent":
            raise UnsupportedError(f"{where}: launch='persistent' is not possible: {b.launch_why}")
    return b


def _load(root: Path, root_fd: int, where: str, require_sealed: bool, keys: list | None, max_bundle_bytes: int) -> Bundle:
    manifest = _read_manifest(root_fd, where)
    sealed = _manifest.check(manifest, where)
    if sealed is None:
        if require_sealed:
            raise BundleError(f"{where}: {_manifest.DIGEST_FIELD}: the bundle is not sealed (format version 1, no manifest digest) "
                              "and a sealed bundle is required; re-save it to seal it: offload.save(offload.load(path), path)")
        warnings.warn(f"{where}: not sealed (format version 1, no manifest digest): an edit to its manifest goes unnoticed; "
                      "re-save it to seal it, or load with require_sealed=True to refuse such bundles", UnsealedBundleWarning, stacklevel=3)
    signature = _read_signature(root_fd, where, sealed)
    # Before any tensor is read: a bundle without a trusted signature costs nothing to refuse.
    signer = None if keys is None else signing.verify(signature, sealed or "", keys, where)

    names: set[str] = set()
    files: set[str] = set()
    declared = 0
    for ki, ke in enumerate(manifest["kernels"]):
        if ke["name"] in names:
            raise BundleError(f"{where}: kernels[{ki}].name: two kernels are named {ke['name']!r}")
        names.add(ke["name"])
        for t, te in ke["tensors"].items():
            if te["file"] in files:  # one file read as two tensors would alias them
                raise BundleError(f"{where}: {_manifest.field_path(['kernels', ki, 'tensors', t, 'file'])}: {te['file']} is named by another tensor too")
            files.add(te["file"])
            declared += te["nbytes"]
    xe = manifest["xclbin"]
    if xe is not None:
        declared += xe["nbytes"]
    if declared > max_bundle_bytes:
        raise BundleError(f"{where}: its files declare {declared} bytes in all, over max_bundle_bytes={max_bundle_bytes}; "
                          "load it with a larger max_bundle_bytes if that size is expected")

    # Every declaration is checked against its spec before any tensor's bytes are read.
    plan = []
    for ki, ke in enumerate(manifest["kernels"]):
        kname, kind_name = ke["name"], ke["kind"]
        try:
            kind = get_kind(kind_name)
        except KeyError as e:
            raise BundleError(f"{where}: kernels[{ki}].kind: kernel {kname!r} has unknown kind {kind_name!r} ({e.args[0]})") from None
        if kind.spec_schema is not None:
            _manifest.check_spec(ke["spec"], kind.spec_schema, where, ki)
        try:
            spec = kind.spec_from_json(ke["spec"])
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as e:  # what parsing a hostile dict raises
            raise BundleError(f"{where}: kernels[{ki}].spec: kernel {kname!r}: invalid {kind_name} spec: {e}") from None
        _declared(where, ki, kname, kind, spec, ke["tensors"])
        plan.append((ki, kname, kind, spec, ke["tensors"]))
    named = files | {MANIFEST} | ({xe["file"]} if xe is not None else set()) | ({SIGNATURE_FILE} if signature is not None else set())
    _only_named_files(root_fd, where, named)

    kernels: dict[str, Kernel] = {}
    for ki, kname, kind, spec, entries in plan:
        tensors = {t: _read_tensor(root_fd, te, where, f"tensor {kname}.{t}") for t, te in entries.items()}
        if kind.check_tensors is not None:
            # The check every device runs at load: a bundle that loads is one a device accepts.
            try:
                kind.check_tensors(spec, tensors)
            except (ValueError, TypeError, KeyError) as e:
                raise BundleError(f"{where}: kernels[{ki}].tensors: kernel {kname!r}: {e}") from None
        kernels[kname] = Kernel(kname, spec, tensors)

    b = Bundle(manifest["name"] or root.name, kernels, manifest["meta"], path=root, manifest_sha256=sealed,
               signature_key=None if signature is None else signature["public_key_sha256"], signature_verified=signer is not None,
               rings={ke["name"]: RingSize(**ke["ring"]) for ke in manifest["kernels"] if "ring" in ke})
    if xe is not None:
        f, _ = _checked_file(root_fd, xe, where, "xclbin", keep=False)
        f.close()
        b.xclbin = root / xe["file"]
        b.xclbin_uuid = xe["uuid"]
        b.target = xe["target"]
        b.platform = xe["platform"]
        b.compute_units = {k: list(v) for k, v in xe["compute_units"].items()}
    return b

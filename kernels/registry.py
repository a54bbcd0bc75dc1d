"""Registry of offloadable kernel kinds (embedding, mlp, ...).

A *kind* says how a kernel of that family is described (its spec, a JSON-able dataclass), which
resident tensors it needs (tables, weights: raw fixed-point integers), how inputs are validated,
and what it computes (the bit-exact reference from :mod:`offload.sim`). Devices look kinds up here,
so adding a kernel family never touches the device code.

Example::

    from offload.kernels import get_kind
    kind = get_kind("embedding")
    spec = kind.spec_from_json(manifest_entry["spec"])
    out = kind.reference(spec, tensors, inputs)     # dict of output arrays
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

Arrays = Mapping[str, np.ndarray]

__all__ = ["Kernel", "KernelKind", "register_kind", "get_kind", "kinds", "resident_copy"]


@dataclass(frozen=True)
class KernelKind:
    """How one family of kernels is described and computed.

    - ``spec_from_json(d)`` rebuilds the spec dataclass (which has ``kind`` and ``to_json()``).
    - ``validate(spec, tensors, inputs)`` raises a typed error naming the field and the limit.
    - ``reference(spec, tensors, inputs)`` returns the exact outputs (validated inputs assumed).
    - ``check_tensors(spec, tensors)`` (optional) refuses resident tensors that do not fit the spec
      (names, shapes, container dtypes, raw values inside their type's range): the reference and
      the C++ read raw bits differently once a value is outside its type, so such a kernel would
      silently disagree between devices.
    - ``tensor_shapes(spec)`` (optional) gives the shape of every resident tensor the spec needs,
      from the spec alone, so a bundle loader can refuse a tensor whose declared shape contradicts
      the spec before it reads a byte of it.
    """

    name: str
    spec_from_json: Callable[[dict], Any]
    validate: Callable[[Any, Arrays, Arrays], None]
    reference: Callable[[Any, Arrays, Arrays], dict[str, np.ndarray]]
    check_tensors: Callable[[Any, Arrays], None] | None = None
    tensor_shapes: Callable[[Any], Mapping[str, tuple[int, ...]]] | None = None


@dataclass
class Kernel:
    """One kernel instance: its spec plus the resident tensors it was built with.

    ``name`` identifies it inside a bundle (``"emb0"``, ``"risk"``); ``tensors`` are uploaded to a
    device once by ``Device.load`` and stay there.
    """

    name: str
    spec: Any
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.spec.kind


_KINDS: dict[str, KernelKind] = {}


def register_kind(kind: KernelKind) -> KernelKind:
    """Register a kernel family (idempotent for the same name and object)."""
    prev = _KINDS.get(kind.name)
    if prev is not None and prev is not kind:
        raise ValueError(f"kernel kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def _load_builtin() -> None:
    # Importing the modules registers them; done lazily so `offload.kernels` stays cheap to import.
    import importlib

    for mod in ("offload.kernels.embedding", "offload.kernels.mlp"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def get_kind(name: str) -> KernelKind:
    """The registered kind called ``name``; ``KeyError`` lists the known ones."""
    if name not in _KINDS:
        _load_builtin()
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(f"unknown kernel kind {name!r}; known: {sorted(_KINDS)}") from None


def kinds() -> list[str]:
    """Names of all registered kernel kinds."""
    _load_builtin()
    return sorted(_KINDS)


def resident_copy(kernel: Kernel) -> Kernel:
    """The checked, read-only copy of ``kernel`` that a device keeps resident.

    Unknown kinds and tensors that do not fit the spec fail here, at load, not at the first run;
    later changes to the caller's arrays never reach the device's copy.
    """
    kind = get_kind(kernel.kind)
    if kind.check_tensors is not None:
        kind.check_tensors(kernel.spec, kernel.tensors)
    frozen = Kernel(kernel.name, kernel.spec, {k: np.array(v, copy=True) for k, v in kernel.tensors.items()})
    for v in frozen.tensors.values():
        v.setflags(write=False)
    return frozen

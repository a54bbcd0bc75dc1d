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
from typing import Any, Callable, Generic, Mapping, TypeVar, overload

import numpy as np

from offload.sim.layout import aligned_copy

Arrays = Mapping[str, np.ndarray]
T = TypeVar("T")
_MISSING = object()

__all__ = ["Kernel", "KernelKind", "Registry", "KINDS", "register_kind", "get_kind", "kinds", "resident_copy"]


@dataclass(frozen=True)
class KernelKind:
    """How one family of kernels is described and computed.

    - ``spec_from_json(d)`` rebuilds the spec dataclass (which has ``kind`` and ``to_json()``).
    - ``validate(spec, tensors, inputs)`` raises a typed error naming the field and the limit.
    - ``reference(spec, tensors, inputs)`` returns the exact outputs (validated inputs assumed): the
      plain, step-by-step definition from :mod:`offload.sim`, which every faster path must equal.
    - ``check_tensors(spec, tensors)`` (optional) refuses resident tensors that do not fit the spec
      (names, shapes, container dtypes, raw values inside their type's range): the reference and
      the C++ read raw bits differently once a value is outside its type, so such a kernel would
      silently disagree between devices.
    - ``golden_inputs(spec, rng, case)`` (optional) makes the inputs of golden case ``case`` for
      ``offload build``'s C-simulation check: case 0 adversarial (extremes, empty and full sizes),
      later cases random.
    - ``tensor_shapes(spec)`` (optional) gives the shape of every resident tensor the spec needs,
      from the spec alone, so a bundle loader can refuse a tensor whose declared shape contradicts
      the spec before it reads a byte of it.
    - ``spec_schema`` (optional) is the JSON Schema (draft 2020-12) of ``spec.to_json()``: every
      field's type and range. A bundle's spec is checked against it before ``spec_from_json`` sees
      it, so a value of the wrong type (``16.0`` for a dimension) or past what the C++ kernel
      declares (``1e30`` for an ``int``) is refused naming the field. "integer" means a JSON integer
      (not ``2.0``, not ``true``); ``"int64Items": true`` checks that every item of a long array
      is an int64 integer in one pass (per-item validation costs about 16 us an item).
    - ``prepare(spec, tensors)`` (optional) readies the kind's fast path on a host-memory device,
      given the device's resident copies (already private, read-only and 64-byte aligned by
      :func:`resident_copy`), for example by warming its compiled code; returns the arrays to keep
      (the same ones unless it must re-lay them out) and the seconds spent compiling.
    - ``run_checked(spec, tensors, inputs)`` (optional) is ``validate`` then ``reference`` in one
      pass, bit for bit the same outputs and the same errors; devices that compute on the host use
      it when the kind has one. It is where a kind chooses its fast path (the simulator's fused
      code where it is present and the spec fits it) or the reference, the one place it does.
    - ``bind_rows(spec, tensors, *, fp32)`` (optional), for a kind of one input and one output
      (the mlp kind: rows ``x`` to ``y``), returns that output of ``reference`` for these resident
      tensors as one prepared call, ``rows -> rows`` (ndarrays), for inputs already validated; the
      tensors must not change from then on. Host-memory devices bind once per loaded kernel where
      the kind has one. With ``fp32`` true the rows hold FP32 values (float32, or float64 holding
      them) and the output comes as float32, bit for bit ``reference``'s ``.astype(np.float32)``:
      the call a server whose wire type is FP32 makes, with the rounding done where the kind can
      do it for free (the mlp kind: in its compiled kernel). Rows, not mappings: a server's
      one-row call pays for every frame and dict on its way.
    - ``bind_checked(spec, tensors, *, fp32)`` (optional), for a kind of one output, is
      ``run_checked``'s output as one prepared call taking the inputs positionally (the embedding
      kind: ``(indices, offsets, per_sample_weights)``), same checks and errors, for these (from
      now on constant) tensors; ``fp32``: that output as float32, written so by the kind's fast
      path where it can (what the torch op returns). It may return None for a spec it does not bind.
    - ``bind_native(spec, tensors)`` (optional): ``bind_checked``'s float32 call for these tensors
      behind a C ABI (the embedding kind: :class:`offload.sim.embedding.fused.NativeEntry`), for a
      caller with raw pointers and no Python (the torch op's C++ kernel); None where it has none.
    """

    name: str
    spec_from_json: Callable[[dict], Any]
    validate: Callable[[Any, Arrays, Arrays], None]
    reference: Callable[[Any, Arrays, Arrays], dict[str, np.ndarray]]
    check_tensors: Callable[[Any, Arrays], None] | None = None
    golden_inputs: Callable[[Any, np.random.Generator, int], dict[str, np.ndarray]] | None = None
    tensor_shapes: Callable[[Any], Mapping[str, tuple[int, ...]]] | None = None
    prepare: Callable[[Any, Arrays], tuple[dict[str, np.ndarray], float]] | None = None
    run_checked: Callable[[Any, Arrays, Arrays], dict[str, np.ndarray]] | None = None
    bind_rows: Callable[..., Callable[[np.ndarray], np.ndarray]] | None = None  # (spec, tensors, *, fp32)
    bind_checked: Callable[..., Callable[..., np.ndarray] | None] | None = None  # (spec, tensors, *, fp32)
    bind_native: Callable[[Any, Arrays], Any] | None = None
    spec_schema: Mapping[str, Any] | None = None


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


class Registry(Generic[T]):
    """Name -> implementation, for the few things offload has several of (kernel kinds, HLS
    generators, device backends). Implementations register where they are defined, with
    ``register`` as a decorator or a call; the package that defines the built-ins imports them
    in its ``__init__``, so a lookup never has to guess which modules to import.

    Example::

        DEVICES: Registry[DeviceFactory] = Registry("device backend")

        @DEVICES.register("sim")
        class SimDevice: ...
    """

    def __init__(self, what: str):
        self.what = what
        self._items: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, item: T) -> T: ...

    def register(self, name: str, item: Any = _MISSING) -> Any:
        """Register ``item`` under ``name`` (idempotent for the same object; another object under a
        taken name is refused). Without ``item``, returns a decorator."""
        if item is _MISSING:
            return lambda obj: self.register(name, obj)
        prev = self._items.get(name)
        if prev is not None and prev is not item:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        """The implementation registered as ``name``; ``KeyError`` lists the known names."""
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}; known: {self.names()}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


KINDS: Registry[KernelKind] = Registry("kernel kind")


def register_kind(kind: KernelKind) -> KernelKind:
    """Register a kernel family under its own name (idempotent for the same object)."""
    return KINDS.register(kind.name, kind)


def get_kind(name: str) -> KernelKind:
    """The registered kind called ``name``; ``KeyError`` lists the known ones."""
    return KINDS.get(name)


def kinds() -> list[str]:
    """Names of all registered kernel kinds."""
    return KINDS.names()


def resident_copy(kernel: Kernel) -> Kernel:
    """The checked, read-only copy of ``kernel`` that a device keeps resident.

    Unknown kinds and tensors that do not fit the spec fail here, at load, not at the first run;
    later changes to the caller's arrays never reach the device's copy.
    """
    kind = get_kind(kernel.kind)
    if kind.check_tensors is not None:
        kind.check_tensors(kernel.spec, kernel.tensors)
    # One copy, aligned: prepare() works on it in place instead of copying the tables again.
    return Kernel(kernel.name, kernel.spec, {k: aligned_copy(v, read_only=True) for k, v in kernel.tensors.items()})

"""Registry of HLS kernel generators: how each kernel kind becomes C++ and how its buffers look.

A kernel's top function is the ABI shared by every device that runs the real C++: the ``emu``
device compiles the sources with g++ into a shared library and calls the top function through
ctypes with host buffers; the ``xrt``/``pynq`` devices allocate one buffer object per pointer
argument (in the memory bank of that argument) and start the compute unit with the same
arguments in the same order. Marshalling (``pack_*`` / ``unpack_outputs``) is therefore written
once per kind, here, and shared by all of them.

Example::

    from offload.hls.registry import get_hls_kind
    hk = get_hls_kind("embedding")
    srcs = hk.sources(spec)                 # {"offload_embedding.cpp": "...", ...}
    args = hk.top_args(spec)                # [KernelArg("table0", "resident", np.int16), ...]
    where = hk.placement(spec, "u55c", 2, None)  # KernelPlacement: CUs, SLR, bank of every argument
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from offload.hls.cards import Card
from offload.kernels.registry import Registry

__all__ = ["KernelArg", "KernelPlacement", "HlsKind", "HLS_KINDS", "register_hls_kind", "get_hls_kind"]

Role = Literal["resident", "input", "output", "scalar"]


@dataclass(frozen=True)
class KernelArg:
    """One argument of a kernel's top function, in call order.

    ``role``: ``resident`` (uploaded at load, stays on the card: tables, weights), ``input`` /
    ``output`` (per-call buffers), ``scalar`` (passed by value through s_axilite).
    ``dtype`` is the NumPy element type of the buffer (or of the scalar). ``bundle`` names the
    m_axi bundle, i.e. the memory port that connectivity maps to an HBM/DDR bank.
    """

    name: str
    role: Role
    dtype: Any
    bundle: str | None = None


@dataclass(frozen=True)
class KernelPlacement:
    """Where one kernel's compute units and buffers go on a card: v++'s ``nk``, ``sp`` and ``slr``.

    ``compute_units``: CU names in order (v++ names them ``<top>_1`` .. ``<top>_N``); ``slr``: CU ->
    ``"SLRn"``; ``banks``: CU -> pointer argument -> bank (``"HBM[3]"``, ``"HBM[0:1]"``, ``"DDR[1]"``).

    Example::

        KernelPlacement(("top_1",), {"top_1": "SLR0"}, {"top_1": {"table0": "HBM[0]", "out": "HBM[1]"}})
    """

    compute_units: tuple[str, ...]
    slr: Mapping[str, str]
    banks: Mapping[str, Mapping[str, str]]


Placer = Callable[[Any, "str | Card", int, "Mapping[str, float] | None"], KernelPlacement]


@dataclass(frozen=True)
class HlsKind:
    """How one kernel kind is generated and marshalled.

    - ``top_name(spec)``: the C/C++ top function name (``extern "C"``).
    - ``sources(spec)``: generated C++ sources, file name -> text (headers included).
    - ``top_args(spec)``: the top function's arguments, in order.
    - ``pack_resident(spec, tensors)``: resident tensors -> buffers for the ``resident`` args.
    - ``pack_inputs(spec, inputs)``: per-call inputs -> buffers/values for ``input``, ``scalar``
      args, and the *shapes* to allocate for ``output`` args (as zero arrays).
    - ``unpack_outputs(spec, inputs, buffers)``: output buffers -> the kind's output dict, the same
      dict the sim reference returns.
    - ``placement(spec, card, compute_units, traffic)``: where the kind's buffers go on ``card``
      (:class:`KernelPlacement`), for a kind that knows better than an even spread (embedding
      tables by size and traffic; ``traffic`` is the kind's own hint, ``None`` for its default);
      ``None``: :func:`offload.hls.connectivity.spread` places it.
    """

    name: str
    top_name: Callable[[Any], str]
    sources: Callable[[Any], dict[str, str]]
    top_args: Callable[[Any], Sequence[KernelArg]]
    pack_resident: Callable[[Any, Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    pack_inputs: Callable[[Any, Mapping[str, np.ndarray]], dict[str, Any]]
    unpack_outputs: Callable[[Any, Mapping[str, np.ndarray], Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    placement: Placer | None = None


HLS_KINDS: Registry[HlsKind] = Registry("HLS generator for kernel kind")


def register_hls_kind(kind: HlsKind) -> HlsKind:
    """Register a generator under its kind's name (idempotent for the same object)."""
    return HLS_KINDS.register(kind.name, kind)


def get_hls_kind(name: str) -> HlsKind:
    """The generator for kernel kind ``name``; ``KeyError`` lists the known ones."""
    return HLS_KINDS.get(name)

"""The ring protocol of a persistent kernel, as data: layout, sequence words, memory ordering.

A persistent kernel is started once and then serves requests from a ring of slots in memory the
host and the kernel share (host memory on cards that support it, card memory otherwise). This
module says where every byte of that ring lives and what each word means; it computes nothing
and imports no HLS or device code. ``offload.hls.persistent`` writes the C++ loop that serves it
(``hls/src/offload_ring.h``), the ``emu`` device runs that loop in a thread, the ``xrt`` device on
a card; both hosts follow the contract below.

Layout (every offset a multiple of :data:`LINE`, 64 bytes, so no two parties' words share a
cache line or an AXI beat)::

    header   line 0  magic, version, slot count, slot bytes      (host, once, before the start)
             line 1  stop word                                   (host)
             line 2  stopped word                                (kernel)
    slot s   at HEADER_BYTES + s * slot_bytes:
             line 0  request sequence word                       (host)
             line 1+ scalars (int64 each), then input fields     (host)
             ...     output fields                               (kernel)
             last    response sequence word                      (kernel)

Sequence words. Requests are numbered 1, 2, 3, ... by the host, in the order it hands them out;
request ``n`` lives in slot ``(n - 1) % slots`` and its sequence words hold ``n`` itself (zero
means "never written"). The kernel keeps its own counter, starting at 1, and serves requests
strictly in that order. Because a word holds the request's number, not a flag, a word left from
the slot's previous lap (``n - slots``) can never be taken for ``n``: a late or stale answer is
never returned to the wrong request. Numbers are 64-bit and never reused within a ring's life
(2**64 requests); a ring whose kernel was declared hung is abandoned, never reused.

Memory ordering (who writes what, in which order):

1. Host, request ``n``: waits until slot ``s``'s previous request ``n - slots`` was answered
   and its response read; writes the scalars and inputs with plain stores; then stores ``n``
   into the slot's request word with *release* semantics (``__atomic_store_n(p, n,
   __ATOMIC_RELEASE)``; from Python, through the ring library's ``store_release``), so no input
   store can be seen after it.
2. Kernel: reads the request word with *acquire* semantics until it equals its counter, and
   reads the slot's scalars and inputs only after that (acquire: no input read moves before it).
3. Kernel: computes, writes the outputs, then stores ``n`` into the response word with
   *release* semantics: the response word is the last thing the kernel writes for a request.
4. Host: reads the response word with *acquire* semantics until it equals ``n`` (spinning for a
   bounded time, then backing off), reads the outputs only after that, then frees the slot.
5. Stop: the host stores :data:`STOP` into the stop word (release) only after every request it
   sent was answered (close drains first). The kernel reads the stop word (acquire) only while it
   waits for its next request, so it never stops in the middle of one; it then stores the number
   of the last request it answered into the stopped word (release) and returns.

On a card the same order is kept by the AXI and PCIe rules instead of CPU fences: the kernel
issues its reads of a slot only after the request word compared equal (a control dependency in
the kernel's state machine), and it writes the response word after the output writes completed
(write responses received) on the same m_axi port; PCIe posted writes are not reordered among
themselves. A host that writes the ring in card memory (no host-memory support) syncs the inputs
to the card before it writes the request word, and reads the response word before syncing the
outputs back.

Example::

    from offload.kernels.ring import Field, RingLayout, slot_layout
    slot = slot_layout([Field("n", "scalar", "int32", 1), Field("x", "input", "int32", 64),
                        Field("y", "output", "int32", 64)])
    ring = RingLayout(slots=8, slot=slot)
    buf = ring.allocate()                    # zeroed, page-aligned uint8 buffer
    x = ring.view(buf, 0, "x")               # slot 0's input field, int32[64]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

from offload.kernels.registry import Registry
from offload.sim.errors import InputError, InputKeyError

__all__ = [
    "LINE",
    "MAGIC",
    "VERSION",
    "STOP",
    "HEADER_BYTES",
    "HDR_MAGIC",
    "HDR_VERSION",
    "HDR_SLOTS",
    "HDR_SLOT_BYTES",
    "HDR_STOP",
    "HDR_STOPPED",
    "SLOT_REQ_SEQ",
    "Field",
    "SlotLayout",
    "RingLayout",
    "slot_layout",
    "align",
    "RING_CAPACITY",
    "register_capacity",
    "request_capacity",
]

LINE = 64
MAGIC = int.from_bytes(b"OFLDRING", "little")
VERSION = 1
STOP = 1

# Byte offsets of the header words.
HDR_MAGIC = 0
HDR_VERSION = 8
HDR_SLOTS = 16
HDR_SLOT_BYTES = 24
HDR_STOP = LINE
HDR_STOPPED = 2 * LINE
HEADER_BYTES = 3 * LINE

# Byte offset of the request word inside a slot (the response word's is in SlotLayout).
SLOT_REQ_SEQ = 0

Role = Literal["scalar", "input", "output"]


def align(n: int, to: int = LINE) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Field:
    """One thing a request carries: a scalar (stored as int64), or an input or output array of at
    most ``count`` elements of ``dtype``. ``offset`` is its byte offset in the slot (set by
    :func:`slot_layout`)."""

    name: str
    role: Role
    dtype: str
    count: int
    offset: int = -1

    @property
    def nbytes(self) -> int:
        return 8 if self.role == "scalar" else self.count * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class SlotLayout:
    """Where a request's words and fields lie in one slot; ``size`` is a multiple of :data:`LINE`."""

    fields: tuple[Field, ...]
    resp_seq: int
    size: int

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise InputKeyError(f"ring slot has no field {name!r}; it has {[f.name for f in self.fields]}")

    @property
    def input_bytes(self) -> int:
        """Bytes the host writes for one request (the scalars' lines and the inputs, padded)."""
        scalars = sum(8 for f in self.fields if f.role == "scalar")
        return align(scalars) + sum(align(f.nbytes) for f in self.fields if f.role == "input")

    @property
    def output_bytes(self) -> int:
        """Bytes the kernel writes for one request (outputs, padded)."""
        return sum(align(f.nbytes) for f in self.fields if f.role == "output")


def slot_layout(fields: Sequence[Field]) -> SlotLayout:
    """Place ``fields`` in a slot: the request word's line, the scalars packed 8 bytes apart in the
    lines after it, each input and output field on its own 64-byte boundary, the response word's
    line last. Field order is kept within each role."""
    if not fields:
        raise InputError("ring slot: a request carries at least one field")
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise InputError(f"ring slot: duplicate field names {names}")
    placed: list[Field] = []
    at = LINE  # line 0: the request word
    for f in fields:
        if f.role == "scalar":
            placed.append(Field(f.name, f.role, f.dtype, 1, at))
            at += 8
    at = align(at)
    for role in ("input", "output"):
        for f in fields:
            if f.role == role:
                if f.count < 1:
                    raise InputError(f"ring slot: field {f.name!r} holds {f.count} elements; at least 1")
                placed.append(Field(f.name, f.role, np.dtype(f.dtype).name, f.count, at))
                at = align(at + f.nbytes)
    return SlotLayout(tuple(placed), at, at + LINE)


@dataclass(frozen=True)
class RingLayout:
    """A ring of ``slots`` slots of one :class:`SlotLayout`, after the header."""

    slots: int
    slot: SlotLayout

    def __post_init__(self) -> None:
        if not 1 <= self.slots <= 1 << 16:
            raise InputError(f"ring slots: {self.slots} is outside [1, 65536]")

    @property
    def nbytes(self) -> int:
        return HEADER_BYTES + self.slots * self.slot.size

    def slot_offset(self, s: int) -> int:
        return HEADER_BYTES + s * self.slot.size

    def slot_of(self, n: int) -> int:
        """The slot of request number ``n`` (``n >= 1``)."""
        return (n - 1) % self.slots

    def allocate(self) -> np.ndarray:
        """A zeroed, page-aligned ``uint8`` buffer for the ring, its header written."""
        # Page-aligned: a card maps host memory in pages, and no slot line straddles two.
        raw = np.zeros(self.nbytes + 4096, dtype=np.uint8)
        start = (-raw.ctypes.data) % 4096
        buf = raw[start: start + self.nbytes]
        self.write_header(buf)
        return buf

    def write_header(self, buf: np.ndarray) -> None:
        """The read-only header words (magic, version, slot count, slot bytes); written once,
        before the kernel starts."""
        h = buf[:HEADER_BYTES].view(np.uint64)
        h[HDR_MAGIC // 8], h[HDR_VERSION // 8] = MAGIC, VERSION
        h[HDR_SLOTS // 8], h[HDR_SLOT_BYTES // 8] = self.slots, self.slot.size

    def word(self, buf: np.ndarray, offset: int) -> np.ndarray:
        """The 64-bit word at byte ``offset`` as a one-element ``uint64`` view (plain access;
        ordered access goes through the ring library's acquire/release helpers)."""
        return buf[offset: offset + 8].view(np.uint64)

    def view(self, buf: np.ndarray, s: int, name: str) -> np.ndarray:
        """Slot ``s``'s field ``name``: an array view of its full capacity (scalars: one int64)."""
        f = self.slot.field(name)
        at = self.slot_offset(s) + f.offset
        if f.role == "scalar":
            return buf[at: at + 8].view(np.int64)
        return buf[at: at + f.nbytes].view(f.dtype)


# -- how much one request of a kind may carry ---------------------------------------------------
# A kind's capacity function maps (spec, rows) to the most elements each of its per-call buffers
# holds for a request of ``rows`` rows (bags per table, samples), by buffer name.
Capacity = Callable[[object, int], Mapping[str, int]]
RING_CAPACITY: Registry[Capacity] = Registry("ring capacity of kernel kind")


def register_capacity(kind: str, fn: Capacity) -> Capacity:
    """Register how many elements each per-call buffer of ``kind`` holds for ``rows`` rows."""
    return RING_CAPACITY.register(kind, fn)


def request_capacity(spec, rows: int) -> dict[str, int]:
    """Elements per per-call buffer of a ``rows``-row request of ``spec``'s kind.

    Example::

        request_capacity(emb_spec, 64)   # {"indices": 64*T*max_bag, "offsets": 64*T+1, ...}
    """
    if rows < 1:
        raise InputError(f"ring rows: {rows} must be at least 1")
    return dict(RING_CAPACITY.get(spec.kind)(spec, rows))


def _embedding_capacity(spec, rows: int) -> dict[str, int]:
    # Bags hold max_bag_size ids on average at capacity; a longer bag fits while the request's
    # total ids do (the slot bounds the total, as the kernel's buffers do).
    t = spec.num_tables
    ids = rows * t * spec.max_bag_size
    return {"indices": ids, "offsets": rows * t + 1, "per_sample_weights": ids, "out": rows * spec.total_dim}


def _mlp_capacity(spec, rows: int) -> dict[str, int]:
    return {"x": rows * spec.n_features, "y": rows * spec.n_outputs}


register_capacity("embedding", _embedding_capacity)
register_capacity("mlp", _mlp_capacity)

"""The persistent top of a kernel: started once, it serves a ring of requests until a stop word.

For every kernel kind (embedding, table-batched embedding, MLP, and any kind registered with a
ring capacity in :mod:`offload.kernels.ring`) this writes one more ``extern "C"`` function next
to the kind's own sources: ``<top>_ring(ring, <resident pointers>)``. It loops: wait for the next
slot's request word (``hls/src/offload_ring.h``), call the kind's per-call top unchanged on
pointers into that slot, write the response word last, go on; the stop word ends the loop. The
arithmetic is therefore the per-call kernel's, bit for bit, on every device.

Design choice: a ``while`` loop with a stop word, not an auto-restarting top.

- Auto-restart (UG1393 "Working with Auto-Restarting Kernels", UG1399 "Enabling Auto-Restart":
  ``ap_ctrl_chain`` plus ``config_interface -s_axilite_auto_restart_counter 1``, started with
  ``xrt::autostart``) re-runs the whole top after each ``ap_done``. Every iteration would have to
  fetch the next request number from memory and store it back (a top keeps no state across
  iterations), and UG1399 "Supported Interfaces" says scalar and m_axi arguments of such a design
  need the mailbox (``s_axilite_mailbox``) to change; stopping it is a control-register write
  (clearing auto-restart, ``xrt::run::abort``), i.e. register access from the host. Vitis_Accel_Examples
  ``host_xrt/mailbox_auto_restart_xrt`` excludes the no-DMA platforms for it.
- A ``while`` loop keeps the request counter in a register, is started with one ordinary
  ``xrt::run`` at load (XRT's ``ap_ctrl_hs``/``ap_ctrl_chain`` models, XRT
  ``src/runtime_src/doc/toc/xrt_kernel_executions.rst``), and stops on a word the host writes into
  the ring itself: no register access, no mailbox, the same code path in host or card memory and
  under C-simulation, and ``run.wait()`` returns when the loop ends, so close is observable. A
  kernel that never answers is recovered the way XRT's own sw-reset test recovers an endless
  loop: ``xrt::run::abort`` on a top built with ``config_interface -s_axilite_sw_reset``, else
  ``xbutil reset``. That is why this generator writes the loop.

C-simulation: the loop compiles with g++ as it is; ``__SYNTHESIS__`` undefined switches the
sequence words to ``__atomic`` acquire/release, lets an idle loop sleep, and adds one trailing
argument, a :class:`Csim` block (idle spin, and the test hooks: random delays, a kernel that dies
at a given request). :func:`run_csim` serves a batch of requests in one call, with no thread: the
requests are written first, then the stop word, and the loop serves them all before it sees it.

Example::

    from offload.hls import persistent
    layout = persistent.ring_layout(spec, rows=64, slots=8)
    srcs = persistent.sources(spec, layout)          # the kind's sources + "<top>_ring.cpp"
    outs = persistent.run_csim(kernel, [inputs_a, inputs_b])  # C-simulated through the ring
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from offload.hls import csim
from offload.hls.registry import KernelArg, get_hls_kind
from offload.kernels.registry import Kernel, get_kind
from offload.kernels.ring import (
    HDR_STOP,
    HEADER_BYTES,
    SLOT_REQ_SEQ,
    STOP,
    Field,
    RingLayout,
    request_capacity,
    slot_layout,
)
from offload.sim.errors import InputError, UnsupportedError

__all__ = [
    "DEFAULT_ROWS",
    "DEFAULT_SLOTS",
    "RING_ARG",
    "RING_BUNDLE",
    "Csim",
    "RingKernel",
    "RingOps",
    "top_name",
    "ring_layout",
    "ring_size",
    "resident_args",
    "sources",
    "load",
    "ring_ops",
    "write_request",
    "read_response",
    "run_csim",
]

DEFAULT_ROWS = 64  # rows (bags per table, samples) one slot holds: COSIM's batch of both kinds
DEFAULT_SLOTS = 8
RING_ARG = "ring"
RING_BUNDLE = "gmem_ring"

_CTYPE = {
    "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
    "int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t",
    "float32": "float", "float64": "double",
}


class Csim(ctypes.Structure):
    """The C-simulation block of ``offload_ring::Csim`` (``hls/src/offload_ring.h``), field for field."""

    _fields_ = [
        ("idle_spin_ns", ctypes.c_uint64),
        ("max_sleep_ns", ctypes.c_uint64),
        ("seed", ctypes.c_uint64),
        ("delay_permille", ctypes.c_uint32),
        ("max_delay_us", ctypes.c_uint32),
        ("die_at", ctypes.c_uint64),
        ("die_after_compute", ctypes.c_uint64),
    ]


def top_name(spec: Any) -> str:
    """``<the kind's top>_ring``."""
    return f"{get_hls_kind(spec.kind).top_name(spec)}_ring"


def resident_args(spec: Any) -> list[KernelArg]:
    """The persistent top's pointer arguments after ``ring``: the kind's resident buffers, in order."""
    return [a for a in get_hls_kind(spec.kind).top_args(spec) if a.role == "resident"]


def ring_size(recorded: tuple[int, int] | None, slots: int | None = None, rows: int | None = None) -> tuple[int, int]:
    """``(slots, rows)`` of a kernel's ring: the one its bundle recorded, else the device's
    ``ring_slots``/``ring_rows`` where given, else the defaults."""
    return recorded or (slots or DEFAULT_SLOTS, rows or DEFAULT_ROWS)


def ring_layout(spec: Any, *, rows: int = DEFAULT_ROWS, slots: int = DEFAULT_SLOTS) -> RingLayout:
    """The ring of ``spec``'s kernel: every per-call argument of the kind's top as a slot field (its
    dtype from ``top_args``, its size from the kind's ring capacity for ``rows`` rows)."""
    cap = request_capacity(spec, rows)
    fields = []
    for a in get_hls_kind(spec.kind).top_args(spec):
        if a.role == "resident":
            continue
        dt = np.dtype(a.dtype)
        if a.role == "scalar":
            if dt.kind not in "iu":
                raise UnsupportedError(f"{spec.kind} kernel: scalar {a.name!r} is {dt}; a ring slot carries integer scalars only")
            fields.append(Field(a.name, "scalar", dt.name, 1))
            continue
        if a.name not in cap:
            raise UnsupportedError(f"{spec.kind} kernel: the ring capacity has no size for buffer {a.name!r}")
        fields.append(Field(a.name, a.role, dt.name, int(cap[a.name])))
    return RingLayout(slots, slot_layout(fields))


def _cast(offset: int, dtype: str, const: bool) -> str:
    # Pointers into the slot; the volatile qualifier belongs to the sequence words only.
    q = "const " if const else ""
    return f"({q}{_CTYPE[dtype]} *)((uint64_t *)slot + {offset // 8})"


def _ring_cpp(spec: Any, layout: RingLayout) -> str:
    hk = get_hls_kind(spec.kind)
    inner = hk.top_name(spec)
    name = top_name(spec)
    args = list(hk.top_args(spec))
    proto, call, params, pragmas = [], [], [], []
    for a in args:
        ct = _CTYPE[np.dtype(a.dtype).name]
        if a.role == "scalar":
            proto.append(f"{ct} {a.name}")
            call.append(f"({ct})(int64_t)slot[{layout.slot.field(a.name).offset // 8}]")
        elif a.role == "resident":
            proto.append(f"const {ct} *{a.name}")
            params.append(f"const {ct} *{a.name}")
            pragmas.append(f"#pragma HLS INTERFACE m_axi port = {a.name} offset = slave bundle = {a.bundle}")
            call.append(a.name)
        else:
            const = a.role == "input"
            proto.append(f"{'const ' if const else ''}{ct} *{a.name}")
            call.append(_cast(layout.slot.field(a.name).offset, np.dtype(a.dtype).name, const))
    slot_words = layout.slot.size // 8
    return "\n".join([
        "// Generated by offload.hls.persistent from the kernel spec; do not edit.",
        f"// The persistent top of {inner}: serves a ring of {layout.slots} slots of {layout.slot.size} bytes",
        "// (offload/kernels/ring.py: layout and memory-ordering contract).",
        "#include <stdint.h>",
        "",
        '#include "offload_ring.h"',
        "",
        f'extern "C" void {inner}({", ".join(proto)});',
        "",
        "#ifdef __SYNTHESIS__",
        "#define OFFLOAD_RING_CSIM_PARAM",
        "#define OFFLOAD_RING_CSIM_ARG",
        "#else",
        "#define OFFLOAD_RING_CSIM_PARAM , offload_ring::Csim *csim",
        "#define OFFLOAD_RING_CSIM_ARG , csim",
        "#endif",
        "",
        f'extern "C" void {name}(volatile uint64_t *{RING_ARG}{"".join(", " + p for p in params)} OFFLOAD_RING_CSIM_PARAM) {{',
        f"#pragma HLS INTERFACE m_axi port = {RING_ARG} offset = slave bundle = {RING_BUNDLE} depth = {layout.nbytes // 8}",
        *pragmas,
        "#pragma HLS INTERFACE s_axilite port = return",
        "    uint64_t n = 1;  // the next request number; the kernel serves them in order",
        "SERVE:",
        "    for (;;) {",
        f"        volatile uint64_t *slot = {RING_ARG} + {HEADER_BYTES // 8} + ((n - 1) % {layout.slots}) * {slot_words};",
        f"        if (!offload_ring::wait_request({RING_ARG}, slot + {SLOT_REQ_SEQ // 8}, n OFFLOAD_RING_CSIM_ARG)) break;",
        "#ifndef __SYNTHESIS__",
        "        offload_ring::maybe_delay(csim, n);",
        "        if (offload_ring::dies_at(csim, n, false)) return;  // test hook: dies holding request n",
        "#endif",
        f"        {inner}({', '.join(call)});",
        "#ifndef __SYNTHESIS__",
        "        if (offload_ring::dies_at(csim, n, true)) return;  // test hook: outputs written, no response word",
        "#endif",
        f"        offload_ring::store_release(slot + {layout.slot.resp_seq // 8}, n);  // last: publishes the response",
        "        n++;",
        "    }",
        f"    offload_ring::store_release({RING_ARG} + offload_ring::HDR_STOPPED_WORD, n - 1);",
        "}",
        "",
    ])


def sources(spec: Any, layout: RingLayout | None = None) -> dict[str, str]:
    """The kind's sources plus ``<top>_ring.cpp``, the persistent top over ``layout`` (default
    :func:`ring_layout`)."""
    layout = layout or ring_layout(spec)
    return {**get_hls_kind(spec.kind).sources(spec), f"{top_name(spec)}.cpp": _ring_cpp(spec, layout)}


@dataclass(frozen=True)
class RingKernel:
    """A persistent top built with g++: ``serve`` blocks (without the GIL) until the ring's stop
    word, or until a :class:`Csim` hook ends it."""

    name: str
    layout: RingLayout
    library: str
    _fn: Any

    def serve(self, ring: np.ndarray, resident: Sequence[np.ndarray], csim_block: Csim | None = None) -> None:
        if ring.nbytes != self.layout.nbytes or ring.ctypes.data % 64:
            raise InputError(f"{self.name}: the ring must be {self.layout.nbytes} bytes, 64-byte aligned")
        ptrs = [ctypes.c_void_p(a.ctypes.data) for a in resident]
        self._fn(ctypes.c_void_p(ring.ctypes.data), *ptrs, ctypes.byref(csim_block) if csim_block is not None else None)


def load(spec: Any, layout: RingLayout | None = None) -> RingKernel:
    """Build (cached by source hash) and load the persistent top of ``spec`` over ``layout``."""
    layout = layout or ring_layout(spec)
    lib = csim.load_library(csim.build(sources(spec, layout), shared=True))
    name = top_name(spec)
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * (1 + len(resident_args(spec))) + [ctypes.POINTER(Csim)]
    fn.restype = None
    return RingKernel(name, layout, str(lib._name), fn)


@dataclass(frozen=True)
class RingOps:
    """The host's side of the contract on a ring in this process's memory, compiled from
    ``offload_ring.h`` so host and kernel use the same atomics: ``store_release(addr, value)``,
    ``load_acquire(addr)``, ``wait(addr, want, spin_ns) -> bool`` (spins at most ``spin_ns``
    with the GIL released; the caller backs off and keeps the deadline). Addresses are integers
    (``buf.ctypes.data + offset``)."""

    store_release: Any
    load_acquire: Any
    wait: Any
    post_wait: Any  # ``post_wait(req, n, resp, spin_ns)``: store_release(req, n), then wait(resp, n, spin_ns), in one call


_OPS_CPP = """// Generated by offload.hls.persistent: the host side of the ring protocol, for ctypes.
#include "offload_ring.h"
extern "C" void offload_ring_store_release(volatile uint64_t *p, uint64_t v) { offload_ring::store_release(p, v); }
extern "C" uint64_t offload_ring_load_acquire(volatile uint64_t *p) { return offload_ring::load_acquire(p); }
extern "C" int offload_ring_wait(volatile uint64_t *p, uint64_t want, uint64_t spin_ns) { return offload_ring::host_wait(p, want, spin_ns); }
extern "C" int offload_ring_post_wait(volatile uint64_t *req, uint64_t n, volatile uint64_t *resp, uint64_t spin_ns) {
    offload_ring::store_release(req, n);
    return offload_ring::host_wait(resp, n, spin_ns);
}
"""


@functools.lru_cache(maxsize=1)
def ring_ops() -> RingOps:
    """The host helpers (:class:`RingOps`), built once per process."""
    lib = csim.load_library(csim.build({"offload_ring_ops.cpp": _OPS_CPP}, shared=True))
    st, ld, wt, pw = lib.offload_ring_store_release, lib.offload_ring_load_acquire, lib.offload_ring_wait, lib.offload_ring_post_wait
    st.argtypes, st.restype = [ctypes.c_void_p, ctypes.c_uint64], None
    ld.argtypes, ld.restype = [ctypes.c_void_p], ctypes.c_uint64
    wt.argtypes, wt.restype = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64], ctypes.c_int
    # A request's two steps in one foreign call: each ctypes call costs a few hundred ns.
    pw.argtypes, pw.restype = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64], ctypes.c_int
    return RingOps(st, ld, wt, pw)


def write_request(layout: RingLayout, ring: np.ndarray, s: int, values: Mapping[str, Any]) -> None:
    """Write one request's scalars and inputs (the kind's ``pack_inputs`` values) into slot ``s``
    with plain stores; the caller then publishes it with ``store_release`` of its number.

    A buffer larger than its field is refused naming the field and the limit, before any store.
    """
    for f in layout.slot.fields:
        v = values[f.name]
        if f.role != "scalar" and np.asarray(v).size > f.count:
            raise InputError(f"{f.name}: {np.asarray(v).size} elements exceed the ring slot's {f.count}; "
                             f"open the device with more ring rows")
    for f in layout.slot.fields:
        if f.role == "scalar":
            layout.view(ring, s, f.name)[0] = int(values[f.name])
        elif f.role == "input":
            v = np.asarray(values[f.name])
            layout.view(ring, s, f.name)[: v.size] = v.reshape(-1)


def read_response(layout: RingLayout, ring: np.ndarray, s: int, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Copies of slot ``s``'s outputs, each shaped as the output buffer in ``values`` (the zero
    arrays ``pack_inputs`` gave)."""
    out = {}
    for f in layout.slot.fields:
        if f.role == "output":
            shape = np.shape(values[f.name])
            n = int(np.prod(shape))
            out[f.name] = layout.view(ring, s, f.name)[:n].reshape(shape).copy()
    return out


def run_csim(kernel: Kernel, requests: Sequence[Mapping[str, np.ndarray]], *, rows: int = DEFAULT_ROWS) -> list[dict[str, np.ndarray]]:
    """C-simulate ``kernel``'s persistent top on ``requests`` (each validated first, one slot
    each) and return every request's outputs as the kind's ``unpack_outputs`` gives them.

    No thread: every request is written and published, then the stop word, and one call of the
    loop serves them all (it checks a slot's request word before the stop word) and returns.
    """
    if not requests:
        return []
    spec = kernel.spec
    hk = get_hls_kind(spec.kind)
    layout = ring_layout(spec, rows=rows, slots=len(requests))
    top = load(spec, layout)
    ops = ring_ops()
    packed = hk.pack_resident(spec, kernel.tensors)
    resident = [np.ascontiguousarray(packed[a.name], dtype=a.dtype) for a in resident_args(spec)]
    ring = layout.allocate()
    base = ring.ctypes.data
    values = []
    for n, inputs in enumerate(requests, start=1):
        get_kind(spec.kind).validate(spec, kernel.tensors, inputs)
        v = hk.pack_inputs(spec, inputs)
        s = layout.slot_of(n)
        write_request(layout, ring, s, v)
        ops.store_release(base + layout.slot_offset(s) + SLOT_REQ_SEQ, n)
        values.append(v)
    ops.store_release(base + HDR_STOP, STOP)
    top.serve(ring, resident)
    outs = []
    for n, (inputs, v) in enumerate(zip(requests, values), start=1):
        s = layout.slot_of(n)
        if ops.load_acquire(base + layout.slot_offset(s) + layout.slot.resp_seq) != n:
            raise csim.CSimError(f"{top.name}: request {n} was not answered before the stop word")
        outs.append(hk.unpack_outputs(spec, inputs, read_response(layout, ring, s, v)))
    return outs

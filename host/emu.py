"""The ``emu`` device: each kernel's HLS C++ compiled with g++ and run with card buffer semantics.

It plays the role of XRT software emulation without a Vitis install. The top function generated
by ``HlsKind.sources(spec)`` is built as a shared library (``offload.hls.csim``) and called
through ctypes. Buffers behave as on a card: the device side is a separate copy; resident
buffers are copied once at ``load``; per call, host input (and output) buffers are copied
("synced") into pooled device buffers, the top function runs on the device copies only, and the
outputs are copied back. A kernel that read host memory or skipped a sync would differ from sim.

``launch="persistent"``: each loaded kernel's persistent top (``offload.hls.persistent``: the same
per-call C++ inside a loop over a ring) is started once, at load, in its own thread (the ctypes
call releases the GIL), over a ring in this process's memory, with the exact protocol of
``offload.kernels.ring``. A call validates and packs its inputs, takes the next request number,
writes its slot, publishes the request word last (release), spins on the response word for a
bounded time with the GIL released, then backs off (sleeps), and reads the outputs. A call whose
answer does not come by its deadline (``timeout``, else :attr:`EmuDevice.deadline`), or whose
kernel thread has exited, marks the ring hung: every call waiting on it fails with a
:class:`DeviceError` (:class:`DeviceTimeout` for the one whose deadline fired), the ring is
abandoned (never read again, so a late answer never reaches another request) and a new ring and
kernel thread are started. ``close`` refuses new calls, drains the ones in flight, then writes the
stop word and joins the kernel threads.

Ring size. A bundle records the ring each kernel's persistent top was built for
(``Bundle.rings``, :class:`offload.host.bundle.RingSize`); :meth:`EmuDevice.load_bundle` opens
each kernel's ring at that size, and refuses (:class:`BundleError`, naming both) a device opened
with another ``ring_slots`` or ``ring_rows``. A kernel loaded alone gets the device's (default
:data:`offload.hls.persistent.DEFAULT_SLOTS` slots of ``DEFAULT_ROWS`` rows).

Example::

    from offload.host import open_device
    dev = open_device("emu")                      # or open_device("emu", launch="persistent")
    h = dev.load(kernel)
    out = dev.run(h, inputs)          # same dict, bit for bit, as open_device("sim")
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from offload.hls import csim, persistent
from offload.hls.ctop import CTop, load_top
from offload.host._buffered import BufferedDevice, Loaded, host_array
from offload.host._pool import BufferPool
from offload.host.device import LAUNCH_MODES, DeviceError, DeviceTimeout, KernelHandle, Probe, register_device
from offload.kernels.registry import get_kind
from offload.kernels.ring import HDR_STOP, SLOT_REQ_SEQ, STOP, Field, RingLayout
from offload.sim.errors import InputError

__all__ = ["EmuDevice", "Csim", "load_top"]

Csim = persistent.Csim


@dataclass
class _EmuKernel:
    top: CTop
    resident: dict[str, np.ndarray]  # the device-side copies
    lock: threading.Lock  # one compute unit: one call at a time, as on the card


def _alloc_device(bank: Any, size: int) -> np.ndarray:
    return np.empty(size, dtype=np.uint8)


# The host's wait for a response: spin this long with the GIL released (a kernel that answers in
# microseconds is caught here), then sleep, doubling from the first nap up to the last, and spin
# briefly again after each nap.
_SPIN_NS = 100_000
_RESPIN_NS = 2_000
_FIRST_NAP_S = 20e-6
_MAX_NAP_S = 1e-3


@dataclass(eq=False)
class _Ring:
    """One running persistent kernel (one compute unit) and its ring, in this process's memory.

    ``turn[s]`` is the request number allowed to write slot ``s`` next: request ``n`` waits for
    ``turn[s] == n``, which holds once request ``n - slots`` has been answered and read (or failed).
    """

    layout: RingLayout
    buf: np.ndarray
    thread: threading.Thread
    lock: threading.RLock = field(default_factory=threading.RLock)
    next_n: int = 1
    inflight: int = 0
    closing: bool = False
    dead: str | None = None
    turn: list[int] = field(default_factory=list)
    # Threads in ``cond.wait``: a call notifies only when there is one (notify_all is Python code,
    # and a call in the common case has no one to wake).
    waiting: int = 0

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)
        self.base = self.buf.ctypes.data
        self.turn = [s + 1 for s in range(self.layout.slots)]
        # Every slot's field views, made once: a call only copies into them.
        self.views = [[self.layout.view(self.buf, s, f.name) for f in self.layout.slot.fields] for s in range(self.layout.slots)]


@dataclass
class _RingKernel:
    top: persistent.RingKernel
    resident: list[np.ndarray]  # the device-side copies, in the persistent top's argument order
    csim: Csim
    # Every slot field in order: (field, scalar min, scalar max, dtype); min/max None for arrays.
    checks: list[tuple[Field, int | None, int | None, np.dtype]]
    rows: int  # rows a request may carry (the ring's)
    ring: _Ring | None = None
    resets: int = 0
    abandoned: list[_Ring] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards ring replacement


@register_device("emu")
class EmuDevice(BufferedDevice):
    """Runs the kernels' HLS C++ (g++-built) behind card buffer semantics; see the module doc."""

    kind = "emu"
    launch_modes = LAUNCH_MODES
    launch_why = ""  # it has every mode
    #: Seconds a persistent call waits for its answer when the caller gives no ``timeout``:
    #: nothing waits forever.
    deadline = 60.0

    def __init__(self, spec: str = "emu", launch: str = "per_call", *, ring_rows: int | None = None,
                 ring_slots: int | None = None, csim_hooks: Csim | None = None) -> None:
        """``launch``: ``"per_call"`` or ``"persistent"`` (see the module doc). Persistent only:
        ``ring_rows`` rows (bags per table, samples) a request may carry, ``ring_slots`` requests
        in flight per kernel (None: a bundle's recorded ring, else the defaults), ``csim_hooks``
        the C-simulation block of every kernel loop this device starts (idle spin; the test hooks:
        delays, a kernel that dies)."""
        if launch not in LAUNCH_MODES:
            raise InputError(f"launch: {launch!r} is not one of {list(LAUNCH_MODES)}")
        super().__init__(spec)
        self.launch = launch
        self._pool: BufferPool[np.ndarray] = BufferPool(_alloc_device)
        self._ring_rows, self._ring_slots = ring_rows, ring_slots
        self._csim = csim_hooks if csim_hooks is not None else Csim()
        self._ops = persistent.ring_ops() if launch == "persistent" else None

    @classmethod
    def probe(cls) -> Probe:
        """Available where C-simulation can build: a C++ compiler and hls4ml's ap_types headers."""
        try:
            built_with = csim.toolchain()
        except csim.ToolchainMissing as e:
            return Probe("emu", False, (), str(e))
        return Probe("emu", True, ("emu",), f"HLS C++ built with {built_with}")

    def load_bundle(self, bundle: Any) -> dict[str, KernelHandle]:
        """Load every kernel; persistent: each at the ring the bundle recorded for it (see the
        module doc), every size checked before the first kernel loads."""
        if self.launch != "persistent":
            return super().load_bundle(bundle)
        # unrecorded: the device's ring (emu builds the loop at load)
        return self._load_all(bundle, bundle.ring_sizes_for(self.name, self._ring_slots, self._ring_rows))

    def _upload(self, loaded: Loaded, resident: dict[str, np.ndarray]) -> _EmuKernel | _RingKernel:
        spec = loaded.kernel.spec
        if self.launch == "persistent":
            slots, rows = persistent.ring_size(loaded.ring, self._ring_slots, self._ring_rows)
            layout = persistent.ring_layout(spec, rows=rows, slots=slots)
            top = persistent.load(spec, layout)
            copies = [np.array(resident[a.name], copy=True) for a in persistent.resident_args(spec)]
            checks = []
            for f in layout.slot.fields:
                info = np.iinfo(f.dtype) if f.role == "scalar" else None
                checks.append((f, int(info.min) if info else None, int(info.max) if info else None, np.dtype(f.dtype)))
            st = _RingKernel(top, copies, self._csim, checks, rows)
            st.ring = self._start_ring(st)
            return st
        top = load_top(spec)
        return _EmuKernel(top, {k: np.array(v, copy=True) for k, v in resident.items()}, threading.Lock())

    # -- persistent launch ----------------------------------------------------------------------
    def _start_ring(self, st: _RingKernel) -> _Ring:
        layout = st.top.layout
        buf = layout.allocate()
        # The thread's arguments keep the ring and the resident copies alive for as long as the
        # loop runs, even after the ring is abandoned.
        t = threading.Thread(target=st.top.serve, args=(buf, st.resident, st.csim), name=f"offload-emu-{st.top.name}", daemon=True)
        ring = _Ring(layout, buf, t)
        t.start()
        return ring

    def _abandon(self, st: _RingKernel, ring: _Ring, why: str) -> None:
        """Mark ``ring`` hung: start a new ring and kernel thread in its place (the device
        reopened), fail everything waiting on the old one, and stop its loop if it ever idles again."""
        with st.lock:
            if ring.dead is not None:
                return
            if st.ring is ring and not ring.closing:
                st.resets += 1
                st.ring = self._start_ring(st)
            st.abandoned.append(ring)
            with ring.cond:
                ring.dead = why
                ring.cond.notify_all()
        self._ops.store_release(ring.base + HDR_STOP, STOP)

    def run(self, handle: KernelHandle, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """Per-call launch: :meth:`BufferedDevice.run`. Persistent: validate, pack, then one request
        through the kernel's ring (see the module doc)."""
        if self.launch != "persistent":
            return super().run(handle, inputs, timeout)
        self._check_open()
        loaded = self._get(handle)
        k = loaded.kernel
        get_kind(k.kind).validate(k.spec, k.tensors, inputs)  # before any device work
        values = loaded.hls.pack_inputs(k.spec, inputs)
        return loaded.hls.unpack_outputs(k.spec, inputs, self._execute_persistent(loaded, values, timeout))

    def _execute_persistent(self, loaded: Loaded, values: Mapping[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
        st: _RingKernel = loaded.state
        # Checked before a request number is taken: a taken number must be sent.
        bufs = []
        for f, lo, hi, want in st.checks:
            v = values.get(f.name)
            if v is None:
                raise DeviceError(f"kernel {loaded.kernel.name!r}: pack_inputs gave no value for {f.role} argument {f.name!r}")
            if lo is not None:  # a scalar
                v = int(v)
                if not lo <= v <= hi:
                    raise InputError(f"kernel {loaded.kernel.name!r}: scalar {f.name!r}={v} is outside {f.dtype} [{lo}, {hi}]")
            else:
                # What pack_inputs gives is already right; host_array refuses (or makes contiguous) the rest.
                if v.__class__ is not np.ndarray or v.dtype is not want or not v.flags.c_contiguous:
                    v = host_array(loaded.kernel.name, f, v)
                if v.size > f.count:
                    raise InputError(f"{f.name}: {v.size} elements exceed the ring slot's {f.count} "
                                     f"({st.rows} rows a request); open the device with a larger ring_rows")
            bufs.append(v)
        limit = self.deadline if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            ring = st.ring
            with ring.lock:
                if ring.closing:
                    raise DeviceError(f"device {self.name!r} is closed")
                if ring.dead is None:
                    n = ring.next_n
                    ring.next_n += 1
                    ring.inflight += 1
                    break
            time.sleep(0)  # a ring being replaced: the new one is a moment away
        layout = ring.layout
        s = (n - 1) % layout.slots
        try:
            try:
                slot = ring.base + layout.slot_offset(s)
                views = ring.views[s]
                if ring.turn[s] != n:
                    self._wait_turn(st, ring, s, n, deadline, limit, self._what(loaded))
                for (f, lo, _, _), v, view in zip(st.checks, bufs, views):
                    if lo is not None:
                        view[0] = v
                    elif f.role == "input":
                        view[: v.size] = v if v.ndim == 1 else v.reshape(-1)
            except BaseException as e:
                # Request n was taken but will never be sent: the kernel would wait for it forever.
                self._abandon(st, ring, f"request {n} was never sent ({type(e).__name__}: {e})")
                raise
            # Publish the request word last (release), then spin on the response word.
            resp = slot + layout.slot.resp_seq
            if not self._ops.post_wait(slot + SLOT_REQ_SEQ, n, resp, _SPIN_NS):
                self._back_off(st, ring, resp, n, deadline, limit, self._what(loaded))
            out = {f.name: view[: v.size].reshape(v.shape).copy()
                   for (f, lo, _, _), v, view in zip(st.checks, bufs, views) if lo is None and f.role == "output"}
        finally:
            with ring.lock:
                ring.inflight -= 1
                if ring.dead is None and ring.turn[s] == n:
                    ring.turn[s] = n + layout.slots
                if ring.waiting:
                    ring.cond.notify_all()
        return out

    def _what(self, loaded: Loaded) -> str:
        return f"kernel {loaded.kernel.name!r} ({loaded.state.top.name}) on device {self.name!r}"

    def _wait_turn(self, st: _RingKernel, ring: _Ring, s: int, n: int, deadline: float, limit: float, what: str) -> None:
        with ring.cond:
            while ring.turn[s] != n:
                if ring.dead is not None:
                    raise DeviceError(f"{what}: request {n} failed: the kernel was declared hung ({ring.dead}) and restarted")
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                ring.waiting += 1
                try:
                    ring.cond.wait(left)
                finally:
                    ring.waiting -= 1
            else:
                return
        why = f"request {n - ring.layout.slots} held slot {s} past request {n}'s deadline of {limit:g} s"
        self._abandon(st, ring, why)
        raise DeviceTimeout(f"{what}: {why}; the kernel was declared hung and restarted")

    def _back_off(self, st: _RingKernel, ring: _Ring, resp: int, n: int, deadline: float, limit: float, what: str) -> None:
        ops = self._ops
        nap = _FIRST_NAP_S
        while True:
            if ring.dead is not None:
                raise DeviceError(f"{what}: request {n} failed: the kernel was declared hung ({ring.dead}) and restarted")
            if not ring.thread.is_alive():
                if ops.wait(resp, n, 0):
                    return
                why = f"its loop exited without answering request {n}"
                self._abandon(st, ring, why)
                raise DeviceError(f"{what}: {why}; the kernel was restarted")
            left = deadline - time.monotonic()
            if left <= 0:
                if ops.wait(resp, n, 0):
                    return
                why = f"request {n} was not answered within {limit:g} s"
                self._abandon(st, ring, why)
                raise DeviceTimeout(f"{what}: {why}; the kernel was declared hung and restarted")
            time.sleep(min(nap, left))
            nap = min(2 * nap, _MAX_NAP_S)
            if ops.wait(resp, n, _RESPIN_NS):
                return

    def _close_rings(self) -> None:
        """Drain every ring (calls in flight finish, new ones are refused), then stop and join."""
        for loaded in self._loaded:
            st: _RingKernel = loaded.state  # every kernel of a persistent device
            with st.lock:
                ring = st.ring
                ring.closing = True
            end = time.monotonic() + self.deadline
            with ring.cond:
                while ring.inflight and ring.dead is None and time.monotonic() < end:
                    ring.waiting += 1
                    try:
                        ring.cond.wait(end - time.monotonic())
                    finally:
                        ring.waiting -= 1
            for r in [ring, *st.abandoned]:
                self._ops.store_release(r.base + HDR_STOP, STOP)
            ring.thread.join(timeout=max(0.0, end - time.monotonic()))

    def _execute(self, loaded: Loaded, values: dict[str, Any], timeout: float | None) -> dict[str, np.ndarray]:
        state: _EmuKernel = loaded.state

        def call() -> dict[str, np.ndarray]:
            taken = []
            try:
                call_args: list[Any] = []
                outs: list[tuple[str, np.ndarray, np.ndarray]] = []
                for a in loaded.args:
                    if a.role == "resident":
                        call_args.append(state.resident[a.name])
                    elif a.role == "scalar":
                        call_args.append(values[a.name])
                    else:
                        host = values[a.name]
                        key, raw = self._pool.acquire(a.bundle, host.nbytes)
                        taken.append((key, raw))
                        dev = raw[: host.nbytes].view(host.dtype).reshape(host.shape)
                        # Outputs are synced too: the contract hands them over as zero arrays.
                        np.copyto(dev, host)
                        call_args.append(dev)
                        if a.role == "output":
                            outs.append((a.name, host, dev))
                with state.lock:
                    state.top(call_args)
                return {name: dev.copy() for name, _host, dev in outs}
            finally:
                for key, raw in taken:
                    self._pool.release(key, raw)

        return self._with_timeout(call, timeout, f"kernel {loaded.kernel.name!r} ({loaded.top})")

    def _details(self) -> dict[str, Any]:
        d: dict[str, Any] = {"buffer_allocations": self._pool.allocations, "launch": self.launch}
        if self.launch == "persistent":
            rings: list[_RingKernel] = [lo.state for lo in self._loaded]
            sent = sum(r.next_n - 1 for st in rings for r in [st.ring, *st.abandoned] if r is not None)
            slots, rows = persistent.ring_size(None, self._ring_slots, self._ring_rows)
            d["ring"] = {"slots": slots, "rows": rows,
                         "requests": sent, "resets": sum(st.resets for st in rings),
                         "kernels": {lo.kernel.name: {"slots": lo.state.top.layout.slots, "rows": lo.state.rows} for lo in self._loaded}}
        return d

    def _description(self) -> str:
        how = "persistent kernels over a ring in host memory" if self.launch == "persistent" else "a run per call"
        return f"HLS C++ built with g++, card buffer semantics (software emulation), {how}"

    def _shutdown(self) -> None:
        if self.launch == "persistent":
            self._close_rings()
        self._pool.close()

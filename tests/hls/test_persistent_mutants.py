"""The persistent top generator at the edges its mutants reached (TESTING.md, mutation testing):
the m_axi depth of the ring port, a ring buffer of the wrong size, a request that exactly fills its
slot, the host helpers built once, and a ring large enough that its slot addresses carry into the
page bits (an address is a sum, never a bitwise or)."""

from __future__ import annotations

import numpy as np
import pytest

from _host_util import sa
from offload.hls import persistent
from offload.kernels.catalogue import entries
from offload.kernels.ring import HEADER_BYTES, LINE
from offload.sim.errors import InputError


def _mlp_spec():
    return next(e for e in entries() if e.name == "mlp/16-8-1/ap_fixed16_6/r1/relu").build().kernel.spec


def test_the_ring_port_depth_is_the_ring_in_64_bit_words():
    spec = _mlp_spec()
    lay = persistent.ring_layout(spec, rows=2, slots=3)
    # x: 2 rows x 16 features of int16 (64 bytes), y: 2 x 1: header 3 lines, each slot the request
    # line, the scalar line (the row count), the x line, the y line and the response line.
    assert lay.slot.size == 5 * LINE and lay.nbytes == 3 * LINE + 3 * 5 * LINE
    src = persistent.sources(spec, lay)[f"{persistent.top_name(spec)}.cpp"]
    assert f"bundle = gmem_ring depth = {(3 + 15) * LINE // 8}\n" in src


def test_serve_refuses_a_ring_of_another_size_before_the_loop_runs():
    k = sa.make_kernel(n=4)
    lay = persistent.ring_layout(k.spec, rows=1, slots=2)
    top = persistent.load(k.spec, lay)
    resident = [np.asarray(k.tensors["bias"])]
    for nbytes in (lay.nbytes - LINE, lay.nbytes + LINE):
        raw = np.zeros(nbytes + 4096, dtype=np.uint8)
        at = (-raw.ctypes.data) % 4096
        with pytest.raises(InputError, match=f"the ring must be {lay.nbytes} bytes, 64-byte aligned"):
            top.serve(raw[at: at + nbytes], resident)


def test_a_request_that_exactly_fills_its_slot_is_written_and_one_more_element_is_refused():
    k = sa.make_kernel(n=4)
    lay = persistent.ring_layout(k.spec, rows=3, slots=1)
    ring = lay.allocate()
    full = np.arange(12, dtype=np.int32)
    persistent.write_request(lay, ring, 0, {"batch": 3, "x": full, "y": np.zeros(12, np.int32)})
    np.testing.assert_array_equal(lay.view(ring, 0, "x"), full)
    with pytest.raises(InputError, match=r"x: 13 elements exceed the ring slot's 12"):
        persistent.write_request(lay, ring, 0, {"batch": 3, "x": np.zeros(13, np.int32), "y": np.zeros(12, np.int32)})


def test_the_host_helpers_are_built_once_per_process():
    assert persistent.ring_ops() is persistent.ring_ops()


def test_run_csim_over_a_ring_spanning_many_pages_answers_every_request():
    """256 slots of 4 KiB and more: slot offsets set the address bits from 4 KiB up to 1 MiB, which a
    page-aligned base shares with them, so an address or'ed instead of added lands elsewhere."""
    k = sa.make_kernel(n=64, scale=9)
    reqs = [sa.make_inputs(n=64, batch=8, seed=i) for i in range(256)]
    lay = persistent.ring_layout(k.spec, rows=8, slots=256)
    assert lay.slot.size > 4096 and lay.nbytes > 1 << 20 and HEADER_BYTES < lay.slot_offset(1)
    outs = persistent.run_csim(k, reqs, rows=8)
    for inp, out in zip(reqs, outs):
        x = inp["x"].astype(np.int64)
        want = ((x * 9 + k.tensors["bias"].astype(np.int64)) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
        np.testing.assert_array_equal(out["y"], want)

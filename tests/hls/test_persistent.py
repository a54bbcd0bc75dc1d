"""The persistent top generator: ring layouts from the specs, the generated loop, and its
C-simulation through the ring equal to the sim reference for every kind (embedding, table-batched
embedding, MLP)."""

from __future__ import annotations

import numpy as np
import pytest

from offload.hls import persistent
from offload.host import open_device
from offload.kernels.catalogue import entries
from offload.kernels.ring import HEADER_BYTES, LINE, Field, RingLayout, request_capacity, slot_layout
from offload.sim.errors import InputError


def _entry(name: str):
    return next(e for e in entries() if e.name == name)


def test_slot_layout_lines_and_order():
    slot = slot_layout([Field("x", "input", "int16", 5), Field("n", "scalar", "int32", 1),
                        Field("y", "output", "int8", 3), Field("w", "scalar", "int32", 1)])
    offs = {f.name: f.offset for f in slot.fields}
    # request word alone on line 0; scalars packed from line 1; each array on its own line; the
    # response word on the last line.
    assert offs == {"n": 64, "w": 72, "x": 128, "y": 192}
    assert slot.resp_seq == 256 and slot.size == 320
    assert all(f.offset % 8 == 0 for f in slot.fields) and slot.size % LINE == 0
    assert slot.input_bytes == 64 + 64 and slot.output_bytes == 64
    with pytest.raises(InputError, match="duplicate field names"):
        slot_layout([Field("x", "input", "int8", 1), Field("x", "output", "int8", 1)])
    with pytest.raises(InputError, match="ring slots: 0 is outside"):
        RingLayout(0, slot)


def test_ring_layout_from_spec_matches_the_top_arguments():
    spec = _entry("emb/sum/mixed/d16+4+64/bag20/t3").build().kernel.spec
    lay = persistent.ring_layout(spec, rows=10, slots=4)
    cap = request_capacity(spec, 10)
    assert cap == {"indices": 10 * 3 * 20, "offsets": 31, "per_sample_weights": 600, "out": 10 * 84}
    got = {f.name: (f.role, f.dtype, f.count) for f in lay.slot.fields}
    assert got["indices"] == ("input", "int64", 600) and got["out"][0] == "output" and got["out"][2] == 840
    assert got["num_bags"][0] == got["weighted"][0] == "scalar"
    assert lay.nbytes == HEADER_BYTES + 4 * lay.slot.size
    buf = lay.allocate()
    assert buf.ctypes.data % 4096 == 0 and lay.view(buf, 3, "indices").shape == (600,)


def test_generated_loop_publishes_the_response_word_last():
    spec = _entry("mlp/16-8-1/ap_fixed16_6/r1/relu").build().kernel.spec
    src = persistent.sources(spec)[f"{persistent.top_name(spec)}.cpp"]
    call = src.index(f"offload_mlp_{spec.digest()}((const")
    publish = src.index("offload_ring::store_release(slot +")
    assert call < publish and "wait_request(ring" in src
    assert "#pragma HLS INTERFACE m_axi port = ring offset = slave bundle = gmem_ring" in src


@pytest.mark.parametrize("name", [
    "emb/sum/ap_fixed16_6/d16/bag20/t1",
    "emb/wsum/int8_rowwise/d16/var64/t1",
    "emb/sum/mixed/d16+4+64/bag20/t3",  # table-batched
    "mlp/16-8-1/ap_fixed16_6/r1/relu+sigmoid",
])
def test_run_csim_through_the_ring_equals_sim(name):
    case = _entry(name).build()
    sim = open_device("sim")
    want = sim.run(sim.load(case.kernel), case.inputs)
    outs = persistent.run_csim(case.kernel, [case.inputs] * 3)
    assert len(outs) == 3
    for out in outs:
        assert set(out) == set(want)
        for k in want:
            assert out[k].dtype == want[k].dtype and np.array_equal(out[k], want[k])
    sim.close()


def test_request_too_large_for_its_slot_is_refused_naming_the_field():
    case = _entry("emb/sum/ap_fixed16_6/d16/bag20/t1").build()
    with pytest.raises(InputError, match=r"indices: \d+ elements exceed the ring slot's 20"):
        persistent.run_csim(case.kernel, [case.inputs], rows=1)

"""The ring's header as both parties read it: the words ``RingLayout.allocate`` writes at the byte
offsets the module docstring documents, the same offsets in the C++ side (``offload_ring.h``), the
slot count's range at both ends, and each kind's per-request capacity from its spec's shape."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import offload.hls
from offload.kernels import ring
from offload.kernels.ring import Field, RingLayout, request_capacity, slot_layout
from offload.sim.errors import InputError

SLOT = slot_layout([Field("n", "scalar", "int32", 1), Field("x", "input", "int32", 3), Field("y", "output", "int32", 2)])


def _u64(buf: np.ndarray, at: int) -> int:
    return int.from_bytes(buf[at : at + 8].tobytes(), "little")


def test_allocate_writes_magic_version_slots_and_slot_bytes_at_the_documented_offsets():
    lay = RingLayout(slots=3, slot=SLOT)
    buf = lay.allocate()
    assert buf.tobytes()[:8] == b"OFLDRING"  # line 0: magic ...
    assert (_u64(buf, 8), _u64(buf, 16), _u64(buf, 24)) == (1, 3, SLOT.size)  # ... version, slots, slot bytes
    assert not buf[32:].any()  # the rest of the header (stop, stopped) and every slot start zeroed
    assert len(buf) == 3 * 64 + 3 * SLOT.size


def test_the_header_offsets_agree_with_the_cpp_side():
    assert (ring.HDR_MAGIC, ring.HDR_VERSION, ring.HDR_SLOTS, ring.HDR_SLOT_BYTES) == (0, 8, 16, 24)
    assert (ring.HDR_STOP, ring.HDR_STOPPED, ring.HEADER_BYTES) == (64, 128, 192)  # lines 1, 2; 3 lines
    src = (Path(offload.hls.__file__).parent / "src" / "offload_ring.h").read_text()
    words = {k: int(v) for k, v in re.findall(r"static const int (HDR_\w+_WORD) = (\d+);", src)}
    assert words["HDR_STOP_WORD"] * 8 == ring.HDR_STOP
    assert words["HDR_STOPPED_WORD"] * 8 == ring.HDR_STOPPED
    assert int(re.search(r"static const uint64_t STOP = (\d+);", src).group(1)) == ring.STOP


def test_slot_count_is_accepted_from_1_to_65536():
    assert RingLayout(1, SLOT).slots == 1 and RingLayout(1 << 16, SLOT).slots == 1 << 16
    for n in (0, (1 << 16) + 1):
        with pytest.raises(InputError, match=f"ring slots: {n} is outside"):
            RingLayout(n, SLOT)


def test_capacity_of_a_request_scales_with_its_rows_and_the_specs_shape():
    mlp = SimpleNamespace(kind="mlp", n_features=5, n_outputs=3)
    assert request_capacity(mlp, 1) == {"x": 5, "y": 3}
    assert request_capacity(mlp, 7) == {"x": 35, "y": 21}
    emb = SimpleNamespace(kind="embedding", num_tables=2, max_bag_size=4, total_dim=24)
    assert request_capacity(emb, 3) == {"indices": 24, "offsets": 7, "per_sample_weights": 24, "out": 72}
    with pytest.raises(InputError, match="ring rows: 0 must be at least 1"):
        request_capacity(mlp, 0)


def test_each_view_is_its_fields_bytes_in_its_slot():
    slot = slot_layout([Field("n", "scalar", "int32", 1), Field("w", "scalar", "int32", 1), Field("x", "input", "int16", 3)])
    lay = RingLayout(slots=2, slot=slot)
    buf = lay.allocate()
    for s in (0, 1):
        base = lay.slot_offset(s)
        for name, at, v in (("n", 64, -3 - s), ("w", 72, 7 + s)):  # scalars 8 bytes apart from line 1
            view = lay.view(buf, s, name)
            assert view.dtype == np.int64 and view.shape == (1,)
            view[0] = v
            assert int.from_bytes(buf[base + at : base + at + 8].tobytes(), "little", signed=True) == v
        x = lay.view(buf, s, "x")
        assert x.dtype == np.int16 and x.shape == (3,)
        x[:] = [1, -2, 3 + s]
        assert buf[base + 128 : base + 134].view("<i2").tolist() == [1, -2, 3 + s]
    with pytest.raises(KeyError, match="no field 'q'"):
        lay.view(buf, 0, "q")

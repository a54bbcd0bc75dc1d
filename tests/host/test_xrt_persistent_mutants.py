"""The xrt device's ring client at the edges its mutants reached (TESTING.md, mutation testing),
through the pyxrt stand-in: ring sizes past Python's small-int cache compared by value, a bundle
that records no compute units for its persistent top, a request filling its whole slot on a
card-memory ring (every output byte synced back), a card-memory ring whose input field's offset
and size share bits (the inputs' sync span is a sum), and an abandoned ring's reason when the
kernel's name itself holds ": "; request numbers past the small-int cache on a card-memory ring,
the backoff schedule, close draining every request in flight."""

from __future__ import annotations

import threading
import time

import pytest

from _host_util import assert_same, fakes, sa  # noqa: F401  (fakes is a fixture)
from test_xrt_persistent import _bundle, _kernel, _open, _sim
from offload.hls import persistent
from offload.host.xrt import XrtDevice
from offload.sim.errors import DeviceTimeout


def test_ring_sizes_past_the_small_int_cache_are_compared_by_value(fakes, tmp_path):
    size = {"slots": 300, "rows": 1}
    b = _bundle(tmp_path, [_kernel()], built=size, recorded=size)
    slots = int("300")  # equal to the manifest's 300, another object
    dev = XrtDevice("xrt:0", "persistent", ring_slots=slots, ring_rows=1)
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=1)
    assert_same(dev.run(h, inp, timeout=5), _sim(b, "sa")(inp))
    assert dev.info().details["rings"][0]["slots"] == 300
    dev.close()


def test_a_persistent_top_without_recorded_compute_units_is_opened_by_name(fakes, tmp_path):
    import pyxrt

    from offload.host.bundle import record_xclbin, save

    k = _kernel()
    p = save([k], tmp_path / "b.offload")
    rt = persistent.top_name(k.spec)
    xb = tmp_path / "fake.xclbin"
    pyxrt.write_xclbin(xb, [{"name": rt, "cus": [f"{rt}_1"], "kind": k.kind, "spec": k.spec.to_json(), "banks": "shared",
                             "ring": {"rows": persistent.DEFAULT_ROWS, "slots": persistent.DEFAULT_SLOTS}, "ring_memory": "HOST"}])
    b = record_xclbin(p, xb, target="u55c", platform="xilinx_u55c_gen3x16_xdma_3_202210_1")  # no compute_units
    assert b.compute_units == {}
    dev, h = _open(b)
    inp = sa.make_inputs(n=8, batch=3)
    assert_same(dev.run(h, inp, timeout=5), _sim(b, "sa")(inp))
    assert dev.info().details["rings"][0]["compute_unit"] == rt
    dev.close()


def test_a_full_slot_on_a_card_memory_ring_syncs_every_output_byte(fakes, tmp_path):
    b = _bundle(tmp_path, [_kernel()], ring_memory="card")
    dev, h = _open(b)
    want = _sim(b, "sa")
    for s in range(3):  # slots 0, 1, 2: their offsets differ in the bits the outputs' offset has
        inp = sa.make_inputs(n=8, batch=persistent.DEFAULT_ROWS, seed=s)
        assert_same(dev.run(h, inp, timeout=5), want(inp))
    assert dev.info().details["rings"][0]["memory"] == "card"
    dev.close()


def test_a_card_memory_ring_whose_input_offset_and_size_share_bits(fakes, tmp_path):
    """4 rows of 8 int32: x is 128 bytes at slot offset 128, so the inputs end at 256 (128 ^ 128
    would be 0 and leave them unsynced in card memory)."""
    size = {"slots": 2, "rows": 4}
    b = _bundle(tmp_path, [_kernel()], ring_memory="card", built=size, recorded=size)
    dev, h = _open(b)
    want = _sim(b, "sa")
    for s in range(4):
        inp = sa.make_inputs(n=8, batch=4, seed=s)
        assert_same(dev.run(h, inp, timeout=5), want(inp))
    dev.close()


def test_an_abandoned_ring_keeps_the_reason_whole_whatever_the_kernel_name(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel(name="risk: v2")], ring_cus=2)
    pyxrt.inject_ring_fault(die_at=1)
    dev, h = _open(b, "risk: v2")
    with pytest.raises(DeviceTimeout, match=r"kernel 'risk: v2' \(persistent compute unit .*\) on 'xrt:0': request 1 was not answered"):
        dev.run(h, sa.make_inputs(n=8, batch=2), timeout=0.2)
    dead = [r["abandoned"] for r in dev.info().details["rings"] if r["abandoned"]]
    assert dead == ["request 1 was not answered within 0.2 s; the compute unit is marked hung and its ring abandoned"]
    dev.close()


def test_request_numbers_past_the_small_int_cache_are_answered_on_a_card_memory_ring(fakes, tmp_path):
    b = _bundle(tmp_path, [_kernel()], ring_memory="card")
    dev, h = _open(b)
    want = _sim(b, "sa")
    inp = sa.make_inputs(n=8, batch=1)
    y = want(inp)
    for _ in range(300):  # request numbers 257..300 compare by value with the response word
        assert_same(dev.run(h, inp, timeout=5), y)
    assert dev.info().details["rings"][0]["answered"] == 300
    dev.close()


def test_the_wait_backs_off_from_the_first_nap_doubling_to_the_last(fakes, tmp_path, monkeypatch):
    """A request no loop answers: after the spin the host naps 20 us, 40 us, ... up to 1 ms (the
    module's documented schedule), so a card that answers soon is seen soon and a silent one costs
    little."""
    import offload.host.xrt as hx

    class Clock:
        monotonic = staticmethod(time.monotonic)

        def __init__(self):
            self.naps = []

        def sleep(self, s):
            self.naps.append(s)
            time.sleep(s)

    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()])
    pyxrt.inject_ring_fault(die_at=1)
    dev, h = _open(b)
    clock = Clock()
    monkeypatch.setattr(hx, "time", clock)
    with pytest.raises(DeviceTimeout):
        dev.run(h, sa.make_inputs(n=8, batch=1), timeout=0.5)
    first, last = hx._POLL_FIRST_S, hx._POLL_MAX_S
    want = [first * 2**i for i in range(6)] + [last, last]
    assert want[5] < last < 2 * want[5]
    assert clock.naps[:8] == pytest.approx(want)
    monkeypatch.undo()
    dev.close()


def test_close_drains_every_request_in_flight(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()])
    want = _sim(b, "sa")
    pyxrt.inject_ring_fault(delay_permille=1000, max_delay_us=20_000, seed=5)  # every request takes up to 20 ms
    dev, h = _open(b)
    inputs = [sa.make_inputs(n=8, batch=1 + i % 3, seed=i) for i in range(6)]
    results: list = [None] * len(inputs)

    def call(i):
        try:
            results[i] = dev.run(h, inputs[i], timeout=10)
        except Exception as e:  # noqa: BLE001 - asserted below
            results[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    ring = dev._loaded[0].state.rings[0]  # white box: every call has taken its number
    while ring.next_n <= len(inputs):
        time.sleep(0.001)
    dev.close()
    for t in threads:
        t.join(timeout=20)
    for i, r in enumerate(results):
        assert isinstance(r, dict), f"call {i}: {r!r}"
        assert_same(r, want(inputs[i]))

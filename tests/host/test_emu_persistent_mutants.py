"""emu's ring client at the edges its mutants reached (TESTING.md, mutation testing): a launch mode
given as a string built at run time, a scalar at its range's last value and one past it, a slot
write that fails after its request number was taken, a wait for a slot's turn shorter than a second,
and close while calls wait for their turn (it drains them: every one answered)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from _host_util import assert_same, sa
from offload.host import open_device
from offload.host.emu import Csim, EmuDevice
from offload.sim.errors import InputError


@pytest.fixture
def sim():
    d = open_device("sim")
    yield d
    d.close()


def _state(dev, h):
    return dev._loaded[h.slot].state  # white box: the kernel's ring state


def test_a_launch_mode_built_at_run_time_is_the_same_mode(sim):
    mode = "".join(["persis", "tent"])  # equal to "persistent", not the same object
    dev = EmuDevice("emu", mode)
    assert "persistent kernels over a ring" in dev.info().description
    k = sa.make_kernel(n=8, scale=3)
    h = dev.load(k)
    inp = sa.make_inputs(n=8, batch=3)
    assert_same(dev.run(h, inp), sim.run(sim.load(k), inp))
    assert dev.info().details["ring"]["requests"] == 1
    dev.close()


def test_a_scalar_at_its_last_value_is_sent_and_one_past_it_refused(sim):
    dev = EmuDevice("emu", "persistent")
    k = sa.make_kernel(n=4, scale=3)
    h, hs = dev.load(k), sim.load(k)
    st = _state(dev, h)
    # Narrow the batch scalar's range to [0, 5] (the int32 range's ends cannot be reached with
    # real rows): the check is what is under test, inclusive at both ends.
    st.checks = [(f, 0, 5, dt) if f.role == "scalar" else (f, lo, hi, dt) for f, lo, hi, dt in st.checks]
    inp = sa.make_inputs(n=4, batch=5)
    assert_same(dev.run(h, inp), sim.run(hs, inp))
    with pytest.raises(InputError, match=r"scalar 'batch'=6 is outside int32 \[0, 5\]"):
        dev.run(h, sa.make_inputs(n=4, batch=6))
    assert dev.info().details["ring"]["requests"] == 1  # refused before a number was taken
    dev.close()


def test_a_slot_write_that_fails_after_its_number_was_taken_abandons_the_ring(sim):
    """Request 1's number is taken, then writing its slot fails: the kernel would wait for request 1
    forever, so the ring is replaced at once and the next call is answered, not timed out."""
    dev = EmuDevice("emu", "persistent")
    k = sa.make_kernel(n=4, scale=3)
    h, hs = dev.load(k), sim.load(k)
    old = _state(dev, h).ring
    x = next(v for v, (f, *_) in zip(old.views[0], _state(dev, h).checks) if f.name == "x")
    x.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        dev.run(h, sa.make_inputs(n=4, batch=2))
    assert old.dead and "request 1 was never sent" in old.dead and _state(dev, h).ring is not old
    inp = sa.make_inputs(n=4, batch=2, seed=5)
    t0 = time.monotonic()
    assert_same(dev.run(h, inp, timeout=20), sim.run(hs, inp))
    assert time.monotonic() - t0 < 10 and dev.info().details["ring"]["resets"] == 1
    dev.close()


def test_a_call_waiting_under_a_second_for_its_slot_gets_its_turn(sim):
    """One slot: the second call waits for the first (each request delayed up to 50 ms by the
    kernel) with a deadline of 0.9 s, which is ample; it must wait, not give up."""
    hooks = Csim(seed=4, delay_permille=1000, max_delay_us=50_000)
    dev = EmuDevice("emu", "persistent", ring_slots=1, csim_hooks=hooks)
    k = sa.make_kernel(n=4, scale=3)
    h, hs = dev.load(k), sim.load(k)
    a, b = sa.make_inputs(n=4, batch=2, seed=1), sa.make_inputs(n=4, batch=3, seed=2)
    first = dev.submit(h, a, 10)
    while dev.info().details["ring"]["requests"] < 1:  # request 1 holds the one slot
        time.sleep(0.001)
    assert_same(dev.run(h, b, timeout=0.9), sim.run(hs, b))
    assert_same(first.result(timeout=10), sim.run(hs, a))
    assert dev.info().details["ring"]["resets"] == 0
    dev.close()


def test_close_drains_the_calls_waiting_for_their_turn(sim):
    hooks = Csim(seed=9, delay_permille=1000, max_delay_us=30_000)
    dev = EmuDevice("emu", "persistent", ring_slots=1, csim_hooks=hooks)
    k = sa.make_kernel(n=4, scale=7)
    h, hs = dev.load(k), sim.load(k)
    inputs = [sa.make_inputs(n=4, batch=1 + i % 3, seed=i) for i in range(6)]
    results: list = [None] * len(inputs)

    def call(i):
        try:
            results[i] = dev.run(h, inputs[i], timeout=8)
        except Exception as e:  # noqa: BLE001 - recorded and asserted below
            results[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    while dev.info().details["ring"]["requests"] < len(inputs):  # every call has its number
        time.sleep(0.001)
    dev.close()
    for t in threads:
        t.join(timeout=20)
    for i, r in enumerate(results):
        assert isinstance(r, dict), f"call {i}: {r!r}"
        assert_same(r, sim.run(hs, inputs[i]))
    assert not _state(dev, h).ring.thread.is_alive()
    np.testing.assert_equal(dev.info().details["ring"]["resets"], 0)


def test_ring_sizes_past_the_small_int_cache_are_compared_by_value(tmp_path, sim):
    from offload.host.bundle import RingSize, load, save

    k = sa.make_kernel("a", n=4)
    b = load(save([k], tmp_path / "b.offload", rings={"a": RingSize(300, 1)}))
    dev = EmuDevice("emu", "persistent", ring_slots=int("300"))  # equal to the manifest's, another object
    h = dev.load_bundle(b)["a"]
    inp = sa.make_inputs(n=4, batch=1)
    assert_same(dev.run(h, inp), sim.run(sim.load(k), inp))
    assert dev.info().details["ring"]["kernels"] == {"a": {"slots": 300, "rows": 1}}
    dev.close()

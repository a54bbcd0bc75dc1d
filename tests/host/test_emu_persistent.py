"""emu's persistent launch: the ring protocol's promises, one at a time.

A kernel that is slow past a call's deadline, a kernel that dies holding a request (before or
after writing its outputs), a request too large for a slot, close: each either answers the right
request or fails with a typed error naming what happened, and the device keeps working after.
(The stress test runs them all at once: test_emu_persistent_stress.py.)
"""

from __future__ import annotations

import pytest

from _host_util import assert_same, sa
from offload.host import DeviceError, DeviceTimeout, open_device
from offload.host.emu import Csim, EmuDevice
from offload.sim.errors import InputError, UnsupportedError


@pytest.fixture
def sim():
    d = open_device("sim")
    yield d
    d.close()


def _ring(dev, h):
    return dev._loaded[h.slot].state.ring  # the ring a kernel serves now (white box: its thread and words)


def test_open_device_launch_modes():
    with pytest.raises(InputError, match="launch: 'sometimes' is not one of"):
        open_device("emu", launch="sometimes")
    with pytest.raises(UnsupportedError, match="device 'sim': no 'persistent' launch mode"):
        open_device("sim", launch="persistent")
    d = open_device("emu", launch="persistent")
    assert d.launch == "persistent" and d.info().details["launch"] == "persistent"
    assert "persistent kernels" in d.info().description
    d.close()
    assert open_device("emu").launch == "per_call"


def test_kernel_thread_runs_from_load_and_stops_at_close(sim):
    dev = EmuDevice("emu", "persistent")
    k = sa.make_kernel(n=8, scale=3)
    h, hs = dev.load(k), sim.load(k)
    ring = _ring(dev, h)
    assert ring.thread.is_alive()  # started once, at load
    for seed in range(5):
        inp = sa.make_inputs(n=8, batch=1 + seed, seed=seed)
        assert_same(dev.run(h, inp), sim.run(hs, inp))
    assert dev.info().details["ring"]["requests"] == 5
    dev.close()
    assert not ring.thread.is_alive()
    # The loop acknowledged the stop word with the number of the last request it answered.
    assert int(ring.layout.word(ring.buf, 2 * 64)[0]) == 5


def test_a_slow_answer_past_the_deadline_is_never_returned(sim):
    """The kernel sleeps on every request; a call with a short deadline fails, the ring is
    abandoned and a new one started, and the late answer never reaches a later call."""
    hooks = Csim(seed=1, delay_permille=1000, max_delay_us=300_000)
    dev = EmuDevice("emu", "persistent", csim_hooks=hooks)
    k = sa.make_kernel(n=8, scale=5)
    h, hs = dev.load(k), sim.load(k)
    first = sa.make_inputs(n=8, batch=2, seed=1)
    old = _ring(dev, h)
    with pytest.raises(DeviceTimeout, match=r"request 1 was not answered within 0.001 s; the kernel was declared hung"):
        dev.run(h, first, timeout=0.001)
    assert dev.info().details["ring"]["resets"] == 1
    assert _ring(dev, h) is not old and old.dead
    hooks.delay_permille = 0  # the C loop reads its block live
    second = sa.make_inputs(n=8, batch=2, seed=2)
    for _ in range(3):
        assert_same(dev.run(h, second), sim.run(hs, second))
    dev.close()


@pytest.mark.parametrize("after_compute", [False, True], ids=["holding-request", "outputs-written"])
def test_a_kernel_that_dies_mid_request_fails_that_call_and_is_restarted(sim, after_compute):
    """Dying after writing the outputs but before the response word must fail too: the
    response word is the only thing that says an answer is there."""
    hooks = Csim(die_at=3, die_after_compute=int(after_compute))
    dev = EmuDevice("emu", "persistent", csim_hooks=hooks)
    k = sa.make_kernel(n=4, scale=7)
    h, hs = dev.load(k), sim.load(k)
    inp = sa.make_inputs(n=4, batch=3)
    dev.run(h, inp)
    dev.run(h, inp)
    with pytest.raises(DeviceError, match="its loop exited without answering request 3; the kernel was restarted"):
        dev.run(h, inp, timeout=30)
    assert hooks.die_at == 0  # one-shot: the restarted loop lives
    assert_same(dev.run(h, inp), sim.run(hs, inp))
    assert dev.info().details["ring"]["resets"] == 1
    dev.close()


def test_a_request_larger_than_a_slot_is_refused_before_it_is_sent(sim):
    dev = EmuDevice("emu", "persistent", ring_rows=4)
    k = sa.make_kernel(n=8, scale=3)
    h, hs = dev.load(k), sim.load(k)
    with pytest.raises(InputError, match=r"x: 40 elements exceed the ring slot's 32 \(4 rows a request\)"):
        dev.run(h, sa.make_inputs(n=8, batch=5))
    assert dev.info().details["ring"] == {"slots": 8, "rows": 4, "requests": 0, "resets": 0, "kernels": {"sa": {"slots": 8, "rows": 4}}}
    inp = sa.make_inputs(n=8, batch=4)
    assert_same(dev.run(h, inp), sim.run(hs, inp))
    dev.close()


def test_more_requests_than_slots_wrap_the_ring(sim):
    """Slot reuse: request n waits for request n - slots to be read; numbers never repeat."""
    dev = EmuDevice("emu", "persistent", ring_slots=2)
    k = sa.make_kernel(n=8, scale=11)
    h, hs = dev.load(k), sim.load(k)
    futs = [(dev.submit(h, sa.make_inputs(n=8, batch=1 + i % 3, seed=i)), i) for i in range(40)]
    for f, i in futs:
        assert_same(f.result(timeout=60), sim.run(hs, sa.make_inputs(n=8, batch=1 + i % 3, seed=i)))
    ring = _ring(dev, h)
    assert ring.next_n == 41 and ring.turn == [41, 42]
    dev.close()


def test_closed_device_refuses_calls():
    dev = EmuDevice("emu", "persistent")
    h = dev.load(sa.make_kernel())
    dev.close()
    with pytest.raises(DeviceError, match="closed"):
        dev.run(h, sa.make_inputs())

"""The local engine's card lifecycle, on recording devices: every card of a batch runs at once,
``close()`` closes every card's device, and only after the batch's other cards have finished, even
when one card's run failed. Each test fails on a cosmic-ray mutant that the sharded collection's
tests let through (TESTING.md, "Mutation testing")."""

from __future__ import annotations

import threading
import time

import pytest

from offload.plan import Topology
from offload.plan import engine as engine_mod
from offload.plan.engine import open_engine
from offload.sim.errors import DeviceError

TOPO = Topology.uniform("u55c", hosts=1, cards_per_host=3)
CARDS = [(0, 0), (0, 1), (0, 2)]


class _Recorder:
    """A device that logs (event, card) and runs what the input says: wait at a barrier, sleep, or fail."""

    def __init__(self, log, lock):
        self.log, self.lock, self.card = log, lock, None

    def load(self, kernel):
        self.card = kernel
        return kernel

    def run(self, handle, x):
        if "barrier" in x:
            x["barrier"].wait(timeout=5)  # BrokenBarrierError unless every card is in flight at once
        if "fail" in x:
            raise DeviceError(f"card {handle}: failed")
        time.sleep(x.get("sleep", 0.0))
        with self.lock:
            self.log.append(("ran", handle))
        return {"card": handle}

    def close(self):
        with self.lock:
            self.log.append(("closed", self.card))


@pytest.fixture
def recorded(monkeypatch):
    log, lock = [], threading.Lock()
    monkeypatch.setattr(engine_mod, "open_device", lambda spec: _Recorder(log, lock))
    eng = open_engine("local", TOPO)
    eng.load({c: [c] for c in CARDS})  # each card's one "kernel" is its own name
    yield eng, log
    eng.close()


def test_every_card_of_a_batch_runs_at_once(recorded):
    eng, log = recorded
    barrier = threading.Barrier(len(CARDS))
    out = eng.run({c: [{"barrier": barrier}] for c in CARDS})
    assert out == {c: [{"card": c}] for c in CARDS}
    assert sorted(log) == [("ran", c) for c in CARDS]


def test_close_closes_every_card(recorded):
    eng, log = recorded
    eng.run({c: [{}] for c in CARDS})
    eng.close()
    assert sorted(e for e in log if e[0] == "closed") == [("closed", c) for c in CARDS]
    assert eng.workers == {}
    with pytest.raises(DeviceError, match="nothing loaded"):
        eng.run({CARDS[0]: [{}]})


def test_close_after_a_failed_batch_waits_for_the_other_cards(recorded):
    # The first card fails at once; the others are still running when run() raises. Closing their
    # devices under them would be closing a card mid-kernel.
    eng, log = recorded
    with pytest.raises(DeviceError, match="failed"):
        eng.run({CARDS[0]: [{"fail": True}], CARDS[1]: [{"sleep": 0.5}], CARDS[2]: [{"sleep": 0.5}]})
    eng.close()
    for c in CARDS[1:]:
        assert log.index(("ran", c)) < log.index(("closed", c)), log

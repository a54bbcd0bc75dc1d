"""The ring protocol under stress: thousands of requests from several threads, random delays in
the kernel loop, a kernel that dies mid-request, and close while requests are still coming.

Every request carries its own inputs (a unique value in its first element), so an answer given to
the wrong request would not match that request's reference. The counts must add up: each request
sent is either answered, with exactly its own outputs, or failed with one of the protocol's
errors, never both and never neither.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from _host_util import sa
from offload.host import DeviceError, open_device
from offload.host.emu import Csim, EmuDevice

THREADS = 4
PER_THREAD = 800
CLOSE_AFTER = 2400  # answered requests before close is called, with the threads still sending

# The only ways a call may fail here, each naming what happened.
CLEAR_ERRORS = re.compile(
    r"its loop exited without answering request \d+; the kernel was restarted"
    r"|the kernel was declared hung \(.+\) and restarted"
    r"|device 'emu' is closed"
)


def _request(t: int, i: int) -> dict:
    inp = sa.make_inputs(n=4, batch=1 + (i % 3), seed=t * 100_003 + i)
    inp["x"][0, 0] = t * 1_000_000 + i  # unique per request
    return inp


@pytest.mark.parametrize("seed", [1, 2])
def test_every_request_answered_once_or_failed_clearly(seed):
    hooks = Csim(seed=seed, delay_permille=30, max_delay_us=2000, die_at=700 + 97 * seed)
    dev = EmuDevice("emu", "persistent", csim_hooks=hooks)
    sim = open_device("sim")
    k = sa.make_kernel(n=4, scale=3, seed=seed)
    h, hs = dev.load(k), sim.load(k)
    lock = threading.Lock()
    counts = {"sent": 0, "answered": 0, "failed": 0, "closed": 0, "died": 0}
    swapped: list = []
    odd: list = []
    enough = threading.Event()

    def worker(t: int) -> None:
        for i in range(PER_THREAD):
            inp = _request(t, i)
            want = sim.run(hs, inp)["y"]
            with lock:
                counts["sent"] += 1
            try:
                got = dev.run(h, inp, timeout=10.0)["y"]
            except DeviceError as e:
                with lock:
                    counts["failed"] += 1
                    counts["closed" if "is closed" in str(e) else "died"] += 1
                    if not CLEAR_ERRORS.search(str(e)):
                        odd.append(repr(e))
                continue
            except Exception as e:  # noqa: BLE001 - any other error is a finding
                with lock:
                    counts["failed"] += 1
                    odd.append(repr(e))
                continue
            with lock:
                counts["answered"] += 1
                if not np.array_equal(got, want):
                    swapped.append((t, i))
                if counts["answered"] >= CLOSE_AFTER:
                    enough.set()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    enough.wait(timeout=300)
    rings = dev._loaded[h.slot].state  # white box: the rings this kernel ran, to check them after close
    dev.close()  # with the threads still sending
    for th in threads:
        th.join(timeout=300)
    sim.close()

    print(f"stress seed {seed}: {counts}")  # shown with -s
    assert not swapped, f"answers returned to the wrong request: {swapped[:5]}"
    assert not odd, f"failures without a clear protocol error: {odd[:5]}"
    assert counts["sent"] == counts["answered"] + counts["failed"], counts
    assert counts["answered"] >= CLOSE_AFTER, counts
    assert counts["closed"] > 0, f"close came after all traffic: it was not tested {counts}"
    assert counts["died"] >= 1, f"the request the kernel died holding did not fail {counts}"
    assert rings.resets == 1 and hooks.die_at == 0, "the kernel death was not hit"
    # The ring alive at close was drained: every request it was sent, it answered, and its loop
    # acknowledged the stop word with the number of the last one.
    last = rings.ring
    assert not last.thread.is_alive()
    assert int(last.layout.word(last.buf, 2 * 64)[0]) == last.next_n - 1
